"""A signal's history: delivered/s, failed/s and dead/s per minute over 15 min, 1 h, 24 h or
7 d (keys 1-4, w cycles), each a bar chart with its y scale under a header of now / avg / peak;
`s` / `S` switch to the next / previous signal."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Static

from engine import ops
from engine.display import inert

from .. import charts, fmt
from ..safe import content
from ..widgets.bar_chart import BarChart
from .base import ConsoleScreen

WINDOW_KEYS = list(charts.WINDOWS)
BAR_STYLE = {"delivered": "green", "failed": "yellow", "dead": "bold red"}


class Charts(Vertical, can_focus=True):
    """The three charts; focusable, so the screen's keys reach it rather than the hidden filter."""


class HistoryScreen(ConsoleScreen):
    TITLE_TEXT = "history"
    BINDINGS = [
        Binding("1", "window('1')", "15 min"),
        Binding("2", "window('2')", "1 h"),
        Binding("3", "window('3')", "24 h"),
        Binding("4", "window('4')", "7 d"),
        Binding("w", "next_window", "Next window", show=False),
        Binding("s", "signal(1)", "Next signal"),
        Binding("S", "signal(-1)", "Previous signal"),
    ]

    def __init__(self, signal: str, window: str = "1") -> None:
        super().__init__()
        self.signal = signal
        self.window = window

    def body(self) -> ComposeResult:
        yield Static("", id="history-title")
        with Charts(id="charts"):
            for name, _label in charts.SERIES:
                yield Static("", id=f"head-{name}", classes="chart-head")
                yield BarChart(BAR_STYLE[name], id=f"chart-{name}", classes="chart")
        yield Static("", id="history-axis")

    def focus_main(self) -> None:
        self.query_one("#charts", Charts).focus()

    def on_mount(self) -> None:
        super().on_mount()
        self.sub_title = inert(f"history · {self.signal}")

    def action_window(self, key: str) -> None:
        self.window = key
        self.action_refresh()

    def action_signal(self, step: int) -> None:
        """Chart the next (or previous) once or broadcast signal, in name order, in the same window."""
        names = sorted(name for name, kind in self.console.signal_kinds.items() if kind != "live")
        if self.signal not in names:
            names = sorted([*names, self.signal])
        if len(names) < 2:
            self.notify("no other signal to chart", severity="warning")
            return
        self.signal = names[(names.index(self.signal) + step) % len(names)]
        self.sub_title = inert(f"history · {self.signal}")
        self.action_refresh()

    def action_next_window(self) -> None:
        self.action_window(WINDOW_KEYS[(WINDOW_KEYS.index(self.window) + 1) % len(WINDOW_KEYS)])

    async def load(self) -> None:
        label, minutes = charts.WINDOWS[self.window]
        now = int(time.time() * 1000)
        since = charts.window_start(now, minutes)
        signal = self.signal
        points = await self.console.data.call(ops.history, signal, since)
        if signal == self.signal:  # else another signal was picked meanwhile: its load follows
            self.render_charts(label, minutes, now, points)

    def render_charts(self, label: str, minutes: int, now: int, points: list[ops.HistoryPoint]) -> None:
        choices = "  ".join(
            f"[reverse] {key} {name} [/]" if key == self.window else f" {key} {name} "
            for key, (name, _m) in charts.WINDOWS.items()
        )
        self.query_one("#history-title", Static).update(
            content(f"[b]$signal[/] — per second, each minute, last {label}   {choices}", signal=self.signal)
        )
        for (name, _l), one in zip(charts.SERIES, charts.series(points, now, minutes), strict=True):
            self.query_one(f"#head-{name}", Static).update(one.header())
            self.query_one(f"#chart-{name}", BarChart).data = one.rates
        start = fmt.clock(charts.window_start(now, minutes))[:16]
        self.query_one("#history-axis", Static).update(f"{start} … now  (counts flushed by each app every 5 s)")
