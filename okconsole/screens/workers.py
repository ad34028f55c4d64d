"""The workers screen (`:workers`): every worker seen in the last hour, its leases, and the orphaned
ones marked (held by a worker not seen for 30 s: stuck until the lease expires, not slow)."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from engine import ops

from .. import fmt
from ..safe import cell
from ..widgets.tui_tables import ALWAYS, Col, FittedTable
from .base import ConsoleScreen, text_filter

# what tells stuck from slow first: at 80 columns the others give way (a note names them)
COLUMNS = [
    Col("worker", "Worker", ALWAYS),
    Col("state", "State", 90),
    Col("leases", "Leased now", 80),
    Col("orphaned", "Orphaned", 85),
    Col("seen", "Last seen", 70),
    Col("held", "Held at last beat", 50),
    Col("concurrency", "Conc.", 40),
    Col("app", "App", 30),
    Col("host", "Host", 25),
    Col("pid", "Pid", 20),
    Col("started", "Started", 10),
]
LEGEND = (
    "Leased now: messages the store says the worker holds · Held at last beat: what the worker counted"
    " at its last heartbeat (running, or claimed ahead and waiting for a slot)"
)
STATE_STYLE = {"running": "green", "stopped": "dim", "lost": "bold red", "unknown": "bold red"}


def worker_cells(w: ops.WorkerInfo) -> list[Any]:
    """One worker's row, as a person reads it: orphaned leases in red with a ⚠."""
    orphaned = cell(f"⚠ {w.orphaned} orphaned", "bold red") if w.orphaned else cell("0")
    seen = "never recorded" if w.seen_ago_ms is None else f"{fmt.span(w.seen_ago_ms)} ago"
    return [
        cell(w.worker_id),
        cell(w.state, STATE_STYLE.get(w.state)),
        cell(str(w.leases)),
        orphaned,
        cell(seen),
        cell(str(w.held)),
        cell("—" if w.concurrency is None else str(w.concurrency)),
        cell(w.app or "—"),
        cell(w.host or "—"),
        cell("—" if w.pid is None else str(w.pid)),
        cell(fmt.clock(w.started_at)),
    ]


class WorkersScreen(ConsoleScreen):
    TITLE_TEXT = "workers"
    BINDINGS = [Binding("y", "copy_id", "Copy worker id")]

    def body(self) -> ComposeResult:
        yield Static("", id="workers-summary")
        yield FittedTable(COLUMNS, id="workers", cursor_type="row", zebra_stripes=True)
        yield Static(LEGEND, id="workers-legend")

    def focus_main(self) -> None:
        self.query_one("#workers", DataTable).focus()

    async def load(self) -> None:
        found = await self.console.data.call(ops.workers)
        keep = text_filter(self.filter_text) if self.filter_text else None
        rows = []
        for w in found:
            cells = worker_cells(w)
            if keep is None or keep(" ".join(c.plain for c in cells)):
                rows.append((w.worker_id, cells))
        self.query_one("#workers", FittedTable).show(rows)
        self.query_one("#workers-summary", Static).update(summary(found))

    def action_copy_id(self) -> None:
        table = self.query_one("#workers", DataTable)
        if not table.row_count:
            self.copy_id(None)
            return
        self.copy_id(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)


def summary(found: list[ops.WorkerInfo]) -> str:
    """The line above the table: how many run, and the orphaned leases in words."""
    running = sum(1 for w in found if w.state == "running")
    orphaned = sum(w.orphaned for w in found)
    leases = sum(w.leases for w in found)
    line = f"{running} running of {len(found)} seen in the last hour · {leases} lease{'' if leases == 1 else 's'} held"
    if orphaned:
        line += (
            f" · [b red]⚠ {orphaned} orphaned[/]: held by workers not seen for 30 s, stuck (not slow) "
            "until their leases expire"
        )
    return line
