"""Tail a live tape: from the store or over SSE; the last 10 events first, then every new one;
sticky bottom, pause, an 'N new' badge, wrap and timestamp toggles, save to a file, resume, gaps.

The timestamps (`t`) are the events' own from the store (when they were appended to the tape). An
SSE event carries no time, so over SSE they are when this console received each event, and the
title says which of the two the column holds."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import RichLog, Static

from engine import ops
from engine.client import Client, ClientError, LiveResumeGap, StreamDropped
from engine.display import cut, inert, json_text, more_note

from .. import fmt
from ..data import StoreDown
from ..safe import content
from .base import ConsoleScreen, text_filter
from .modals import PromptScreen

BACKLOG = 10  # like `okconsole tail`: the last 10 retained events, then follow
KEEP = 10_000  # lines kept on screen (and saved); older ones scroll away
STORE_POLL_S = 0.25


@dataclass(frozen=True)
class TailLine:
    id: str
    data: Any
    at_ms: int  # when the event was appended (from the store) or received (over SSE)

    def text(self, stamps: bool) -> str:
        """The line as shown (and saved): inert, an event's JSON cut at 64 KiB with a note."""
        data, left_out = cut(json_text(self.data))
        line = inert(f"{self.id}  {data}") + (f" {more_note(left_out)}" if left_out else "")
        return f"{fmt.clock(self.at_ms)}  {line}" if stamps else line


class TailScreen(ConsoleScreen):
    BINDINGS = [
        Binding("end", "follow", "Follow", priority=True),
        Binding("p", "pause", "Pause/follow"),
        Binding("w", "wrap", "Wrap"),
        Binding("t", "stamps", "Timestamps"),
        Binding("s", "save", "Save"),
        Binding("c", "clear", "Clear"),
    ]

    def __init__(self, signal: str, url: str | None = None, token: str | None = None) -> None:
        super().__init__()
        self.signal = signal
        self.url = url
        self.token = token
        self.cursor: str | None = None
        self.unseen = 0
        self.received = 0
        self.store_down = False
        self.following = True  # sticky bottom until the operator scrolls up or pauses
        self.lines: list[TailLine] = []
        self.stamps = False

    def body(self) -> ComposeResult:
        yield Static("", id="title")
        yield Static("", id="notice")
        yield RichLog(id="tail-log", highlight=True, auto_scroll=False, wrap=False, markup=False)
        yield Static("", id="badge")  # in the flow above the footer (docked, the footer covered it)

    def on_mount(self) -> None:
        self.TITLE_TEXT = f"tail · {self.signal}"
        super().on_mount()
        self.update_title()
        self.watch(self.log_widget, "scroll_y", self._scrolled, init=False)
        self.run_worker(self.follow_sse() if self.url else self.follow_store(), group="tail", exit_on_error=False)

    @property
    def log_widget(self) -> RichLog:
        return self.query_one("#tail-log", RichLog)

    def focus_main(self) -> None:
        self.log_widget.focus()

    async def load(self) -> None:
        """The tail has its own loop; refresh only checks the store is reachable."""
        if not self.url:
            await self.console.data.call(ops.tape_info, self.signal)

    def update_title(self) -> None:
        source = f"SSE {self.url}" if self.url else "store"
        state = "following" if self.following else "[b yellow]paused[/]"
        shown = f" · showing {len(self.shown_lines())} matching $filter" if self.filter_text else ""
        stamps = f" · times: {self.stamps_label()}" if self.stamps else ""
        self.query_one("#title", Static).update(
            content(
                f"[b]$signal[/b] · $source · {state} · {self.received} events{shown}{stamps} · cursor $cursor",
                signal=self.signal,
                source=source,
                filter=repr(self.filter_text),
                cursor=self.cursor or "—",
            )
        )

    def stamps_label(self) -> str:
        """What the timestamp column holds: SSE carries no event time, so there it is the receipt."""
        return "received (SSE carries no event time)" if self.url else "appended (the event's own)"

    def matches(self, line: TailLine) -> bool:
        """'/' keeps the lines whose id or JSON contains the text (any case; '!' inverts)."""
        return not self.filter_text or text_filter(self.filter_text)(line.text(False))

    def shown_lines(self) -> list[TailLine]:
        return [line for line in self.lines if self.matches(line)]

    def apply_filter(self, text: str) -> None:
        """Filter what is drawn (and saved); every event is still received and kept."""
        self.filter_text = text
        self.redraw()
        self.update_title()

    def notice(self, text: str, **values: Any) -> None:
        """`text` is the console's markup; stored values (names, cursors, errors) go in `values`."""
        widget = self.query_one("#notice", Static)
        widget.update(content(text, **values))
        widget.set_class(bool(text), "shown")

    def append(self, event_id: str, data: Any, at_ms: int | None = None) -> None:
        line = TailLine(event_id, data, at_ms if at_ms is not None else fmt.now_ms())
        self.lines.append(line)
        if len(self.lines) > KEEP:
            del self.lines[: len(self.lines) - KEEP]
        self.cursor = event_id
        self.received += 1
        if not self.matches(line):
            self.update_title()
            return
        log = self.log_widget
        log.write(Text(line.text(self.stamps)))
        if self.following:
            log.scroll_end(animate=False)
        else:
            self.unseen += 1
            self.show_badge()
        self.update_title()

    def show_badge(self) -> None:
        badge = self.query_one("#badge", Static)
        badge.update(f"▼ {self.unseen} new — paused; press End (or p) to follow")
        badge.set_class(True, "shown")

    def _scrolled(self, old: float, new: float) -> None:
        """Scrolling up (keys, mouse, anything) pauses the tail; new lines count on a badge."""
        if new < old and self.following:
            self.following = False
            self.update_title()

    def action_follow(self) -> None:
        self.log_widget.scroll_end(animate=False)
        self.following = True
        self.unseen = 0
        self.query_one("#badge", Static).set_class(False, "shown")
        self.update_title()

    def action_pause(self) -> None:
        if not self.following:
            self.action_follow()
            return
        self.following = False
        self.show_badge()
        self.update_title()

    def redraw(self) -> None:
        """Write every kept line again (after a wrap or timestamp toggle), keeping the follow state."""
        log = self.log_widget
        log.clear()
        for line in self.shown_lines():
            log.write(Text(line.text(self.stamps)))
        if self.following:
            log.scroll_end(animate=False)

    def action_wrap(self) -> None:
        self.log_widget.wrap = not self.log_widget.wrap
        self.redraw()
        self.notify(f"wrap {'on' if self.log_widget.wrap else 'off'}")

    def action_stamps(self) -> None:
        self.stamps = not self.stamps
        self.redraw()
        self.update_title()

    def action_clear(self) -> None:
        self.lines.clear()
        self.log_widget.clear()

    def action_save(self) -> None:
        """Ask where; the lines are taken (and counted) when it saves: events keep arriving meanwhile."""
        default = f"{self.signal}-tail-{time.strftime('%Y%m%d-%H%M%S')}.txt"
        self.app.push_screen(
            PromptScreen("Save the lines shown when you press enter to (esc cancels):", value=default),
            lambda path: self.call_after_refresh(self.save_to, path),
        )

    def save_to(self, path: str | None) -> None:
        """Write the tail so far, as shown (`<id>  <json>`, timestamps if on), and say how many
        lines went where."""
        if not path:
            return
        target = Path(path).expanduser().resolve()
        lines = self.shown_lines()
        try:
            if target.exists():
                raise FileExistsError(f"{target} exists (choose another name)")
            target.write_text("".join(line.text(self.stamps) + "\n" for line in lines), encoding="utf-8")
        except OSError as err:
            self.notify(f"not saved: {err}", severity="error")
            return
        self.notify(f"saved {len(lines)} line{'' if len(lines) == 1 else 's'} to {target}")

    async def follow_store(self) -> None:
        data = self.console.data
        first = True
        while True:
            try:
                if first:
                    info = await data.call(ops.tape_info, self.signal)
                    if info is None:
                        self.notice(
                            "[b]no live tape $signal[/b] in this store (esc goes back)", signal=repr(self.signal)
                        )
                        return
                    for entry in await data.call(ops.tape_last, self.signal, BACKLOG):
                        self.append(entry.id, entry.data, entry.created_at)
                    if self.cursor is None:
                        self.cursor = info.head_id
                    first = False
                    self.notice("")
                entries, gap = await data.call(ops.tape_after, self.signal, self.cursor)
                if gap is not None:
                    missed = f", {gap.missed} missed" if gap.missed else ""
                    self.notice(
                        f"[b]gap:[/b] cursor $cursor cannot be resumed ($reason{missed})"
                        " — restarting from the oldest retained event $first",
                        cursor=self.cursor,
                        reason=gap.reason,
                        first=gap.first_id or "(tape empty)",
                    )
                    self.cursor = None
                    continue
                if self.store_down:
                    self.store_down = False
                    self.notice("")
                for entry in entries:
                    self.append(entry.id, entry.data, entry.created_at)
                if entries:
                    continue
            except StoreDown as down:
                self.store_down = True
                self.notice(
                    "[b]store unreachable:[/b] $down — will resume after $cursor",
                    down=down,
                    cursor=self.cursor or "the start",
                )
            await asyncio.sleep(STORE_POLL_S)

    async def follow_sse(self) -> None:
        client = Client(self.url or "", token=self.token)
        tail: int | None = BACKLOG  # a fresh stream starts at the last 10, not the whole tape
        while True:
            try:
                async for event in client.stream(
                    self.signal, {}, last_event_id=self.cursor, tail=tail, on_open=lambda: self.notice("")
                ):
                    self.append(event.id, event.data)
            except LiveResumeGap as gap:
                self.notice(
                    "[b]gap:[/b] $after cannot be resumed ($reason) — restarting from the oldest retained event $first",
                    after=gap.after_id,
                    reason=gap.reason,
                    first=gap.first_id or "(tape empty)",
                )
                self.cursor, tail = None, None
            except StreamDropped as dropped:  # the server went away: reopen after the last id received
                if dropped.last_id:
                    self.cursor, tail = dropped.last_id, None
                self.notice("[b]stream dropped[/b] — resuming after $cursor", cursor=self.cursor or "the start")
                await asyncio.sleep(2)
            except (ClientError, ValueError) as err:
                if isinstance(err, ValueError) or err.status == 404:  # no such exposure: retrying cannot help
                    self.notice(
                        "[b]no live tape $signal[/b] at $url: $err (esc goes back)",
                        signal=repr(self.signal),
                        url=self.url,
                        err=err,
                    )
                    return
                self.notice("[b]stream error:[/b] $err — retrying", err=err)
                await asyncio.sleep(2)
            except Exception as err:  # server away, auth refused: say so and retry
                self.notice("[b]stream error:[/b] $err — retrying", err=err)
                await asyncio.sleep(2)
