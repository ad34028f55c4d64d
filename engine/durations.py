"""Duration strings such as "30s", "24h" or "7d" (one positive integer and one unit)."""

from __future__ import annotations

import re

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
