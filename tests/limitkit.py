"""What a flow limit promises, counted from recorded handler runs: the most running at once and the
most starts in any window. Shared by tests/test_flow_limits.py and bench/chaos.py."""

from __future__ import annotations


def most_at_once(runs: list[tuple[int, int]]) -> int:
    """The most runs (start, end) at once: a run ending at t and one starting at t do not overlap."""
    edges = sorted([(end, -1) for _, end in runs] + [(start, 1) for start, _ in runs])
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def most_in_window(starts: list[int], window_ms: int) -> int:
    """The most of `starts` in any interval [t, t + window_ms)."""
    starts, best, lo = sorted(starts), 0, 0
    for hi, at in enumerate(starts):
        while starts[lo] <= at - window_ms:
            lo += 1
        best = max(best, hi - lo + 1)
    return best
