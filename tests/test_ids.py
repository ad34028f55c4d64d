"""Ids: 26 Crockford base32 characters after the prefix, unique, and ordered by creation time."""
from __future__ import annotations

import os
import re
import threading
import time

from engine import ids
from engine.ids import new_id

ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def decode(text: str) -> int:
    value = 0
    for ch in text:
        value = value * 32 + ALPHABET.index(ch)
    return value


def test_an_id_is_its_creation_millisecond_then_80_noise_bits():
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
    # Within a millisecond they count up, so one process's ids sort in the order they were made:
    # what keeps the id indexes growing at their right edge.
    assert made == sorted(made)
    stamps = [m[4:14] for m in made]
    assert len(set(stamps)) >= 10  # spans many milliseconds, each rendered alike


def test_each_millisecond_counts_from_its_own_random_start():
    firsts: dict[str, int] = {}
    for _ in range(40):
        made = new_id("run_")
        firsts.setdefault(made[4:14], decode(made[14:]))
        time.sleep(0.0015)
    starts = sorted(firsts.values())
    assert len(starts) >= 20 and len(set(starts)) == len(starts)
    assert starts[-1] - starts[0] > 2 ** 70  # spread over the range, not one counter run on
    assert all(v < 2 ** 80 for v in starts)


def test_threads_making_ids_in_one_millisecond_never_share_one():
    made: list[str] = []
    lock = threading.Lock()

    def burst() -> None:
        mine = [new_id() for _ in range(20000)]
        with lock:
            made.extend(mine)

    threads = [threading.Thread(target=burst) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == len(made) == 80000


def test_a_forked_child_does_not_count_on_from_its_parent():
    new_id()  # the parent has a millisecond under way
    parent_state = ids._current
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it starts from, and one id
        try:
            fresh = ids._current is not parent_state and ids._current.ms == -1
            os.write(write, f"{int(fresh)} {new_id()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        fresh, child_id = pipe.read().split()
    os.waitpid(pid, 0)
    assert fresh == "1"
    assert child_id != new_id()
