"""Messages of one signal by status: paged, sorted and searched by the store, with lease columns.

Sorting (shift+letter of a column, or a click on its header; again reverses) and the `/` search
(payload, key, last failure) are answered by engine.ops over the whole signal; the screen only
draws the page it gets, in the store's order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Input, Static

from engine import ops
from engine.display import inert

from .. import fmt
from ..safe import cell, content
from ..styles import STATUS_STYLE
from ..widgets.tui_tables import ALWAYS, Col, FittedTable
from .controls import MessageControls, RowFacts

PAGE = 50
STATUS_KEYS = {"1": None, "2": "pending", "3": "inflight", "4": "delivered", "5": "dead"}
# at a narrow width empty columns (Owner and Lease left outside inflight) give way first, then
# the least useful; a note under the table names them
COLUMNS = [
    Col("id", "Id", ALWAYS),
    Col("status", "Status", 90),
    Col("key", "Key", 70),
    Col("attempts", "Att.", 40),
    Col("owner", "Owner", 20),
    Col("lease", "Lease left", 30),
    Col("created", "Created", 60),
    Col("note", "Note", 50),
]
LABELS = {c.key: c.label for c in COLUMNS}
# column -> (the store's sort, its shift+letter); Note is drawn here, not a stored value
SORTS = {
    "id": ("id", "I"),
    "status": ("status", "S"),
    "key": ("key", "K"),
    "attempts": ("attempts", "A"),
    "owner": ("locked_by", "O"),
    "lease": ("lease_expires_at", "L"),
    "created": ("created_at", "C"),
}


@dataclass(frozen=True)
class PageQuery:
    """What a page was asked for: the title and the header's sort marker are drawn from the query
    of the rows on screen, never from a newer one still loading (a slow store kept the old rows
    under a new header, or an empty table, for a second or two)."""

    status: str | None
    search: str
    sort_column: str | None  # None: emit order (newest first unless reversed)
    descending: bool
    page_no: int

    def labels(self) -> dict[str, str]:
        """The headers, the sorted one marked ▼ (descending) or ▲."""
        mark = " ▼" if self.descending else " ▲"
        return {key: label + (mark if key == self.sort_column else "") for key, label in LABELS.items()}


SEARCH_HINT = "search payload, key, last failure (whole signal) — enter applies, esc clears"


class MessagesScreen(MessageControls):
    ENTER_HINT = "Open"
    BINDINGS = [
        Binding("1", "status('1')", "All"),
        Binding("2", "status('2')", "Pending"),
        Binding("3", "status('3')", "Inflight"),
        Binding("4", "status('4')", "Delivered"),
        Binding("5", "status('5')", "Dead"),
        Binding("n", "next_page", "Next page"),
        Binding("p", "prev_page", "Prev page"),
        Binding("s", "sort", "Reverse sort"),
        Binding("d", "dlq", "Dead letters"),
        Binding("k", "keys", "Keys board"),
        Binding("y", "copy_id", "Copy id"),
        *[
            Binding(letter, f"sort_by('{column}')", f"Sort by {column}", show=False)
            for column, (_, letter) in SORTS.items()
        ],
    ]

    def __init__(self, signal: str, status: str | None = None) -> None:
        super().__init__()
        self.signal = signal
        self.status = status
        self.cursors: list[str | None] = [None]  # the store's cursor of each visited page
        self.next_cursor: str | None = None
        self.cut = False  # the last searched page stopped at the store's scan budget
        self.clock_offset_ms = 0  # the store's lease clock minus ours, from the last page
        self.rows: list[Any] = []
        # what the next load asks for; `drawn` is the query of the rows on screen
        self.sort_column: str | None = None  # None: emit order (newest first unless reversed)
        self.descending = True
        self.drawn = self._wanted()

    def body(self) -> ComposeResult:
        yield Static("", id="title")
        yield FittedTable(COLUMNS, id="messages", cursor_type="row", zebra_stripes=True)
        yield Static("", id="empty")

    def _wanted(self) -> PageQuery:
        return PageQuery(self.status, self.filter_text, self.sort_column, self.descending, len(self.cursors))

    def on_mount(self) -> None:
        self.TITLE_TEXT = f"messages · {self.signal}"
        self.query_one("#filter", Input).placeholder = SEARCH_HINT
        super().on_mount()

    def _store_sort(self) -> str:
        return "seq" if self.sort_column is None else SORTS[self.sort_column][0]

    def focus_main(self) -> None:
        self.query_one("#messages", DataTable).focus()

    async def load(self) -> None:
        wanted = self._wanted()
        page = await self.console.data.call(
            ops.message_page,
            self.signal,
            wanted.status,
            None,
            PAGE,
            search=wanted.search or None,
            sort=self._store_sort(),
            descending=wanted.descending,
            cursor=self.cursors[-1],
        )
        if wanted != self._wanted():  # asked for something else meanwhile: its own load follows
            self._reload = True
            return
        self.drawn = wanted
        self.rows = page.items
        self.next_cursor = page.next_cursor
        self.cut = page.cut
        # leases are judged by the store's clock (PostgreSQL's own): keep its offset from ours
        self.clock_offset_ms = (page.clock_ms - fmt.now_ms()) if page.clock_ms is not None else 0
        self.render_rows()

    def render_rows(self) -> None:
        table = self.query_one("#messages", FittedTable)
        now = fmt.now_ms() + self.clock_offset_ms
        # Keys blocked behind their head: an older unfinished message of the same key on this page.
        heads: dict[str, str] = {}
        for row in sorted(self.rows, key=lambda r: r.created_at):
            if row.key is not None and row.status in ("pending", "inflight") and row.key not in heads:
                heads[row.key] = row.id
        wanted: dict[str, list[Any]] = {}
        for row in self.rows:
            lease, owner = cell("—"), "—"
            note = ""
            if row.status == "inflight":
                owner = fmt.short(inert(row.locked_by) or None, 24)
                left = (row.lease_expires_at or 0) - now
                lease = cell(fmt.span(left)) if left > 0 else cell("expired", "b yellow")
                if left <= 0:
                    note = "reclaimable now"
            head = heads.get(row.key or "")
            if row.status == "pending" and head is not None and head != row.id:
                note = f"blocked behind {head}"
            due = ops.waits_until(row.status, row.run_at, now)
            if due is not None and not note:  # a delay, or a back-off's next attempt
                note = f"{'retry' if row.attempts else 'due'} in {fmt.span(due - now)}"
            if row.parent_run_id and not note:
                note = f"from {row.parent_run_id}"
            wanted[row.id] = [
                cell(row.id),
                cell(row.status, STATUS_STYLE.get(row.status)),
                cell(row.key or "—"),
                cell(str(row.attempts)),
                cell(owner),
                lease,
                cell(fmt.ago(row.created_at)),
                cell(note),
            ]
        table.show(list(wanted.items()), self.drawn.labels())
        self.render_title(bool(wanted))

    def render_title(self, any_row: bool) -> None:
        """What the page shows (signal, status, order, page, search), or why it is empty."""
        drawn = self.drawn
        status = drawn.status or "all"
        more = (" · n: search on" if self.cut else " · n: next page") if self.next_cursor is not None else ""
        if drawn.sort_column is None:
            order = "newest first" if drawn.descending else "oldest first"
        else:
            order = f"by {LABELS[drawn.sort_column]} {'▼' if drawn.descending else '▲'}"
        found = " · search $search" if drawn.search else ""
        part = " (the store searched part of the signal)" if self.cut else ""
        self.query_one("#title", Static).update(
            content(
                f"[b]$signal[/b] · {status} · {order} · page {drawn.page_no} ({len(self.rows)} rows)"
                f"{part}{more}{found}",
                signal=self.signal,
                search=repr(drawn.search),
            )
        )
        empty = self.query_one("#empty", Static)
        empty.update(
            ""
            if any_row
            else (
                "No match in this part of the signal: n searches on."
                if self.cut and self.next_cursor
                else "No messages here."
            )
        )
        empty.display = not any_row

    def _first_page(self) -> None:
        self.cursors = [None]
        self.next_cursor = None
        self.action_refresh()

    def action_status(self, key: str) -> None:
        self.status = STATUS_KEYS[key]
        self._first_page()

    def apply_filter(self, text: str) -> None:
        """`/` on this screen is the store's search over the whole signal, from its first page."""
        self.filter_text = text
        self._first_page()

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
        """Reverse the current order."""
        if self.sort_column is not None:
            self.action_sort_by(self.sort_column)
            return
        self.descending = not self.descending
        self._first_page()

    def action_sort_by(self, column: str) -> None:
        """Sort by `column` (descending first); the sorted column again reverses it."""
        if column not in SORTS:
            self.notify(
                f"{LABELS.get(column, column)} is drawn by the console, not stored: it cannot be sorted by the store",
                severity="warning",
            )
            return
        self.descending = not self.descending if column == self.sort_column else True
        self.sort_column = column
        self._first_page()  # the header's marker changes with the rows, once they are here

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        if event.column_key.value:
            self.action_sort_by(event.column_key.value)

    def _cursor_id(self) -> str | None:
        table = self.query_one("#messages", DataTable)
        if not table.row_count:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def action_copy_id(self) -> None:
        if self._cursor_id() is not None:
            self.copy_id(self._cursor_id())

    def control_target(self) -> tuple[str, list[str]] | None:
        current = self._cursor_id()
        return None if current is None else (self.signal, [current])

    def row_facts(self, msg_id: str) -> RowFacts | None:
        row = next((r for r in self.rows if r.id == msg_id), None)
        if row is None:
            return None
        now = fmt.now_ms() + self.clock_offset_ms  # the store's lease clock
        waiting = ops.waits_until(row.status, row.run_at, now) is not None
        leased = row.status == "inflight" and (row.lease_expires_at or 0) > now
        return RowFacts(key=row.key, status=row.status, waiting=waiting, leased=leased)

    def action_dlq(self) -> None:
        self.console.open_dlq(self.signal)

    def action_keys(self) -> None:
        self.console.open_keys(self.signal)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self.console.open_detail(event.row_key.value)
