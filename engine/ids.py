"""Time-ordered unique ids: sortable by creation, unique across processes and machines."""

from __future__ import annotations

import itertools
import os
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case
# Every 10-bit value as its two base32 characters: an id costs 8 lookups, not 26 divmods (ids are
# made for every message and every run, on the hot path).
_PAIRS = [_ALPHABET[v >> 5] + _ALPHABET[v & 31] for v in range(1024)]


def base32(number: int, width: int) -> str:
    """`number` as `width` Crockford base32 characters, most significant first (zero-padded)."""
    chars = []
    for _ in range(width):
        number, rest = divmod(number, 32)
        chars.append(_ALPHABET[rest])
    return "".join(reversed(chars))


class _Millisecond:
    """The current millisecond's stamp and where its ids' 80 noise bits go next.

    Ids of one millisecond count up from a random start instead of drawing fresh noise each: one
    urandom call a millisecond, not one an id (1.0 → 0.6 µs an id; two ids a message), and ids
    made in a row sort in the order they were made. `next()` on itertools.count is atomic, so
    threads making ids in one millisecond never share a value.
    """

    __slots__ = ("ms", "stamp", "counter")

    def __init__(self, ms: int) -> None:
        self.ms = ms
        self.stamp = base32(ms, 10)
        # Below 2**79 + 2**78: a counter this far from the top cannot reach 2**80 in one millisecond.
        self.counter = itertools.count(int.from_bytes(os.urandom(10), "big") % (2**79 + 2**78))


_current = _Millisecond(-1)


def _forget_millisecond() -> None:
    """A forked child must not count on from its parent's start: both would make the same ids."""
    global _current
    _current = _Millisecond(-1)


os.register_at_fork(after_in_child=_forget_millisecond)


def new_id(prefix: str = "") -> str:
    """A ULID-like id: 48 bits of epoch ms then 80 bits counted up from a random start, with an
    optional prefix."""
    global _current
    ms = int(time.time() * 1000)
    current = _current
    if current.ms != ms:
        current = _current = _Millisecond(ms)
    noise = next(current.counter)
    pairs = _PAIRS
    return (
        f"{prefix}{current.stamp}{pairs[noise >> 70]}{pairs[(noise >> 60) & 1023]}"
        f"{pairs[(noise >> 50) & 1023]}{pairs[(noise >> 40) & 1023]}{pairs[(noise >> 30) & 1023]}"
        f"{pairs[(noise >> 20) & 1023]}{pairs[(noise >> 10) & 1023]}{pairs[noise & 1023]}"
    )


def now_ms() -> int:
    """Wall-clock epoch milliseconds, the unit of every time in the store and in JSON."""
    return int(time.time() * 1000)
