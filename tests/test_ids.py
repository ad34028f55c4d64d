"""Ids: 26 Crockford base32 characters after the prefix, unique, and ordered by creation time."""
from __future__ import annotations

import re
import time

from engine.ids import new_id

ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def decode(text: str) -> int:
    value = 0
    for ch in text:
        value = value * 32 + ALPHABET.index(ch)
    return value


def test_an_id_is_its_creation_millisecond_then_80_random_bits():
    before = int(time.time() * 1000)
    made = new_id("run_")
    after = int(time.time() * 1000)
    assert re.fullmatch(r"run_[0-9a-hjkmnp-tv-z]{26}", made)
    assert before <= decode(made[4:14]) <= after
    assert decode(made[14:]) < 2 ** 80


def test_ids_are_unique_and_sort_by_creation():
    made = []
    for _ in range(50):
        made += [new_id("msg_") for _ in range(2000)]
        time.sleep(0.001)
    assert len(set(made)) == len(made)
    stamps = [m[4:14] for m in made]
    assert stamps == sorted(stamps)
    assert len(set(stamps)) >= 10  # spans many milliseconds, each rendered alike
    noise = [decode(m[14:]) for m in made]
    assert max(noise) >= 2 ** 79 and min(noise) < 2 ** 76  # the whole 80-bit range is used
