"""The TUI's DataTables (the CLI's Rich tables are okconsole/cli_tables.py): kept in step with
fresh rows without flicker, every number drawn in full."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.message import Message
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

    def measure_now(self) -> None:
        """Measure the rows just added now rather than on the next Idle: a table rebuilt in one go
        (new columns, a new sort) is never painted with its cells cut to the headers' widths."""
        if self._require_update_dimensions:
            self._require_update_dimensions = False
            new_rows = self._new_rows.copy()
            self._new_rows.clear()
            self._update_dimensions(new_rows)


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
    if isinstance(table, Table):
        table.measure_now()
    if selected in order:
        table.move_cursor(row=order.index(selected))


EMPTY_CELLS = frozenset({"", "-", "—"})  # what an unset value is drawn as


@dataclass(frozen=True)
class Col:
    """A column of a FittedTable. `priority`: when the table is wider than the screen, columns with
    every cell empty go first, then the lowest priorities; `ALWAYS` never goes (an id, a name)."""

    key: str
    label: str
    priority: int


ALWAYS = 1_000


def _width(value: Any) -> int:
    return Text(value).cell_len if isinstance(value, str) else Text.assemble(value).cell_len


def choose_columns(
    columns: Sequence[Col], labels: Sequence[str], rows: Sequence[Sequence[Any]], width: int, padding: int = 1
) -> tuple[list[int], list[str]]:
    """Which columns fit in `width` cells (their indexes, in order) and the labels of those left
    out, an empty one marked "(empty)": empty columns go before useful ones, then the least useful.
    Nothing of the table's layout is named here: each screen gives its columns' priorities."""
    widths = [
        max([_width(label), *(_width(row[i]) for row in rows if i < len(row))]) + 2 * padding
        for i, label in enumerate(labels)
    ]
    empty = {i for i in range(len(columns)) if rows and all(_plain(row[i]) in EMPTY_CELLS for row in rows)}
    order = sorted(range(len(columns)), key=lambda i: (i not in empty, columns[i].priority, -i))
    shown = set(range(len(columns)))
    total = sum(widths)
    for i in order:
        if total <= width:
            break
        if columns[i].priority >= ALWAYS:
            continue
        shown.discard(i)
        total -= widths[i]
    for i in reversed(order):  # a narrow column left out before a wide one may fit beside the rest
        if i not in shown and total + widths[i] <= width:
            shown.add(i)
            total += widths[i]
    hidden = [labels[i] + (" (empty)" if i in empty else "") for i in range(len(columns)) if i not in shown]
    return sorted(shown), hidden


def _plain(value: Any) -> str:
    return (value.plain if isinstance(value, Text) else str(value)).strip()


class FittedTable(Table):
    """A Table that shows the columns that fit its width (`choose_columns`) and says which it left
    out (`Fitted`, shown by the screen as a note), rather than letting them scroll off the right
    edge unseen. Rows and header labels change together, in one call (`show`): a table never
    shows a header from one query over the rows of another."""

    class Fitted(Message):
        """The columns left out changed: `note` says which ("" when every column is shown)."""

        def __init__(self, note: str) -> None:
            super().__init__()
            self.note = note

    def __init__(self, columns: Sequence[Col], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.specs = list(columns)
        self.labels = {c.key: c.label for c in columns}
        self.wanted: list[tuple[str, Sequence[Any]]] = []
        self.laid_out: list[tuple[str, str]] = []  # (key, label) of the columns on screen
        self.note = ""

    def on_mount(self) -> None:
        self.show([])

    def on_resize(self) -> None:
        self.show(self.wanted)

    def available_width(self) -> int:
        width = self.size.width or self.app.size.width
        if len(self.wanted) > max(0, self.size.height - 1):  # the rows overflow: a vertical scrollbar
            width -= self.styles.scrollbar_size_vertical
        return width

    def show(self, rows: Sequence[tuple[str, Sequence[Any]]], labels: dict[str, str] | None = None) -> None:
        """Draw `rows` (key, a cell for every column) under `labels` (key -> header, for the ones
        that changed: a sort marker), with the columns that fit."""
        self.wanted = list(rows)
        self.labels.update(labels or {})
        heads = [self.labels[c.key] for c in self.specs]
        shown, hidden = choose_columns(
            self.specs, heads, [cells for _, cells in self.wanted], self.available_width(), self.cell_padding
        )
        layout = [(self.specs[i].key, heads[i]) for i in shown]
        cells = [(key, [row[i] for i in shown]) for key, row in self.wanted]
        if layout != self.laid_out:
            self._rebuild(layout, cells)
        else:
            sync_rows(self, cells, [key for key, _ in layout])
        note = f"+{len(hidden)} cols left out at {self.app.size.width} wide: {', '.join(hidden)}" if hidden else ""
        if note != self.note:
            self.note = note
            self.post_message(self.Fitted(note))

    def _rebuild(self, layout: list[tuple[str, str]], cells: list[tuple[str, list[Any]]]) -> None:
        """New columns (a width change, a sort marker): rows and header in one go, cursor kept."""
        current = [key.value for key in self.rows]
        selected = current[self.cursor_row] if current and 0 <= self.cursor_row < len(current) else None
        self.clear(columns=True)
        for key, label in layout:
            self.add_column(label, key=key)
        for key, row in cells:
            self.add_row(*row, key=key)
        self.measure_now()
        order = [key for key, _ in cells]
        if selected in order:
            self.move_cursor(row=order.index(selected))
        self.laid_out = layout
