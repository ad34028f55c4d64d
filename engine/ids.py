"""Time-ordered unique ids: sortable by creation, unique across processes and machines."""
from __future__ import annotations

import os
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def _b32(number: int, width: int) -> str:
    chars = []
    for _ in range(width):
        number, rest = divmod(number, 32)
        chars.append(_ALPHABET[rest])
    return "".join(reversed(chars))


def new_id(prefix: str = "") -> str:
    """A ULID-like id: 48 bits of epoch ms then 80 random bits, with an optional prefix."""
    stamp = _b32(int(time.time() * 1000), 10)
    noise = _b32(int.from_bytes(os.urandom(10), "big"), 16)
    return f"{prefix}{stamp}{noise}"


def now_ms() -> int:
    """Wall-clock epoch milliseconds, the unit of every time in the store and in JSON."""
    return int(time.time() * 1000)
