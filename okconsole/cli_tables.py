"""The CLI's Rich tables (`okconsole stats` and co.; the TUI's DataTables are widgets/tui_tables.py).

They never split an id, a key or a time across lines.

Rich shrinks every column of a table that is too wide and folds what no longer fits, so at 80 or
120 columns an id came out in two halves. Here each column says what it holds:

- KEEP: an id, a key, a name or a time: always its full width, on one line;
- CROP: free text: one line, cut with `…` when the terminal is too narrow;
- WRAP: free text that may take several lines, broken between words (never narrower than its
  longest word, so an id inside stays whole).

On a terminal the CROP/WRAP columns give way first (widest first); if the KEEP columns alone are
still too wide, columns with nothing in them ("-" on every row) are left out, then the table's
least useful ones, and a note says which; past that
(a very narrow terminal) the line is left long. When stdout is not a terminal nothing is cut: the
line is as long as it needs to be.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

KEEP, CROP, WRAP = "keep", "crop", "wrap"
GAP = 2  # box=None, padding (0, 1), pad_edge=False: two spaces between columns
MIN_FLEX = 6  # a cropped column keeps at least this much ("Last …")


@dataclass(frozen=True)
class Column:
    name: str
    kind: str = KEEP
    numeric: bool = False


@dataclass
class Grid:
    """Rows of Rich-markup cells under named columns; `drop` lists columns to leave out first."""

    columns: Sequence[Column]
    title: str | None = None
    drop: Sequence[str] = ()
    rows: list[tuple[list[str], str]] = field(default_factory=list)

    def add(self, *cells: str, style: str = "") -> None:
        self.rows.append((list(cells), style))


def _cell_width(markup: str) -> int:
    return max((Text.from_markup(line).cell_len for line in markup.splitlines()), default=0)


def _longest_word(markup: str) -> int:
    return max((len(word) for word in Text.from_markup(markup).plain.split()), default=0)


def minimum_widths(grid: Grid, natural: list[int]) -> list[int]:
    """How far each column may shrink: KEEP not at all, WRAP to its longest word, CROP to a few letters."""
    least = []
    for i, col in enumerate(grid.columns):
        if col.kind == KEEP:
            least.append(natural[i])
        elif col.kind == WRAP:
            least.append(min(natural[i], max([MIN_FLEX] + [_longest_word(cells[i]) for cells, _ in grid.rows])))
        else:
            least.append(min(natural[i], MIN_FLEX))
    return least


def natural_widths(grid: Grid) -> list[int]:
    widths = [len(c.name) for c in grid.columns]
    for cells, _ in grid.rows:
        widths = [max(w, _cell_width(cell)) for w, cell in zip(widths, cells, strict=False)]
    return widths


def fit(grid: Grid, available: int) -> tuple[list[int], list[str]]:
    """Widths of the shown columns (by index, `-1` for a hidden one) and the names left out."""
    widths = natural_widths(grid)
    least = minimum_widths(grid, widths)
    shown = list(range(len(widths)))
    hidden: list[str] = []

    def total(cols: list[int], ws: list[int]) -> int:
        return sum(ws[i] for i in cols) + GAP * max(0, len(cols) - 1)

    while True:
        ws = list(widths)
        excess = total(shown, ws) - available
        while excess > 0:  # the widest column that can still give, one character at a time
            wide = [i for i in shown if ws[i] > least[i]]
            if not wide:
                break
            widest = max(wide, key=lambda i: ws[i])
            ws[widest] -= 1
            excess -= 1
        if excess <= 0:
            break
        droppable = [i for i in droppable_order(grid) if i in shown]
        if not droppable:
            break  # nothing more to leave out: the line stays long
        shown.remove(droppable[0])
        hidden.append(grid.columns[droppable[0]].name)
    return [ws[i] if i in shown else -1 for i in range(len(ws))], hidden


def empty_columns(grid: Grid) -> set[int]:
    """Columns in which every row says nothing ("-"): the first to leave out, before a useful one."""
    return {
        i
        for i in range(len(grid.columns))
        if grid.rows and all(Text.from_markup(cells[i]).plain.strip() in ("", "-", "—") for cells, _ in grid.rows)
    }


def droppable_order(grid: Grid) -> list[int]:
    """The order columns are left out in: empty ones first (any but the first), then `drop`'s."""
    empty = sorted(i for i in empty_columns(grid) if i > 0)
    named = [grid.columns.index(c) for name in grid.drop for c in grid.columns if c.name == name]
    return empty + [i for i in named if i not in empty]


def line_width(widths: list[int]) -> int:
    shown = [w for w in widths if w >= 0]
    return sum(shown) + GAP * max(0, len(shown) - 1)


def render(out: Console, grid: Grid) -> None:
    """Print `grid` on `out`: fitted to a terminal's width, at its natural width elsewhere."""
    if out.is_terminal:
        widths, hidden = fit(grid, out.width)
    else:
        widths, hidden = natural_widths(grid), []
    table = Table(title=grid.title, title_justify="left", header_style="bold", pad_edge=False, box=None)
    shown = [i for i, w in enumerate(widths) if w >= 0]
    for i in shown:
        col = grid.columns[i]
        table.add_column(
            col.name,
            justify="right" if col.numeric else "left",
            width=widths[i],
            no_wrap=col.kind != WRAP,
            overflow="ellipsis",
        )  # a KEEP column is never narrower
    for cells, style in grid.rows:
        table.add_row(*(cells[i] for i in shown), style=style or None)
    # past every drop a KEEP column is still whole: the line is left long rather than cut
    out.print(table, crop=False, width=max(out.width, line_width(widths)))
    if hidden:
        out.print(
            f"[dim]left out at {out.width} columns: {escape(', '.join(hidden))} (--json has them)[/]",
            no_wrap=True,
            overflow="ellipsis",
        )
