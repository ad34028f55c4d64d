"""The clocks screen (`:clocks`): every clock trigger apps declared, its schedule, its next tick,
and its last tick's time, message and outcome; Enter opens the clock signal's messages."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from engine import ops

from .. import fmt
from ..safe import cell
from ..styles import PAUSED_STYLE, STATUS_STYLE
from ..widgets.tui_tables import ALWAYS, Col, FittedTable
from .base import ConsoleScreen, text_filter

# the flow and when it ticks next first: at 80 columns the others give way (a note names them)
COLUMNS = [
    Col("flow", "Flow", ALWAYS),
    Col("spec", "Spec", 95),
    Col("next", "Next tick", 90),
    Col("last_status", "Last outcome", 85),
    Col("last", "Last tick", 80),
    Col("paused", "Paused", 70),
    Col("tz", "TZ", 60),
    Col("last_id", "Last message", 30),
]
LEGEND = "Enter: the clock's messages · pause / resume take its signal, clock.<flow>"


def clock_cells(c: ops.ClockInfo) -> list[Any]:
    """One clock's row: a dead last tick in red, a paused clock in the pause colour."""
    return [
        cell(c.flow),
        cell(c.spec),
        cell("paused" if c.paused else fmt.clock(c.next_at), PAUSED_STYLE if c.paused else None),
        cell(c.last_status or "—", STATUS_STYLE.get(c.last_status or "")),
        cell(fmt.clock(c.last_at)),
        cell("yes" if c.paused else "no", PAUSED_STYLE if c.paused else None),
        cell(c.tz),
        cell(c.last_id or "—"),
    ]


class ClocksScreen(ConsoleScreen):
    TITLE_TEXT = "clocks"
    _found: dict[str, ops.ClockInfo] = {}  # signal -> clock, as last loaded (replaced, never mutated)
    BINDINGS = [Binding("y", "copy_id", "Copy last message id")]

    def body(self) -> ComposeResult:
        yield Static("", id="clocks-summary")
        yield FittedTable(COLUMNS, id="clocks", cursor_type="row", zebra_stripes=True)
        yield Static(LEGEND, id="clocks-legend")

    def focus_main(self) -> None:
        self.query_one("#clocks", DataTable).focus()

    async def load(self) -> None:
        found = await self.console.data.call(ops.clocks)
        self._found = {c.signal: c for c in found}
        keep = text_filter(self.filter_text) if self.filter_text else None
        rows = []
        for c in found:
            cells = clock_cells(c)
            if keep is None or keep(" ".join(x.plain for x in cells)):
                rows.append((c.signal, cells))
        self.query_one("#clocks", FittedTable).show(rows)
        self.query_one("#clocks-summary", Static).update(summary(found))

    def _selected(self) -> ops.ClockInfo | None:
        table = self.query_one("#clocks", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return self._found.get(key)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a clock: its signal's messages, one per tick."""
        chosen = self._found.get(str(event.row_key.value))
        if chosen is not None:
            self.console.open_messages(chosen.signal, None)

    def action_copy_id(self) -> None:
        chosen = self._selected()
        self.copy_id(None if chosen is None else chosen.last_id)


def summary(found: list[ops.ClockInfo]) -> str:
    """The line above the table: how many clocks, how many paused, and a dead last tick in words."""
    if not found:
        return "No clocks recorded yet: an app declares one with on(clock.every(...) / clock.cron(...), flow)."
    paused = sum(c.paused for c in found)
    dead = [c.flow for c in found if c.last_status == "dead"]
    line = f"{len(found)} clock{'' if len(found) == 1 else 's'} · {paused} paused"
    if dead:
        line += f" · [b red]{len(dead)} whose last tick is dead[/] (:dlq clock.<flow>)"
    return line
