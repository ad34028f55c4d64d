"""Time-ordered unique ids: sortable by creation, unique across processes and machines."""

from __future__ import annotations

import itertools
import os
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case
# Every 10-bit value as its two base32 characters: an id's noise costs 8 lookups, not 16 divmods (ids are
# made for every message and every run, on the hot path).
_PAIRS = [_ALPHABET[v >> 5] + _ALPHABET[v & 31] for v in range(1024)]
# Below 2**79 + 2**78: a counter started this far from the top cannot reach 2**80 in this process's
# life (2**78 ids at a million a second is nine billion years).
_NOISE_START_BELOW = 2**79 + 2**78


def base32(number: int, width: int) -> str:
    """`number` as `width` Crockford base32 characters, most significant first (zero-padded)."""
    chars = []
    for _ in range(width):
        number, rest = divmod(number, 32)
        chars.append(_ALPHABET[rest])
    return "".join(reversed(chars))


def _random_counter() -> itertools.count[int]:
    return itertools.count(int.from_bytes(os.urandom(10), "big") % _NOISE_START_BELOW)


# The 80 noise bits of every id this process makes: one counter from a random start, counted up
# across milliseconds. `next()` on itertools.count is atomic, so no two threads share a value, and
# ids made in a row sort in the order they were made. Drawing a fresh start each millisecond (as
# before) cost an urandom call and a new counter on the first id of every millisecond, which after
# an idle spell is every emit's and every run's (docs/design/idle-path.md).
# Two processes collide only if their counters, 2**78 apart on average, meet in one millisecond.
_noise = _random_counter()
_last_stamp: tuple[int, str] = (-1, "")  # (ms, its base32): one tuple, so threads see a matching pair


def _fork_child() -> None:
    """A forked child must not count on from its parent's start: both would make the same ids."""
    global _noise, _last_stamp
    _noise = _random_counter()
    _last_stamp = (-1, "")


os.register_at_fork(after_in_child=_fork_child)


def new_id(prefix: str = "") -> str:
    """A ULID-like id: 48 bits of epoch ms then 80 bits counted up from a random start, with an
    optional prefix."""
    global _last_stamp
    ms = int(time.time() * 1000)
    last = _last_stamp
    if last[0] == ms:
        stamp = last[1]
    else:
        stamp = base32(ms, 10)  # once a millisecond
        _last_stamp = (ms, stamp)
    noise = next(_noise)
    pairs = _PAIRS
    return (
        f"{prefix}{stamp}{pairs[noise >> 70]}{pairs[(noise >> 60) & 1023]}"
        f"{pairs[(noise >> 50) & 1023]}{pairs[(noise >> 40) & 1023]}{pairs[(noise >> 30) & 1023]}"
        f"{pairs[(noise >> 20) & 1023]}{pairs[(noise >> 10) & 1023]}{pairs[noise & 1023]}"
    )


def now_ms() -> int:
    """Wall-clock epoch milliseconds, the unit of every time in the store and in JSON."""
    return int(time.time() * 1000)
