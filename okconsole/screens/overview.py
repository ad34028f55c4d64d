"""Signals overview: counts per status, lag, throughput and a sparkline, updated in place."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from engine import ops

from .. import fmt
from ..safe import assemble, cell, content
from ..styles import DEAD_STYLE, HEALTH_OK, PAUSED_MARK, PAUSED_STYLE, health_style
from ..widgets.tui_tables import ALWAYS, Col, FittedTable
from .base import ConsoleScreen, text_filter
from .modals import ConfirmScreen

# at a narrow width the least useful columns give way first (an empty one before any), and a note
# under the table names them: Activity, then Kind, Delivered, Inflight, ...; the signal always stays
COLUMNS = [
    Col("signal", "Signal", ALWAYS),
    # right after the name, and kept longest: "ok", or why the signal needs a look
    Col("health", "Health", 95),
    Col("kind", "Kind", 20),
    Col("pending", "Pending", 80),
    Col("inflight", "Inflight", 40),
    Col("delivered", "Delivered", 30),
    Col("dead", "Dead", 90),
    Col("lag", "Lag", 70),
    Col("rate", "Deliv/s", 50),  # "Delivered/s" would not fit beside Dead/s in 80 columns
    Col("dead_rate", "Dead/s", 60),
    Col("activity", "Activity", 10),
]
HISTORY = 32
HEALTH_IN_FULL_WIDTH = 100  # columns: narrower (80×24) shows only each signal's worst health mark


class OverviewScreen(ConsoleScreen):
    TITLE_TEXT = "signals"
    ENTER_HINT = "Open"  # a once/broadcast signal's messages, a live signal's tail
    BINDINGS = [
        Binding("d", "dlq", "Dead letters & failures"),
        Binding("t", "tail", "Tail"),
        Binding("h", "history", "History"),
        Binding("a", "audit", "Audit log"),
        Binding("w", "workers", "Workers"),
        Binding("p", "pause", "Pause"),
        Binding("u", "resume", "Resume"),
    ]
    WRITE_ACTIONS = frozenset({"pause", "resume"})

    def __init__(self) -> None:
        super().__init__()
        self.previous: dict[str, tuple[float, int, int]] = {}  # signal -> (when, delivered, dead)
        self.history: dict[str, deque[float]] = {}
        self.kinds: dict[str, str] = {}
        self.rows: dict[str, Any] = {}  # the latest stats row per signal (description, flows)

    def body(self) -> ComposeResult:
        yield FittedTable(COLUMNS, id="signals", cursor_type="row", zebra_stripes=True)
        yield Static("", id="empty")
        yield Static("", id="about")

    def focus_main(self) -> None:
        self.query_one("#signals", DataTable).focus()

    async def load(self) -> None:
        stats = await self.console.data.call(ops.stats)
        retained: dict[str, int] = {}
        heads: dict[str, int] = {}
        for row in stats:
            if row.kind == "live":
                info = await self.console.data.call(ops.tape_info, row.signal)
                retained[row.signal] = info.retained if info else 0
                heads[row.signal] = info.head if info else 0
        self.render_rows(stats, retained, heads)

    def render_rows(self, stats: list[Any], retained: dict[str, int], heads: dict[str, int] | None = None) -> None:
        """`heads`: each live tape's head seq; its rate counts appended events (the retained count
        stops growing at the retention cap)."""
        wide = self.app.size.width >= HEALTH_IN_FULL_WIDTH
        keep = text_filter(self.filter_text) if self.filter_text else None
        now = time.monotonic()
        wanted: dict[str, list[Any]] = {}
        for row in stats:
            self.kinds[row.signal] = row.kind
            self.rows[row.signal] = row
            self.console.signal_kinds[row.signal] = row.kind
            rate, dead_rate = self.rates(row, (heads or {}).get(row.signal, 0), now)
            spark = self.history.setdefault(row.signal, deque(maxlen=HISTORY))
            spark.append(rate + dead_rate)
            if keep is not None and not keep(f"{row.signal} {row.kind} {' '.join(row.health)}"):
                continue
            cells = row_cells(row, (rate, dead_rate), list(spark), retained.get(row.signal, 0), narrow=not wide)
            wanted[row.signal] = cells
        self.query_one("#signals", FittedTable).show(list(wanted.items()))
        if not stats:
            note = "No signals in this store yet. Boot an app on it (or run `okconsole demo`) and they appear here."
        elif not wanted:
            note = "No signal matches the filter $filter (esc clears it)."
        else:
            note = ""
        empty = self.query_one("#empty", Static)
        empty.update(content(note, filter=repr(self.filter_text)))
        empty.display = bool(note)
        self.show_about()

    def rates(self, row: Any, head: int, now: float) -> tuple[float, float]:
        """Delivered/s and dead/s since the last refresh (a live tape: events appended/s). A count
        that fell (a purge, retention) reads as 0, not as a negative rate."""
        delivered, dead = (head, 0) if row.kind == "live" else (row.delivered, row.dead)
        before = self.previous.get(row.signal)
        self.previous[row.signal] = (now, delivered, dead)
        if before is None or now <= before[0]:
            return 0.0, 0.0
        elapsed = now - before[0]
        return max(0.0, (delivered - before[1]) / elapsed), max(0.0, (dead - before[2]) / elapsed)

    def show_about(self) -> None:
        """The selected signal's description, and the flows that split it when a once signal has two."""
        row = self.rows.get(self.selected_signal() or "")
        text = ""
        if row is not None:
            text = "[b]$signal[/] — $description"
            if row.paused:
                text += f"  [{PAUSED_STYLE}]{PAUSED_MARK}: no worker takes its messages (u resumes)[/]"
            if split_once(row):
                text += f"  [b yellow]⚠ {len(row.flows)} flows split its messages: $flows[/] (OKE1071)"
        about = self.query_one("#about", Static)
        about.update(
            content(text, signal=row.signal, description=row.description or row.signal, flows=", ".join(row.flows))
            if row is not None
            else ""
        )
        about.display = bool(text)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_about()

    def selected_signal(self) -> str | None:
        table = self.query_one("#signals", DataTable)
        if table.row_count == 0:
            return None
        key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
        return key.value

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_open(self) -> None:
        name = self.selected_signal()
        if name is None:
            return
        if self.kinds.get(name) == "live":
            self.console.open_tail(name)
        else:
            self.console.open_messages(name)

    def action_dlq(self) -> None:
        name = self.selected_signal()
        if name is not None and not self.console.refuse_signal(name, "queue"):
            self.console.open_dlq(name)

    def action_tail(self) -> None:
        name = self.selected_signal()
        if name is not None and not self.console.refuse_signal(name, "live"):
            self.console.open_tail(name)

    def action_history(self) -> None:
        name = self.selected_signal()
        if name is not None and not self.console.refuse_signal(name, "queue"):
            self.console.open_history(name)

    def action_audit(self) -> None:
        self.console.open_audit()

    def action_workers(self) -> None:
        self.console.open_workers()

    def action_pause(self) -> None:
        self._pause_or_resume(pause=True)

    def action_resume(self) -> None:
        self._pause_or_resume(pause=False)

    def _pause_or_resume(self, pause: bool) -> None:
        """Ask (with the reason for the audit log), then pause or resume the selected signal."""
        name = self.selected_signal()
        if self.refuse_write() or name is None:
            return
        row = self.rows.get(name)
        if pause and self.console.refuse_signal(name, "queue"):
            return
        if row is not None and row.paused == pause:
            self.notify(f"{name} is {'paused already' if pause else 'not paused'}")
            return
        verb, call = ("pause", ops.pause) if pause else ("resume", ops.resume)
        effect = "No worker will take its messages until resumed." if pause else "Workers take its messages again."

        def confirmed(reason: str | None) -> None:
            if reason:
                self.run_write(verb, call, name, reason=reason)

        question = content(f"{verb.capitalize()} $name? {effect}", name=name)
        self.app.push_screen(ConfirmScreen(question, verb.capitalize()), confirmed)

    def action_back(self) -> None:
        field = self.query_one("#filter")
        if field.has_class("shown"):
            super().action_back()


def split_once(row: Any) -> bool:
    """A once signal bound to two or more flows by recent processes: they compete for its messages."""
    return row.kind == "once" and len(row.flows) > 1


def row_cells(
    row: Any, rates: tuple[float, float], spark: list[float], retained: int, narrow: bool = False
) -> list[Any]:
    """One overview row: a live tape shows what it keeps, a queue its health, its counts by
    status, its lag and its delivered/s beside its dead/s (`narrow`: only the worst health mark)."""
    rate, dead_rate = rates
    if row.kind == "live":
        cells = [row.signal, "—", "live", "—", "—", f"{retained} kept", "—", "—", f"{rate:.1f}", "—"]
        return [cell(c) for c in (*cells, fmt.sparkline(spark))]
    dead = cell(str(row.dead), DEAD_STYLE) if row.dead else cell("0")
    lag = fmt.span(row.lag_ms) if row.lag_ms is not None else "—"
    kind = assemble(row.kind, *((" ", ("⚠", "b yellow")) if split_once(row) else ()))
    if row.paused:
        kind.append(" ")
        kind.append(PAUSED_MARK, PAUSED_STYLE)
    counts = [cell(str(row.pending)), cell(str(row.inflight)), cell(str(row.delivered)), dead]
    dead_cell = cell(f"{dead_rate:.1f}", DEAD_STYLE) if dead_rate else cell("0.0")
    rest = [cell(lag), cell(f"{rate:.1f}"), dead_cell, cell(fmt.sparkline(spark))]
    return [cell(row.signal), health_cell(row.health, narrow), kind, *counts, *rest]


def health_cell(marks: list[str], narrow: bool = False) -> Any:
    """The signal's health marks, the worst first, each in its colour; "ok" in green with none.
    `narrow` (an 80-column terminal): the worst one, then "…" when there are more."""
    if not marks:
        return cell(HEALTH_OK, health_style(HEALTH_OK))
    if narrow:
        return assemble((marks[0], health_style(marks[0])), " …" if len(marks) > 1 else "")
    pieces: list[Any] = []
    for mark in marks:
        pieces += [", "] if pieces else []
        pieces.append((mark, health_style(mark)))
    return assemble(*pieces)
