"""The history screen's numbers: a signal's per-minute counts (ops.history) as rates per second
over a chart window, every minute of the window present (minutes before the first recorded one,
or never flushed, are zeros)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.ops import HistoryPoint

MINUTE_MS = 60_000
# key -> (label, minutes): the windows the screen switches between
WINDOWS = {"1": ("15 min", 15), "2": ("1 h", 60), "3": ("24 h", 24 * 60), "4": ("7 d", 7 * 24 * 60)}
SERIES = (("delivered", "delivered/s"), ("failed", "failed/s"), ("dead", "dead/s"))


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


def series(points: Sequence[HistoryPoint], now_ms: int, minutes: int) -> list[Series]:
    """delivered/s, failed/s and dead/s for every minute of the window (count / 60 s)."""
    first = window_start(now_ms, minutes)
    by_minute = {p.at: p for p in points}
    minutes_at = [first + i * MINUTE_MS for i in range(minutes)]
    return [
        Series(label, [getattr(by_minute[at], name) / 60 if at in by_minute else 0.0 for at in minutes_at])
        for name, label in SERIES
    ]
