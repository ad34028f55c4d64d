"""A table painted between new rows and their measuring shows them in full once measured.

DataTable measures new rows' widths on its next Idle event and keys its rendered lines by an update
count the measuring leaves alone. On a loaded machine the screen can paint between the two, and
every later paint reused those lines: ids cut to their header's width ("ms" for msg_…, "tasks." for
tasks.email) until some other change (Textual issue 4470). Three console tests failed that way in
full runs before this was understood."""
from __future__ import annotations

from typing import Any

from textual.app import App, ComposeResult
from textual.widgets import DataTable

from okconsole.widgets.tui_tables import Table
from screenkit import screen_text

LONG_ID = "msg_01JDXQ2M7Z8V4K3N5P6R7S8T9W"


class _OneTable(App[None]):
    CSS = "DataTable { height: 1fr; }"  # as the console's: its rows are painted before they are measured

    def __init__(self, table_class: type[DataTable[Any]]) -> None:
        super().__init__()
        self.table_class = table_class

    def compose(self) -> ComposeResult:
        table = self.table_class(id="t")
        table.add_columns("Id", "Signal")
        yield table


async def _painted_before_measured(table_class: type[DataTable[Any]]) -> str:
    app = _OneTable(table_class)
    async with app.run_test(size=(80, 10)) as pilot:
        await pilot.pause()
        table = app.query_one("#t", DataTable)
        table.add_row(LONG_ID, "tasks.email")
        screen_text(app)  # a paint before the table's Idle: what a loaded machine does
        await pilot.pause()  # the Idle: the new row is measured
        return screen_text(app)


async def test_the_consoles_table_shows_a_row_painted_before_it_was_measured_in_full():
    text = await _painted_before_measured(Table)
    assert LONG_ID in text and "tasks.email" in text, text


async def test_textuals_own_table_keeps_the_lines_it_painted_before_measuring():
    """What Table works around; when this fails, Textual fixed it and Table can go."""
    text = await _painted_before_measured(DataTable)
    assert LONG_ID not in text and "ms  tasks." in [line.strip() for line in text.splitlines()], text
