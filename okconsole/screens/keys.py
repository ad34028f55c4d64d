"""The keys board (`k` on a signal's messages): each key with unfinished messages, its head, what
the head failed, and how many wait behind it; `b` keeps the blocked ones, enter opens the head.

A page is what `engine.ops.keys` returns (the store walks its index of ready keyed messages in key
order and stops at the page), so a signal with a million keys costs one page per refresh."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from engine import ops

from ..safe import cell, content
from ..styles import DEAD_STYLE, STATUS_STYLE
from ..widgets.tui_tables import Table, sync_rows
from .base import ConsoleScreen, text_filter

PAGE = 100
COLUMNS = ("key", "flow", "head", "status", "failed", "waiting", "last")
LABELS = {
    "key": "Key",
    "flow": "Flow",
    "head": "Head",
    "status": "Status",
    "failed": "Failed",
    "waiting": "Waiting",
    "last": "Last failure",
}


def key_cells(k: ops.KeyHead) -> list[Any]:
    """One key's row: a head that failed marked in red, its last failure on one line."""
    failure = k.head_last_failure
    last = "—" if failure is None else (f"{failure.code}: {failure.message}" if failure.message else failure.code)
    return [
        cell(k.key),
        cell(k.flow or "—"),
        cell(k.head_id),
        cell(k.head_status, STATUS_STYLE.get(k.head_status)),
        cell(str(k.head_attempts), DEAD_STYLE if k.head_attempts else None),
        cell(str(k.waiting)),
        cell(last),
    ]


class KeysScreen(ConsoleScreen):
    ENTER_HINT = "Open the key's head"
    BINDINGS = [
        Binding("b", "blocked", "Blocked only"),
        Binding("n", "next_page", "Next page"),
        Binding("p", "prev_page", "Prev page"),
        Binding("y", "copy_id", "Copy head id"),
    ]

    def __init__(self, signal: str, blocked_only: bool = False) -> None:
        super().__init__()
        self.signal = signal
        self.blocked_only = blocked_only
        self.cursors: list[str | None] = [None]  # the store's cursor of each visited page
        self.next_after: str | None = None
        self.shown = 0

    def body(self) -> ComposeResult:
        yield Static("", id="title")
        table: DataTable[Any] = Table(id="keys", cursor_type="row", zebra_stripes=True)
        for key in COLUMNS:
            table.add_column(LABELS[key], key=key)
        yield table
        yield Static("", id="empty")

    def on_mount(self) -> None:
        self.TITLE_TEXT = f"keys · {self.signal}"
        super().on_mount()

    def focus_main(self) -> None:
        self.query_one("#keys", DataTable).focus()

    async def load(self) -> None:
        page = await self.console.data.call(
            ops.keys, self.signal, self.blocked_only, limit=PAGE, after=self.cursors[-1]
        )
        self.next_after = page.next_after
        keep = text_filter(self.filter_text) if self.filter_text else None
        rows = []
        for k in page.items:
            cells = key_cells(k)
            if keep is None or keep(" ".join(c.plain for c in cells)):
                rows.append((k.head_id, cells))
        self.shown = len(rows)
        sync_rows(self.query_one("#keys", DataTable), rows, COLUMNS)
        self.render_title(page)

    def render_title(self, page: ops.KeyPage) -> None:
        what = "blocked keys (head failed, messages waiting)" if self.blocked_only else "keys with unfinished messages"
        more = " · n: next page" if page.next_after is not None else ""
        found = " · filter $filter" if self.filter_text else ""
        self.query_one("#title", Static).update(
            content(
                f"[b]$signal[/b] · {what} · page {len(self.cursors)} ({self.shown} keys){more}{found} · b: "
                + ("all keys" if self.blocked_only else "blocked only"),
                signal=self.signal,
                filter=repr(self.filter_text),
            )
        )
        empty = self.query_one("#empty", Static)
        empty.update("" if self.shown else f"No {what} here.")
        empty.display = not self.shown

    def _first_page(self) -> None:
        self.cursors = [None]
        self.next_after = None
        self.action_refresh()

    def action_blocked(self) -> None:
        self.blocked_only = not self.blocked_only
        self._first_page()

    def action_next_page(self) -> None:
        if self.next_after is not None:
            self.cursors.append(self.next_after)
            self.next_after = None
            self.action_refresh()

    def action_prev_page(self) -> None:
        if len(self.cursors) > 1:
            self.cursors.pop()
            self.action_refresh()

    def _cursor_id(self) -> str | None:
        table = self.query_one("#keys", DataTable)
        if not table.row_count:
            return None
        value = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return str(value) if value is not None else None

    def action_copy_id(self) -> None:
        self.copy_id(self._cursor_id())

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self.console.open_detail(event.row_key.value)
