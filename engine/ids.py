"""Time-ordered unique ids: sortable by creation, unique across processes and machines."""
from __future__ import annotations

import os
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case
# Every 10-bit value as its two base32 characters: an id costs 8 lookups, not 26 divmods (ids are
# made for every message and every run, on the hot path).
_PAIRS = [_ALPHABET[v >> 5] + _ALPHABET[v & 31] for v in range(1024)]
_last_stamp: tuple[int, str] = (-1, "")


def base32(number: int, width: int) -> str:
    """`number` as `width` Crockford base32 characters, most significant first (zero-padded)."""
    chars = []
    for _ in range(width):
        number, rest = divmod(number, 32)
        chars.append(_ALPHABET[rest])
    return "".join(reversed(chars))


def new_id(prefix: str = "") -> str:
    """A ULID-like id: 48 bits of epoch ms then 80 random bits, with an optional prefix."""
    global _last_stamp
    ms = int(time.time() * 1000)
    if _last_stamp[0] != ms:
        _last_stamp = (ms, base32(ms, 10))
    noise = int.from_bytes(os.urandom(10), "big")
    pairs = _PAIRS
    return (f"{prefix}{_last_stamp[1]}{pairs[noise >> 70]}{pairs[(noise >> 60) & 1023]}"
            f"{pairs[(noise >> 50) & 1023]}{pairs[(noise >> 40) & 1023]}{pairs[(noise >> 30) & 1023]}"
            f"{pairs[(noise >> 20) & 1023]}{pairs[(noise >> 10) & 1023]}{pairs[noise & 1023]}")


def now_ms() -> int:
    """Wall-clock epoch milliseconds, the unit of every time in the store and in JSON."""
    return int(time.time() * 1000)
