"""This process's handler counters and duration histogram, kept as plain numbers.

A run costs a dict lookup, a bisect and three additions; the Prometheus families are built from
these only when someone scrapes (`metrics.py`), so the hot path never touches a metrics library.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# Prometheus' default buckets (seconds): the ones dashboards and alerts expect.
BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
OUTCOMES: tuple[str, ...] = ("delivered", "failed", "dead")


@dataclass(slots=True)
class FlowCounts:
    """One (signal, flow): runs by outcome, and their durations per bucket (not cumulative)."""

    signal: str
    flow: str
    outcomes: list[int] = field(default_factory=lambda: [0] * len(OUTCOMES))
    buckets: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    seconds: float = 0.0

    def add(self, outcome: int, seconds: float) -> None:
        self.outcomes[outcome] += 1
        self.buckets[bisect_left(BUCKETS, seconds)] += 1
        self.seconds += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """The histogram as Prometheus writes it: (`le`, runs at or under it), `+Inf` last."""
        total, out = 0, []
        for bound, n in zip((*(str(b) for b in BUCKETS), "+Inf"), self.buckets, strict=True):
            total += n
            out.append((bound, total))
        return out


class HandledStats:
    """Every (signal, flow) this process ran, keyed by queue (one flow per queue)."""

    def __init__(self) -> None:
        self.by_queue: dict[str, FlowCounts] = {}

    def add_flow(self, queue: str, signal: str, flow: str) -> FlowCounts:
        """The counts of a queue run for the first time (later runs find them in `by_queue`)."""
        counts = self.by_queue[queue] = FlowCounts(signal, flow)
        return counts

    def flows(self) -> list[FlowCounts]:
        return sorted(self.by_queue.values(), key=lambda c: (c.signal, c.flow))
