"""The TUI's DataTables (the CLI's Rich tables are okconsole/cli_tables.py): kept in step with
fresh rows without flicker, every number drawn in full."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from textual.widgets import DataTable
from textual.widgets.data_table import RowKey


class Table(DataTable[Any]):
    """The console's DataTable: rows painted before they were measured are painted again in full.

    DataTable measures new rows on its next Idle event but keys its rendered lines by an update
    count that measuring leaves alone, so lines painted in between (a loaded machine paints first)
    kept their header's width for good: "ms" for a message id (Textual issue 4470).
    """

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        before = [column.content_width for column in self.ordered_columns]
        super()._update_dimensions(new_rows)
        if [column.content_width for column in self.ordered_columns] != before:
            self._update_count += 1  # part of every render cache's key: what was painted is stale
            self.refresh()


def sync_rows(table: DataTable[Any], rows: Sequence[tuple[str, Sequence[Any]]], columns: Sequence[str]) -> None:
    """Show `rows` (key, cells): update changed cells in place when the keys and their order are
    unchanged (no flicker, cursor kept); otherwise rebuild and put the cursor back on its row.

    An in-place update widens its column when the new value is wider than what was first painted
    (`update_width`): without it DataTable keeps the first width and cuts 12003 to `1200`, 11ms to
    `11m`, silently. Text that must stay narrow is cropped with `…` by the screen (fmt.short)."""
    order = [key for key, _ in rows]
    current = [key.value for key in table.rows]
    if current == order:
        for key, cells in rows:
            for column, value in zip(columns, cells, strict=False):
                if table.get_cell(key, column) != value:
                    table.update_cell(key, column, value, update_width=True)
        return
    selected = current[table.cursor_row] if current and 0 <= table.cursor_row < len(current) else None
    table.clear()
    for key, cells in rows:
        table.add_row(*cells, key=key)
    if selected in order:
        table.move_cursor(row=order.index(selected))
