"""The operator audit log: who replayed or purged what, when and why; enter opens its message."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable

from engine import ops
from engine.display import one_line

from .. import fmt
from ..safe import cell
from ..widgets.tui_tables import Table, sync_rows
from .base import ConsoleScreen, text_filter

COLUMNS = ("at", "actor", "action", "signal", "count", "ids", "reason", "source")
SHOWN_IDS = 2


def ids_cell(ids: list[str]) -> str:
    """The first ids of an entry, and how many more it names."""
    more = f" +{len(ids) - SHOWN_IDS}" if len(ids) > SHOWN_IDS else ""
    return (", ".join(ids[:SHOWN_IDS]) + more) if ids else "—"


class AuditScreen(ConsoleScreen):
    TITLE_TEXT = "audit log"
    BINDINGS = [Binding("y", "copy_id", "Copy id")]

    def __init__(self) -> None:
        super().__init__()
        self.ids: dict[str, list[str]] = {}  # row key -> the entry's message ids

    def body(self) -> ComposeResult:
        table: DataTable[Any] = Table(id="audit", cursor_type="row", zebra_stripes=True)
        for key in COLUMNS:
            table.add_column(key.capitalize(), key=key)
        yield table

    def focus_main(self) -> None:
        self.query_one("#audit", DataTable).focus()

    async def load(self) -> None:
        entries = await self.console.data.call(ops.audit, 500)
        keep = text_filter(self.filter_text) if self.filter_text else None
        rows = []
        self.ids = {}
        for i, e in enumerate(entries):
            source = e.source or "—"  # where a browser write came from (okconsole web); none from the CLI
            cells = [fmt.clock(e.at), e.actor, e.action, e.signal or "—", str(e.count), ids_cell(e.ids)]
            reason = e.reason or ""
            if keep is None or keep(" ".join([*cells[:5], *e.ids, reason, source])):
                key = f"{e.at}:{i}"
                self.ids[key] = e.ids
                rows.append((key, [*map(cell, cells), cell(one_line(reason)), cell(source)]))  # a reason may span lines
        sync_rows(self.query_one("#audit", DataTable), rows, COLUMNS)

    def _selected_ids(self) -> list[str]:
        table = self.query_one("#audit", DataTable)
        if not table.row_count:
            return []
        return self.ids.get(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or "", [])

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        ids = self._selected_ids()
        if not ids:
            return
        if len(ids) > 1:
            self.notify(f"{len(ids)} messages: opening the first ({ids[0]}); :show ID opens another")
        self.console.open_detail(ids[0])

    def action_copy_id(self) -> None:
        ids = self._selected_ids()
        self.copy_id(ids[0] if ids else None)
