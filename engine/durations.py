"""Duration strings such as "30s", "24h" or "7d" (one positive integer and one unit)."""

from __future__ import annotations

import math
import re
from datetime import timedelta

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PATTERN = re.compile(r"([1-9][0-9]{0,15})(ms|s|m|h|d)")
# The store computes `now - duration` in 64-bit integers; 2^53 - 1 ms (about 285,000 years) keeps
# that in range (and exact in JSON) where "9999999999999999d" would overflow the driver.
MAX_DURATION_MS = 2**53 - 1


def parse_duration_ms(text: object) -> int | None:
    """Milliseconds for a duration like "24h", or None when `text` is not one (or is too long)."""
    if not isinstance(text, str):
        return None
    match = _PATTERN.fullmatch(text)  # not match(): "$" also matches before a final newline
    if match is None:
        return None
    ms = int(match.group(1)) * _UNITS_MS[match.group(2)]
    return ms if ms <= MAX_DURATION_MS else None


# A rate limit logs each start of its window (engine/store/sql/gates.py): at most this many.
MAX_RATE_COUNT = 1_000_000
_RATE = re.compile(r"([1-9][0-9]{0,6})/([1-9][0-9]{0,15})?(ms|s|m|h|d)")


def parse_rate(text: object) -> tuple[int, int] | None:
    """(N, window ms) for a rate like "100/1m" or "5/s" (one unit: "/1s"), or None when `text` is
    not one, N is 0 or above MAX_RATE_COUNT, or the window is out of range."""
    if not isinstance(text, str):
        return None
    match = _RATE.fullmatch(text)
    if match is None:
        return None
    count = int(match.group(1))
    window_ms = parse_duration_ms(f"{match.group(2) or 1}{match.group(3)}")
    if count > MAX_RATE_COUNT or window_ms is None:
        return None
    return count, window_ms


def option_seconds(value: object, what: str) -> float:
    """Seconds for a duration option given as "5s", a `timedelta`, or seconds as a number.

    Zero, negative or unparsable is a ValueError, any other type a TypeError, each naming `what`
    (e.g. 'flow("x", timeout=...)'), so a bad option fails where it is written.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float, timedelta)):
        raise TypeError(f'{what}: a duration is "5s", a timedelta or seconds as a number, got {value!r}')
    if isinstance(value, str):
        ms = parse_duration_ms(value)
        if ms is None:
            raise ValueError(f'{what}: "{value}" is not a duration: use a positive integer and a unit (ms, s, m, h, d)')
        return ms / 1000
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not math.isfinite(seconds) or seconds <= 0 or seconds * 1000 > MAX_DURATION_MS:
        raise ValueError(f"{what}: a duration must be positive and finite, got {value!r}")
    return seconds
