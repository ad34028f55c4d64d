"""Keep a DataTable in step with fresh rows without flicker."""
from __future__ import annotations

from typing import Any, Sequence

from textual.widgets import DataTable


def sync_rows(table: DataTable[Any], rows: Sequence[tuple[str, Sequence[Any]]], columns: Sequence[str]) -> None:
    """Show `rows` (key, cells): update changed cells in place when the keys and their order are
    unchanged (no flicker, cursor kept); otherwise rebuild and put the cursor back on its row."""
    order = [key for key, _ in rows]
    current = [key.value for key in table.rows]
    if current == order:
        for key, cells in rows:
            for column, value in zip(columns, cells):
                if table.get_cell(key, column) != value:
                    table.update_cell(key, column, value)
        return
    selected = current[table.cursor_row] if current and 0 <= table.cursor_row < len(current) else None
    table.clear()
    for key, cells in rows:
        table.add_row(*cells, key=key)
    if selected in order:
        table.move_cursor(row=order.index(selected))
