"""Which columns a narrow terminal keeps: a column with nothing in it gives way before a useful one,
in the CLI's Rich tables (cli_tables.fit) and the TUI's (widgets/tui_tables.choose_columns)."""

from __future__ import annotations

from rich.text import Text

from okconsole.cli_tables import KEEP, Column, Grid, fit
from okconsole.widgets.tui_tables import ALWAYS, Col, choose_columns

MESSAGE_COLUMNS = ("ID", "Status", "Key", "Attempts", "Locked by", "Lease expires", "Created", "Due at")


def _messages_grid() -> Grid:
    """As `okconsole messages` lays it out (output.render_messages): Created is left out before Due at
    unless Due at has nothing to say."""
    grid = Grid(
        [Column(n, KEEP) for n in MESSAGE_COLUMNS], drop=("Lease expires", "Locked by", "Attempts", "Created", "Due at")
    )
    for n in range(3):
        grid.add(
            f"msg_01jdxq2m7z8v4k3n5p6r7s8t9{n}", "delivered", f"customer-{n}", "1", "-", "-", "2026-12-01 09:41:07", "-"
        )
    return grid


def test_the_cli_leaves_out_an_empty_column_before_created():
    widths, hidden = fit(_messages_grid(), 80)
    shown = [name for name, w in zip(MESSAGE_COLUMNS, widths) if w >= 0]
    assert "Created" in shown and "Due at" in hidden, (shown, hidden)
    assert set(hidden[:3]) == {"Due at", "Locked by", "Lease expires"}, hidden  # the empty ones first


def test_the_cli_keeps_a_due_at_that_says_something_and_names_what_it_leaves_out():
    grid = _messages_grid()
    grid.rows[0][0][7] = "2026-12-01 10:00:00"
    widths, hidden = fit(grid, 80)
    shown = [name for name, w in zip(MESSAGE_COLUMNS, widths) if w >= 0]
    assert set(shown) | set(hidden) == set(MESSAGE_COLUMNS)
    assert "Locked by" in hidden and "Lease expires" in hidden


def test_the_tui_drops_empty_columns_then_the_least_useful_and_names_each():
    cols = [Col("id", "Id", ALWAYS), Col("owner", "Owner", 90), Col("created", "Created", 60), Col("note", "Note", 10)]
    rows = [[Text("msg_01jdxq2m7z8v4k3n5p6r7s8t9w"), Text("—"), Text("1.2s ago"), Text("x" * 40)]]
    labels = [c.label for c in cols]
    shown, hidden = choose_columns(cols, labels, rows, 45)
    assert [labels[i] for i in shown] == ["Id", "Created"] and hidden == ["Owner (empty)", "Note"], hidden
    shown, hidden = choose_columns(cols, labels, rows, 60)  # room left once Note is out: the empty one is back
    assert [labels[i] for i in shown] == ["Id", "Owner", "Created"] and hidden == ["Note"], hidden
    shown, hidden = choose_columns(cols, labels, rows, 200)
    assert hidden == [] and len(shown) == 4
    shown, hidden = choose_columns(cols, labels, rows, 10)  # the id stays, whatever the width
    assert [labels[i] for i in shown] == ["Id"]
