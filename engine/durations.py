"""Duration strings such as "30s", "24h" or "7d" (one positive integer and one unit)."""
from __future__ import annotations

import re

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PATTERN = re.compile(r"([1-9][0-9]{0,15})(ms|s|m|h|d)")


def parse_duration_ms(text: object) -> int | None:
    """Milliseconds for a duration like "24h", or None when `text` is not one."""
    if not isinstance(text, str):
        return None
    match = _PATTERN.fullmatch(text)  # not match(): "$" also matches before a final newline
    if match is None:
        return None
    return int(match.group(1)) * _UNITS_MS[match.group(2)]
