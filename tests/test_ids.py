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


def test_a_process_counts_on_across_milliseconds_from_a_random_start():
    made = []
    for _ in range(40):
        made.append(new_id("run_"))
        time.sleep(0.0015)
    assert len({m[4:14] for m in made}) >= 20  # many milliseconds
    noise = [decode(m[14:]) for m in made]
    # One counter: each id's noise is above the one before, whatever its millisecond, so ids made
    # in a row sort in the order they were made even when the clock's millisecond repeats.
    assert noise == sorted(noise) and len(set(noise)) == len(noise)
    assert noise[-1] - noise[0] == len(noise) - 1  # counted up by one an id, nothing drawn afresh
    assert all(v < 2 ** 80 for v in noise)


def test_processes_start_their_counters_far_apart():
    starts = set()
    for _ in range(8):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.write(write, new_id()[10:].encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            starts.add(decode(pipe.read()))
        os.waitpid(pid, 0)
    assert len(starts) == 8
    ordered = sorted(starts)
    # random starts over [0, 2**79 + 2**78): eight of them are never within 2**50 of each other (odds of a miss: about 1 in 10 million)
    assert min(b - a for a, b in zip(ordered, ordered[1:])) > 2 ** 50


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
    new_id()  # the parent's counter is under way
    parent_counter = ids._noise
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it starts from, and one id
        try:
            fresh = ids._noise is not parent_counter
            os.write(write, f"{int(fresh)} {new_id()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        fresh, child_id = pipe.read().split()
    os.waitpid(pid, 0)
    assert fresh == "1"
    assert child_id != new_id()
