"""Rendering for the scripted commands: Rich tables for people, plain JSON for scripts.

Nothing here touches the store: it formats the records `engine.ops` returns.
Colour follows Rich's detection: NO_COLOR / FORCE_COLOR and whether stdout is a terminal.
Tables go through `cli_tables` so an id, a key or a time is never split across lines.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.tree import Tree

from engine.display import cut, json_text, more_note, one_line
from engine.ops import (
    AuditEntry,
    DeadLetter,
    FailureGroup,
    HistoryPoint,
    MessageDetail,
    MessageRow,
    Purged,
    PurgePreview,
    Replayed,
    ReplayPreview,
    RunNode,
    SignalStats,
    to_json,
    waits_until,
)

from . import fmt
from .cli_tables import CROP, KEEP, WRAP, Column, Grid, render
from .safe import rich_markup
from .styles import DEAD_STYLE, HEALTH_OK, PAUSED_STYLE, health_style, status_markup, styled

ORPHANED = "[bold red]yes: its holder has not been seen for 30 s (stuck, not slow: see okconsole workers)[/]"
PIPE_WIDTH = 100_000  # a pipe has no width: a line is as long as it needs to be


def console() -> Console:
    """A console on stdout; when stdout is not a terminal, unbounded in width and colourless."""
    width = None if _stdout_is_terminal() else PIPE_WIDTH
    return Console(highlight=False, width=width, soft_wrap=False)


def _stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def print_json(data: Any) -> None:
    """JSON only, one document, on stdout (a list is one array)."""
    sys.stdout.write(json_text(to_json(data)) + "\n")
    sys.stdout.flush()


# -- formatting ---------------------------------------------------------------------------------
def when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def readable(text: str, full: bool = False) -> str:
    """A stored multi-line value as markup a person reads: inert, and unless `full` cut at 64 KiB
    with a note saying how much more there is (a 10 MB payload must not flood the terminal)."""
    head, more = (text, 0) if full else cut(text)
    shown = rich_markup(head, multiline=True)
    return shown if not more else f"{shown}\n[dim]{more_note(more)}[/]"


def duration(ms: int | None) -> str:
    return "-" if ms is None else fmt.span(ms)


def cell(value: Any) -> str:
    return "-" if value is None else rich_markup(value)


NUMERIC = ("Pending", "Inflight", "Delivered", "Dead", "Attempts", "Attempt", "Count", "Lag")
NUMERIC += ("Emitted", "Failed", "Pruned", "Kept", "Ev/s")


def _grid(
    *columns: str,
    crop: tuple[str, ...] = (),
    wrap: tuple[str, ...] = (),
    drop: tuple[str, ...] = (),
    title: str | None = None,
) -> Grid:
    """Columns are KEEP (ids, keys, names, times, numbers) unless named in `crop` or `wrap`."""
    kinds = {**{name: CROP for name in crop}, **{name: WRAP for name in wrap}}
    return Grid([Column(name, kinds.get(name, KEEP), name in NUMERIC) for name in columns], title=title, drop=drop)


# -- one renderer per command -------------------------------------------------------------------
def render_stats(out: Console, rows: list[SignalStats], db: str) -> None:
    """A queue's counts by status; a live signal has none (—), its tape's Kept, Ev/s and Head instead."""
    if not rows:
        out.print(f"No signals recorded in {rich_markup(db)} yet.")
        return
    table = _grid(
        "Signal",
        "Health",
        "Kind",
        "Pending",
        "Inflight",
        "Delivered",
        "Dead",
        "Lag",
        "Kept",
        "Ev/s",
        "Paused",
        "Head",
        "Description",
        crop=("Description",),
        drop=("Description", "Head", "Kind"),
    )
    for r in rows:
        table.add(rich_markup(r.signal), _health(r), rich_markup(r.kind), *_stats_figures(r), cell(r.description))
    render(out, table)


def _health(r: SignalStats) -> str:
    """What needs a look, the worst first, each mark in its colour (as the TUI's overview shows it);
    "ok" with none, "—" for a live signal (no attempts, no leases)."""
    if r.kind == "live":
        return "—"
    return ", ".join(styled(mark, health_style(mark)) for mark in r.health or [HEALTH_OK])


def _stats_figures(r: SignalStats) -> list[str]:
    """Pending … Head of one stats row."""
    paused = f"[{PAUSED_STYLE}]yes[/]" if r.paused else "no"
    if r.kind == "live":
        rate = f"{r.events_per_s:.1f}" if r.events_per_s is not None else "—"
        return ["—", "—", "—", "—", "—", str(r.kept or 0), rate, paused, rich_markup(r.head or "—")]
    dead = f"[{DEAD_STYLE}]{r.dead}[/]" if r.dead else "0"
    counts = [str(r.pending), str(r.inflight), str(r.delivered), dead]
    return [*counts, duration(r.lag_ms), "—", "—", paused, "—"]


def render_history(out: Console, signal: str, rows: list[HistoryPoint]) -> None:
    """The minutes in which something happened (quiet minutes are zeros in --json)."""
    busy = [r for r in rows if r.emitted or r.delivered or r.failed or r.dead or r.pruned]
    if not busy:
        out.print(f"No history of {rich_markup(signal)} in that window.")
        return
    table = _grid("At", "Emitted", "Delivered", "Failed", "Dead", "Pruned", title=f"History of {rich_markup(signal)}")
    for r in busy:
        dead = f"[{DEAD_STYLE}]{r.dead}[/]" if r.dead else "0"
        table.add(when(r.at), str(r.emitted), str(r.delivered), str(r.failed), dead, str(r.pruned))
    render(out, table)
    if len(busy) < len(rows):
        out.print(f"{len(rows) - len(busy)} quiet minutes not shown; --json lists every minute.")


def render_bindings(out: Console, rows: list[Any], db: str) -> None:
    if not rows:
        out.print(f"No bindings recorded in {rich_markup(db)} yet.")
        return
    table = _grid("Signal", "Kind", "Flow", "Last seen", "Active", drop=("Kind",))
    for r in rows:
        table.add(
            rich_markup(r.signal),
            rich_markup(r.kind),
            rich_markup(r.flow),
            when(r.last_seen),
            "yes" if r.active else "[dim]no[/]",
        )
    render(out, table)


def render_clocks(out: Console, rows: list[Any], db: str) -> None:
    if not rows:
        out.print(f"No clocks recorded in {rich_markup(db)} yet.")
        return
    table = _grid("Flow", "Spec", "TZ", "Next", "Last", "Last id", "Last status", "Paused", drop=("Last id",))
    for r in rows:
        table.add(
            rich_markup(r.flow),
            rich_markup(r.spec),
            rich_markup(r.tz),
            when(r.next_at),
            when(r.last_at),
            rich_markup(r.last_id or "-"),
            status_markup(r.last_status) if r.last_status else "-",
            f"[{PAUSED_STYLE}]yes[/]" if r.paused else "no",
        )
    render(out, table)


def render_messages(out: Console, signal: str, rows: list[MessageRow]) -> None:
    if not rows:
        out.print(f"No messages in {rich_markup(signal)} match.")
        return
    table = _grid(
        "ID",
        "Status",
        "Key",
        "Attempts",
        "Locked by",
        "Lease expires",
        "Created",
        "Due at",
        "Parent run",
        crop=("Locked by",),
        drop=("Parent run", "Lease expires", "Locked by", "Attempts", "Created", "Due at"),
        title=f"{rich_markup(signal)}: {len(rows)} newest",
    )
    now = fmt.now_ms()
    for r in rows:
        table.add(
            rich_markup(r.id),
            status_markup(r.status),
            cell(r.key),
            str(r.attempts),
            cell(r.locked_by),
            when(r.lease_expires_at),
            when(r.created_at),
            when(waits_until(r.status, r.run_at, now)),
            cell(r.parent_run_id),
        )
    render(out, table)


def render_dlq(out: Console, signal: str, rows: list[DeadLetter]) -> None:
    if not rows:
        out.print(f"No dead letters in {rich_markup(signal)}.")
        return
    table = _grid(
        "ID",
        "Key",
        "Attempts",
        "Last failure",
        "Died",
        "Created",
        crop=("Last failure",),
        drop=("Created", "Attempts", "Died"),
        title=f"{rich_markup(signal)}: {len(rows)} dead letters",
    )
    for r in rows:
        last = next((x for x in reversed(r.failures) if x.code != "replayed"), None)
        reason = f"{last.code}: {last.message}" if last else "-"
        table.add(
            rich_markup(r.id),
            cell(r.key),
            str(r.attempts),
            rich_markup(one_line(reason)),
            when(last.at if last else None),
            when(r.created_at),
        )
    render(out, table)


def render_failures(out: Console, signal: str, rows: list[FailureGroup]) -> None:
    if not rows:
        out.print(f"No dead or failing messages in {rich_markup(signal)}.")
        return
    table = _grid(
        "Code", "Message", "Count", "Last at", wrap=("Message",), title=f"{rich_markup(signal)}: failures by cause"
    )
    for r in rows:
        table.add(rich_markup(r.code), rich_markup(r.message), str(r.count), when(r.last_at))
    render(out, table)


def render_audit(out: Console, rows: list[AuditEntry]) -> None:
    if not rows:
        out.print("The audit log is empty.")
        return
    table = _grid(
        "At",
        "Actor",
        "Source",
        "Action",
        "Signal",
        "Count",
        "Reason",
        "Ids",
        crop=("Reason",),
        wrap=("Ids",),
        drop=("Source", "Reason", "Actor"),
    )
    for r in rows:
        ids = ", ".join(r.ids[:3]) + (f" … (+{len(r.ids) - 3})" if len(r.ids) > 3 else "")
        table.add(
            when(r.at),
            rich_markup(r.actor),
            cell(r.source),
            rich_markup(r.action),
            cell(r.signal),
            str(r.count),
            rich_markup(one_line(r.reason)) if r.reason is not None else "-",
            rich_markup(ids),
        )
    render(out, table)


def _run_label(node: RunNode, mark: str | None = None) -> str:
    flow = rich_markup(node.flow) if node.flow else "[dim](not recorded)[/]"
    took = (
        f" {duration(node.ended_at - node.started_at)}"
        if node.started_at is not None and node.ended_at is not None
        else ""
    )
    label = f"[bold]{flow}[/] {rich_markup(node.run_id)} {status_markup(node.status)}{took}"
    if node.attempt is not None and node.message_id is not None:
        label += f" [dim]attempt {node.attempt} of {rich_markup(node.message_id)}[/]"
    if node.error:
        label += f" [red]{rich_markup(node.error)}[/]"
    if mark and node.run_id == mark:
        label += " [reverse] ← [/]"
    return label


def _grow(tree: Tree, node: RunNode, mark: str | None) -> None:
    stack = [(tree, node)]
    while stack:
        parent, current = stack.pop()
        branch = parent.add(_run_label(current, mark))
        for msg in current.messages:
            key = f" key={rich_markup(msg.key)}" if msg.key is not None else ""
            branch.add(
                f"[dim]emitted[/] {rich_markup(msg.signal)} {rich_markup(msg.id)}{key} {status_markup(msg.status)}"
            )
        if current.emitted > len(current.messages):
            branch.add(f"[dim]… {current.emitted - len(current.messages)} more emitted[/]")
        for child in reversed(current.children):
            stack.append((branch, child))
    # children were pushed reversed so they pop in order; Tree keeps insertion order per parent


def render_trace(out: Console, root: RunNode, asked: str | None = None) -> None:
    tree = Tree("[bold]trace[/]", guide_style="dim")
    _grow(tree, root, asked)
    out.print(tree)


def render_show(out: Console, d: MessageDetail, full: bool = False) -> None:
    head = _grid("Field", "Value", wrap=("Value",), title=f"message {rich_markup(d.id)}")
    rows = [
        ("signal", rich_markup(d.signal)),
        ("flow", cell(d.flow)),
        ("key", cell(d.key)),
        ("status", status_markup(d.status)),
        ("attempts", f"{d.attempts} (retries {d.retries})"),
        ("replays", str(d.replays)),
        ("created", when(d.created_at)),
        ("updated", when(d.updated_at)),
        ("finished", when(d.finished_at)),
        ("parent run", cell(d.parent_run_id)),
        ("locked by", cell(d.lease.locked_by)),
        ("lease expires", when(d.lease.lease_expires_at)),
        ("priority", str(d.priority)),
        ("dedupe", cell(d.dedupe)),
    ]
    if d.due_at is not None:  # a delay, an `at` or a back-off's next attempt still ahead
        rows.insert(5, ("due at", f"[yellow]{when(d.due_at)}[/] (not claimed before)"))
    if d.status == "inflight":
        rows.append(
            ("reclaimable", "[yellow]yes: the lease has expired[/]" if d.lease.reclaimable else "no: the lease holds")
        )
        rows.append(("orphaned", ORPHANED if d.lease.orphaned else "no: its holder was seen in the last 30 s"))
    if d.blocked_by is not None:
        b = d.blocked_by
        rows.append(
            (
                "blocked by",
                f"{rich_markup(b.id)} ({status_markup(b.status)}, {b.attempts} attempts), "
                f"the head of key {rich_markup(d.key)}",
            )
        )
    for name, value in rows:
        head.add(f"[bold]{name}[/]", value)
    render(out, head)
    out.print()
    out.print("[bold]payload[/]")
    out.print(readable(json.dumps(d.payload, indent=2, ensure_ascii=False), full))
    out.print()
    if d.failures:
        table = _grid("At", "Attempt", "Code", "Message", wrap=("Message",), title="failures, newest first")
        for x in reversed(d.failures):
            style = "dim" if x.code == "replayed" else ""
            table.add(when(x.at), str(x.attempt), rich_markup(x.code), readable(x.message, full), style=style)
        render(out, table)
        _render_tracebacks(out, d.failures, full)
    else:
        out.print("[dim]no failures[/]")
    if d.trace:
        out.print()
        anchor = d.runs[-1].run_id if d.runs else None
        for root in d.trace:
            render_trace(out, root, anchor)


def _render_tracebacks(out: Console, failures: list[Any], full: bool) -> None:
    """The last failed attempt's traceback; with `full` every attempt's, newest first."""
    traced = [x for x in reversed(failures) if x.traceback]
    for x in traced if full else traced[:1]:
        out.print()
        out.print(f"[bold]traceback of attempt {x.attempt}[/] [dim]({when(x.at)})[/]")
        out.print(readable(x.traceback, full))
    if traced and not full and len(traced) > 1:
        out.print(f"[dim]{len(traced) - 1} earlier attempt(s) have a traceback too: show --full prints them[/]")


def render_replay(out: Console, signal: str, result: Replayed | ReplayPreview) -> None:
    if isinstance(result, ReplayPreview):
        out.print(
            f"Would replay {result.would_replay} dead letter(s) of {rich_markup(signal)} (dry run: nothing changed)."
        )
        if result.ids:
            more = " …" if result.would_replay > len(result.ids) else ""
            out.print("  " + rich_markup(", ".join(result.ids)) + more)
        return
    out.print(f"Replayed {result.replayed} dead letter(s) of {rich_markup(signal)}.")
    for msg_id in result.ids[:20]:
        out.print(f"  {rich_markup(msg_id)}")
    if len(result.ids) > 20:
        out.print(f"  … and {len(result.ids) - 20} more")


def render_purge(out: Console, signal: str, state: str, result: Purged | PurgePreview) -> None:
    if isinstance(result, PurgePreview):
        out.print(
            f"Would purge {result.would_purge} {state} message(s) of {rich_markup(signal)} (dry run: nothing changed)."
        )
        return
    out.print(f"Purged {result.purged} {state} message(s) of {rich_markup(signal)}.")
