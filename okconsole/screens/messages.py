"""Messages of one signal by status: paged from the store, filtered, sorted, with lease columns."""
from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from engine import ops

from .. import fmt
from ..widgets.tables import sync_rows
from .base import ConsoleScreen, text_filter

PAGE = 50
STATUS_KEYS = {"1": None, "2": "pending", "3": "inflight", "4": "delivered", "5": "dead"}
COLUMNS = [("id", "Id"), ("status", "Status"), ("key", "Key"), ("attempts", "Att."), ("owner", "Owner"),
           ("lease", "Lease left"), ("created", "Created"), ("note", "Note")]
STATUS_STYLE = {"pending": "yellow", "inflight": "cyan", "delivered": "green", "dead": "b red"}


class MessagesScreen(ConsoleScreen):
    ENTER_HINT = "Open"
    BINDINGS = [Binding("1", "status('1')", "All"), Binding("2", "status('2')", "Pending"),
                Binding("3", "status('3')", "Inflight"), Binding("4", "status('4')", "Delivered"),
                Binding("5", "status('5')", "Dead"), Binding("n", "next_page", "Next page"),
                Binding("p", "prev_page", "Prev page"), Binding("s", "sort", "Sort"),
                Binding("d", "dlq", "Dead letters")]

    def __init__(self, signal: str, status: str | None = None) -> None:
        super().__init__()
        self.signal = signal
        self.status = status
        self.cursors: list[int | None] = [None]  # before_seq of each visited page
        self.next_cursor: int | None = None
        self.clock_offset_ms = 0  # the store's lease clock minus ours, from the last page
        self.rows: list[Any] = []
        self.sort_column: str | None = None
        self.sort_reverse = False

    def body(self) -> ComposeResult:
        yield Static("", id="title")
        table: DataTable[Any] = DataTable(id="messages", cursor_type="row", zebra_stripes=True)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        yield table
        yield Static("", id="empty")

    def on_mount(self) -> None:
        self.TITLE_TEXT = f"messages · {self.signal}"
        super().on_mount()

    def focus_main(self) -> None:
        self.query_one("#messages", DataTable).focus()

    async def load(self) -> None:
        page = await self.console.data.call(ops.message_page, self.signal, self.status, None, PAGE,
                                            self.cursors[-1])
        self.rows = page.items
        self.next_cursor = page.next_before_seq
        # leases are judged by the store's clock (PostgreSQL's own): keep its offset from ours
        self.clock_offset_ms = (page.clock_ms - fmt.now_ms()) if page.clock_ms is not None else 0
        self.render_rows()

    def render_rows(self) -> None:
        table = self.query_one("#messages", DataTable)
        keep = text_filter(self.filter_text) if self.filter_text else None
        now = fmt.now_ms() + self.clock_offset_ms
        # Keys blocked behind their head: an older unfinished message of the same key on this page.
        heads: dict[str, str] = {}
        for row in sorted(self.rows, key=lambda r: r.created_at):
            if row.key is not None and row.status in ("pending", "inflight") and row.key not in heads:
                heads[row.key] = row.id
        wanted: dict[str, list[str]] = {}
        for row in self.rows:
            text = f"{row.id} {row.status} {row.key or ''} {row.locked_by or ''}"
            if keep is not None and not keep(text):
                continue
            lease = owner = "—"
            note = ""
            if row.status == "inflight":
                owner = fmt.short(row.locked_by, 24)
                left = (row.lease_expires_at or 0) - now
                lease = fmt.span(left) if left > 0 else "[b yellow]expired[/]"
                if left <= 0:
                    note = "reclaimable now"
            head = heads.get(row.key or "")
            if row.status == "pending" and head is not None and head != row.id:
                note = f"blocked behind {head}"
            if row.parent_run_id and not note:
                note = f"from {row.parent_run_id}"
            style = STATUS_STYLE.get(row.status, "")
            wanted[row.id] = [row.id, f"[{style}]{row.status}[/]" if style else row.status, row.key or "—",
                              str(row.attempts), owner, lease, fmt.ago(row.created_at), note]
        order = list(wanted)
        if self.sort_column is not None:
            index = [c for c, _ in COLUMNS].index(self.sort_column)
            order.sort(key=lambda k: wanted[k][index], reverse=self.sort_reverse)
        sync_rows(table, [(key, wanted[key]) for key in order], [c for c, _ in COLUMNS])
        status = self.status or "all"
        page_no = len(self.cursors)
        more = " · n: next page" if self.next_cursor is not None else ""
        self.query_one("#title", Static).update(
            f"[b]{self.signal}[/b] · {status} · page {page_no} ({len(self.rows)} rows){more}"
            + (f" · filter {self.filter_text!r}" if self.filter_text else ""))
        empty = self.query_one("#empty", Static)
        empty.update("" if wanted else "No messages here.")
        empty.display = not wanted

    def action_status(self, key: str) -> None:
        self.status = STATUS_KEYS[key]
        self.cursors = [None]
        self.action_refresh()

    def action_next_page(self) -> None:
        if self.next_cursor is not None:
            self.cursors.append(self.next_cursor)
            self.next_cursor = None  # known again once this page has loaded: no double step
            self.action_refresh()

    def action_prev_page(self) -> None:
        if len(self.cursors) > 1:
            self.cursors.pop()
            self.action_refresh()

    def action_sort(self) -> None:
        table = self.query_one("#messages", DataTable)
        column = COLUMNS[table.cursor_column][0] if table.cursor_column < len(COLUMNS) else "id"
        if self.sort_column == column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_column, self.sort_reverse = column, False
        self.render_rows()

    def action_dlq(self) -> None:
        self.console.open_dlq(self.signal)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self.console.open_detail(event.row_key.value)
