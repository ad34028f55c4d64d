"""The operator audit log: who replayed or purged what, when and why."""
from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.widgets import DataTable

from engine import ops

from .. import fmt
from ..widgets.tables import sync_rows
from .base import ConsoleScreen, text_filter

COLUMNS = ("at", "actor", "action", "signal", "count", "reason")


class AuditScreen(ConsoleScreen):
    TITLE_TEXT = "audit log"

    def body(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="audit", cursor_type="row", zebra_stripes=True)
        for key in COLUMNS:
            table.add_column(key.capitalize(), key=key)
        yield table

    def focus_main(self) -> None:
        self.query_one("#audit", DataTable).focus()

    async def load(self) -> None:
        entries = await self.console.data.call(ops.audit, 500)
        keep = text_filter(self.filter_text) if self.filter_text else None
        rows = []
        for i, e in enumerate(entries):
            cells = [fmt.clock(e.at), e.actor, e.action, e.signal or "—", str(e.count), e.reason or ""]
            if keep is None or keep(" ".join(cells)):
                rows.append((f"{e.at}:{i}", cells))
        sync_rows(self.query_one("#audit", DataTable), rows, COLUMNS)
