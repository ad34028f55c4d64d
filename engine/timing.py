"""The time and order options of an emit (delay, at, priority, dedupe) and a signal's back-off.

Each is checked here, at the call (or at declaration for `backoff`), so bad input raises a
TypeError / ValueError before anything is stored.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .durations import MAX_DURATION_MS, option_seconds, parse_duration_ms

MAX_DEDUPE_LENGTH = 1000
MAX_PRIORITY = 2**31 - 1  # an INTEGER column on both stores
BACKOFF_JITTER = 0.10  # at most 10 % added to each back-off delay


@dataclass(frozen=True, slots=True)
class Schedule:
    """When an emit's message becomes due: `delay_ms` from now by the store's clock, or the
    absolute `run_at` (epoch ms); both None: due at once."""

    delay_ms: int | None = None
    run_at: int | None = None


def _delay_ms(label: str, delay: object) -> int:
    if isinstance(delay, bool):
        raise TypeError(f'{label}: delay is a duration ("30s", a timedelta or seconds), got {delay!r}')
    if isinstance(delay, str):
        ms = parse_duration_ms(delay)
        if ms is None:
            raise ValueError(f'{label}: delay must be a duration like "500ms", "30s" or "2h", got {delay!r}')
        return ms
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, (int, float)):
        seconds = float(delay)
    else:
        raise TypeError(f'{label}: delay is a duration ("30s", a timedelta or seconds), got {type(delay).__name__}')
    if seconds != seconds or seconds < 0:  # NaN, or negative
        raise ValueError(f"{label}: delay must be zero or more, got {delay!r}")
    ms = round(seconds * 1000)
    if ms > MAX_DURATION_MS:
        raise ValueError(f"{label}: delay is too long ({delay!r})")
    return ms


def _at_ms(label: str, at: object) -> int:
    if isinstance(at, datetime):
        if at.tzinfo is None or at.utcoffset() is None:
            raise ValueError(f"{label}: at must be an aware datetime (with a time zone), got a naive one")
        return round(at.timestamp() * 1000)
    if isinstance(at, int) and not isinstance(at, bool):
        if not 0 <= at <= MAX_DURATION_MS:
            raise ValueError(f"{label}: at in epoch milliseconds must be between 0 and {MAX_DURATION_MS}")
        return at
    raise TypeError(f"{label}: at is an aware datetime or epoch milliseconds (int), got {type(at).__name__}")


def schedule_of(label: str, delay: object, at: object) -> Schedule:
    """The checked `delay=` / `at=` of one emit (at most one of them)."""
    if delay is not None and at is not None:
        raise TypeError(f"{label}: pass delay or at, not both")
    if delay is not None:
        return Schedule(delay_ms=_delay_ms(label, delay))
    if at is not None:
        return Schedule(run_at=_at_ms(label, at))
    return Schedule()


def check_priority(label: str, priority: object) -> int:
    """An int (not a bool) that fits the store's INTEGER column."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"{label}: priority is an int, got {type(priority).__name__}")
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"{label}: priority must be between {-MAX_PRIORITY} and {MAX_PRIORITY}")
    return priority


def check_dedupe(label: str, dedupe: object) -> str | None:
    """None, or a non-empty string without NUL of at most MAX_DEDUPE_LENGTH characters."""
    if dedupe is None:
        return None
    if not isinstance(dedupe, str):
        raise TypeError(f"{label}: dedupe is a string, got {type(dedupe).__name__}")
    if not 1 <= len(dedupe) <= MAX_DEDUPE_LENGTH:
        raise ValueError(f"{label}: dedupe has 1 to {MAX_DEDUPE_LENGTH} characters")
    if "\x00" in dedupe:
        raise ValueError(f"{label}: dedupe may not contain NUL characters")
    try:
        dedupe.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{label}: dedupe must be valid Unicode text ({err.reason})") from None
    return dedupe


def check_dedupe_for(label: str, dedupe_for: object, dedupe: str | None) -> int | None:
    """None, or the milliseconds of a duration ("24h", a timedelta, seconds) for which a dedupe key
    stays held after its message finished; it needs the key it holds."""
    if dedupe_for is None:
        return None
    if dedupe is None:
        raise TypeError(f"{label}: dedupe_for holds a dedupe key for a window; pass dedupe= too")
    return max(1, round(option_seconds(dedupe_for, f"{label}, dedupe_for=...") * 1000))


def check_live_options(label: str, schedule: Schedule, priority: int, dedupe: str | None) -> None:
    """A live tape is not a queue: it has no due time, order option or dedupe."""
    used = [
        name
        for name, on in (
            ("delay/at", schedule != Schedule()),
            ("priority", priority != 0),
            ("dedupe", dedupe is not None),
        )
        if on
    ]
    if used:
        raise TypeError(f"{label}: {used[0]} is for once and broadcast signals; a live tape is not a queue")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential back-off after a failed attempt: min(max, initial × 2^(n-1)) plus ≤ 10 % jitter."""

    initial_ms: int
    max_ms: int
    initial: str
    max: str

    def delay_after(self, failed_attempts: int) -> int:
        """Milliseconds before the attempt that follows the `failed_attempts`-th failure."""
        exponent = min(max(failed_attempts - 1, 0), 62)
        base = min(self.max_ms, self.initial_ms << exponent)
        return base + int(base * BACKOFF_JITTER * random.random())

    def as_dict(self) -> dict[str, str]:
        return {"initial": self.initial, "max": self.max}


def parse_backoff(label: str, backoff: Any) -> Backoff | None:
    """The checked `backoff=` of a signal declaration (None: due again at once, the seeds' physics)."""
    if backoff is None:
        return None
    if not isinstance(backoff, dict):
        raise ValueError(f'{label}: backoff must be None or a dict like {{"initial": "1s", "max": "10m"}}')
    unknown = set(backoff) - {"initial", "max"}
    if unknown:
        raise ValueError(f"{label}: unknown backoff option {sorted(unknown)[0]!r} (known: initial, max)")
    if set(backoff) != {"initial", "max"}:
        raise ValueError(f'{label}: backoff needs both "initial" and "max"')
    initial_ms, max_ms = parse_duration_ms(backoff["initial"]), parse_duration_ms(backoff["max"])
    if initial_ms is None or max_ms is None:
        raise ValueError(f'{label}: backoff initial and max must be durations like "1s" or "10m"')
    if max_ms < initial_ms:
        raise ValueError(f"{label}: backoff max ({backoff['max']}) is below initial ({backoff['initial']})")
    return Backoff(initial_ms, max_ms, backoff["initial"], backoff["max"])
