"""One message: highlighted payload, every failure newest first, lease, blocking head, trace."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import Static, Tree

from engine import ops

from .. import fmt
from ..safe import cell, content, json_pane, pane
from ..styles import DEAD_STYLE, VERDICT_STYLE
from .base import text_filter
from .controls import MessageControls, RowFacts, one_message
from .modals import ConfirmScreen
from .trace_tree import fill_tree


class DetailScreen(MessageControls):
    ENTER_HINT = "Open the message (trace pane)"
    WRITE_ACTIONS = frozenset({"replay", "edit"})
    BINDINGS = [
        Binding("t", "trace", "Trace"),
        Binding("R", "replay", "Replay"),
        Binding("e", "edit", "Edit & replay"),
        Binding("y", "copy_id", "Copy id"),
    ]

    def __init__(self, message_id: str) -> None:
        super().__init__()
        self.message_id = message_id
        self.detail: Any = None
        self.rendered: Any = None
        self.rendered_filter = ""

    def body(self) -> ComposeResult:
        yield Static("", id="title")
        yield Static("", id="why")
        with Horizontal(id="detail-body"):
            with VerticalScroll(id="payload"):
                yield Static("", id="payload-text")
            with Vertical(id="side"):
                yield Static("", id="lease")
                yield Static("Failures (newest first)", classes="pane-title")
                with VerticalScroll(id="failures"):
                    yield Static("", id="failures-text")
                yield Static("Trace", classes="pane-title")
                yield Tree("runs", id="trace")

    def on_mount(self) -> None:
        self.TITLE_TEXT = f"message · {self.message_id}"
        super().on_mount()

    async def load(self) -> None:
        try:
            detail = await self.console.data.call(ops.show, self.message_id)
            why = await self.console.data.call(ops.why, self.message_id)
        except LookupError as err:
            self.query_one("#title", Static).update(content("[b red]$err[/]", err=err))
            return
        self.detail = detail
        self.query_one("#why", Static).update(why_line(why))
        if detail != self.rendered or self.filter_text != self.rendered_filter:
            self.render_detail(detail)
            self.rendered, self.rendered_filter = detail, self.filter_text

    def render_detail(self, d: Any) -> None:
        self.query_one("#title", Static).update(
            content(
                f"[b]$id[/b] · $signal · [b]$status[/b] · attempts {d.attempts}/{d.retries + 1}"
                f" · key $key · replays {d.replays} · created {fmt.clock(d.created_at)}"
                + (" · filter $filter" if self.filter_text else ""),
                id=d.id,
                signal=d.signal,
                status=d.status,
                key=d.key or "—",
                filter=repr(self.filter_text),
            )
        )
        self.query_one("#payload-text", Static).update(payload_view(d.payload))
        self.query_one("#lease", Static).update(Content("\n").join(lease_lines(d)))
        keep = text_filter(self.filter_text) if self.filter_text else None  # '/': failures and trace
        shown = [f for f in d.failures if keep is None or keep(f"{f.attempt} {f.code} {f.message}")]
        self.query_one("#failures-text", Static).update(failure_lines(shown))
        tree = self.query_one("#trace", Tree)
        fill_tree(tree, d.trace, highlight=d.id, keep=keep)

    def control_target(self) -> tuple[str, list[str]] | None:
        d = self.detail
        return None if d is None else (d.signal, [d.id])

    def action_copy_id(self) -> None:
        self.copy_id(self.message_id)

    def _trace_root_run(self) -> str | None:
        d = self.detail
        if d is None:
            return None
        if d.parent_run_id:
            return d.parent_run_id
        return d.runs[0].run_id if d.runs else None

    def action_trace(self) -> None:
        run = self._trace_root_run()
        if run is None:
            self.notify("this message has no runs yet and was not emitted by a run")
            return
        self.console.open_trace(run)

    def on_tree_node_selected(self, event: Tree.NodeSelected) -> None:
        data = event.node.data
        if isinstance(data, dict) and data.get("message") and data["message"] != self.message_id:
            self.console.open_detail(data["message"])

    def _replayable(self) -> Any:
        """The message when it can be replayed from here (dead, console writable), else None."""
        d = self.detail
        if d is None or self.refuse_write():
            return None
        if d.status != "dead":
            self.notify(f"only dead letters can be replayed; this one is {d.status}", severity="warning")
            return None
        return d

    def action_replay(self) -> None:
        d = self._replayable()
        if d is None:
            return

        def confirmed(reason: str | None) -> None:
            if reason:
                self.run_write("replay", ops.replay, d.signal, [d.id], reason=reason)

        question = one_message("Replay the dead letter {it} of $signal?", d.id, d.key, signal=d.signal)
        self.app.push_screen(ConfirmScreen(question, "Replay 1"), confirmed)

    def action_edit(self) -> None:
        d = self._replayable()
        if d is not None:
            self.ask_edit_replay(d.signal, d.id, d.key, d.payload)

    def row_facts(self, msg_id: str) -> RowFacts | None:
        d = self.detail
        if d is None or d.id != msg_id:
            return None
        waiting = d.status == "pending" and d.due_at is not None
        leased = d.status == "inflight" and not d.lease.reclaimable
        return RowFacts(key=d.key, status=d.status, waiting=waiting, leased=leased)


def why_line(why: Any) -> Content:
    """`why: VERDICT  detail`, as `okconsole why` prints it (its time words refresh with the screen)."""
    style = VERDICT_STYLE.get(why.verdict, "b")
    return content(f"why: [{style}]$verdict[/]  $detail", verdict=why.verdict, detail=why.detail)


def payload_view(payload: Any) -> RenderableType:
    """The payload as highlighted JSON, at most 64 KiB of it, then how much more there is."""
    head, note = json_pane(payload)
    syntax = Syntax(head, "json", word_wrap=True, background_color="default")
    return Group(syntax, Text(note, "dim")) if note else syntax


def lease_lines(d: Any) -> list[Content]:
    """Flow and parent run, the lease and its holder, when it is due, and the head it waits behind."""
    lease = d.lease
    lines = [content("flow $flow · parent run $parent", flow=d.flow or "—", parent=d.parent_run_id or "—")]
    if d.status == "inflight":
        left = (lease.lease_expires_at or 0) - fmt.now_ms()
        state = "[b yellow]reclaimable now[/]" if lease.reclaimable else f"{fmt.span(left)} left"
        lines.append(content(f"lease: held by $holder · {state}", holder=lease.locked_by))
        if lease.orphaned:
            lines.append(
                content("[b red]⚠ orphaned[/]: its holder has not been seen for 30 s (stuck, not slow; :workers)")
            )
    else:
        lines.append(Content("lease: none"))
    if d.due_at is not None:  # a delay or a back-off's next attempt still ahead
        what = "next attempt" if d.attempts else "due"
        left = fmt.span(d.due_at - fmt.now_ms())
        lines.append(content(f"[b yellow]{what} at {fmt.clock(d.due_at)}[/] (in {left}): not claimed before"))
    if d.priority or d.dedupe is not None:
        lines.append(content(f"priority {d.priority} · dedupe $dedupe", dedupe=d.dedupe or "—"))
    if d.blocked_by is not None:
        b = d.blocked_by
        lines.append(
            content(
                f"[b yellow]blocked behind[/] $head ($status, attempts {b.attempts}) — the head of key '$key'",
                head=b.id,
                status=b.status,
                key=d.key,
            )
        )
    return lines


def failure_lines(failures: list[Any]) -> Text:
    """Every failure, newest first: `attempt N · CODE`, its time on a line of its own (so it is never
    split), then its message, which wraps by words at any width (a table would cut it at 80 columns);
    a message over 64 KiB is cut, saying how much more there is. Then the attempt's traceback (its
    last 8 KiB as recorded), dimmed under a `traceback` line."""
    text = Text()
    for f in reversed(failures):
        style = "b cyan" if f.code == "replayed" else DEAD_STYLE
        if text:
            text.append("\n")
        text.append(f"attempt {f.attempt} · ", "dim")
        text.append(cell(f.code, style))
        text.append(f"\n  at {fmt.clock(f.at)}\n", "dim")
        if f.message:
            text.append("  ")
            text.append(pane(f.message))
            text.append("\n")
        if f.traceback:
            text.append("  traceback\n", "b")
            trace = pane(f.traceback)
            trace.stylize("dim")
            text.append(trace)
            text.append("\n")
    return text if text else Text("none", "dim")
