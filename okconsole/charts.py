"""The history screen's numbers: a signal's per-minute counts (ops.history) as rates per second
over a chart window, every minute of the window present (minutes before the first recorded one,
or never flushed, are zeros).

The current minute is unfinished: its count divided by 60 s would climb from 0 to the real rate
every minute, so it is divided by the part of the minute that has elapsed (at least
MIN_ELAPSED_S, so the first second of a minute does not turn one message into a spike)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.ops import HistoryPoint

MINUTE_MS = 60_000
# key -> (label, minutes): the windows the screen switches between
WINDOWS = {"1": ("15 min", 15), "2": ("1 h", 60), "3": ("24 h", 24 * 60), "4": ("7 d", 7 * 24 * 60)}
SERIES = (("delivered", "delivered/s"), ("failed", "failed/s"), ("dead", "dead/s"))
MIN_ELAPSED_S = 5.0  # the apps flush their counts every 5 s: a shorter span is mostly noise


@dataclass(frozen=True)
class Series:
    """One chart: per-minute rates (per second), oldest first, and what its header says."""

    label: str
    rates: list[float]

    @property
    def now(self) -> float:
        return self.rates[-1] if self.rates else 0.0

    @property
    def peak(self) -> float:
        return max(self.rates, default=0.0)

    @property
    def mean(self) -> float:
        return sum(self.rates) / len(self.rates) if self.rates else 0.0

    def header(self) -> str:
        return f"{self.label:<12} now {self.now:7.2f}   avg {self.mean:7.2f}   peak {self.peak:7.2f}"


def window_start(now_ms: int, minutes: int) -> int:
    """The first minute of a window of `minutes` minutes ending with the current one."""
    return now_ms - now_ms % MINUTE_MS - (minutes - 1) * MINUTE_MS


def seconds_of(at: int, now_ms: int) -> float:
    """The span a minute's count was gathered over: 60 s, or the elapsed part of the current one."""
    elapsed = (now_ms - at) / 1000
    return 60.0 if elapsed >= 60 else max(elapsed, MIN_ELAPSED_S)


def series(points: Sequence[HistoryPoint], now_ms: int, minutes: int) -> list[Series]:
    """delivered/s, failed/s and dead/s for every minute of the window (count / its seconds)."""
    first = window_start(now_ms, minutes)
    by_minute = {p.at: p for p in points}
    minutes_at = [first + i * MINUTE_MS for i in range(minutes)]
    return [
        Series(
            label,
            [getattr(by_minute[at], name) / seconds_of(at, now_ms) if at in by_minute else 0.0 for at in minutes_at],
        )
        for name, label in SERIES
    ]


BLOCKS = " ▁▂▃▄▅▆▇█"  # eighths of a cell, from empty to full


def columns_of(values: Sequence[float], width: int) -> list[float]:
    """`values` spread over `width` columns: each value over its share of columns when there are
    fewer values than columns, else each column the peak of the values it covers (a burst shows)."""
    n = len(values)
    if n == 0 or width <= 0:
        return []
    return [max(values[c * n // width : max(c * n // width + 1, (c + 1) * n // width)]) for c in range(width)]


def bar_rows(values: Sequence[float], width: int, height: int, top: float) -> list[str]:
    """A bar chart `height` rows tall, top row first, on a zero baseline: a bar of `top` fills the
    height, a zero is empty (Textual's Sparkline scales from the smallest value instead, so a
    y scale beside it would be wrong)."""
    eighths = [0 if top <= 0 else round(max(0.0, v) / top * height * 8) for v in columns_of(values, width)]
    rows = []
    for row in range(height - 1, -1, -1):  # from the top row down
        rows.append("".join(BLOCKS[min(8, max(0, e - row * 8))] for e in eighths))
    return rows


def scale_label(value: float) -> str:
    """A y scale's label: short, and exact enough to read a rate off it."""
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}".rstrip("0").rstrip(".") if value else "0"
