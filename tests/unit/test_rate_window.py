"""The flow limits' arithmetic with a fake clock (engine/store/sql/gates.py): the sliding window
log admits at most N starts in any window of W ms, says when the next one fits, and a gate takes
the tighter of its concurrency and rate limits; rates and limits are checked at declaration."""

from __future__ import annotations

import random

import pytest

from engine import signal
from engine.durations import parse_rate
from engine.store.sql.gates import (
    CONCURRENCY_POLL_MS,
    Gate,
    GateRoom,
    SlidingWindowLog,
    expand,
    gate_room,
    held_back_ms,
    needs_starts,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


def most_in_any_window(starts: list[int], window_ms: int) -> int:
    """The most starts inside any half-open interval [t, t + window_ms)."""
    starts = sorted(starts)
    best, lo = 0, 0
    for hi, at in enumerate(starts):
        while starts[lo] <= at - window_ms:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def test_a_full_window_admits_nothing_until_its_oldest_start_leaves():
    clock = FakeClock()
    log = SlidingWindowLog(3, 1000, [])
    burst = clock.now
    assert log.admit(burst, 5) == 3  # a burst of N at once is allowed
    assert log.admit(clock.advance(999), 1) == 0  # still inside the window of the first three
    assert log.fits_at(clock.now) == burst + 1000
    assert log.admit(clock.advance(1), 2) == 2  # W after the burst it has left: [t, t + W) holds N
    assert log.admit(clock.now, 2) == 1
    assert log.fits_at(clock.now) == clock.now + 1000


def test_random_arrivals_never_put_more_than_n_starts_in_any_window():
    rng = random.Random(39)
    for count, window_ms in [(1, 100), (5, 1000), (7, 333)]:
        clock, log, started = FakeClock(), SlidingWindowLog(count, window_ms, []), []
        for _ in range(2000):
            wanted = rng.randint(0, 4)
            started += [clock.now] * log.admit(clock.now, wanted)
            clock.advance(rng.choice([0, 1, 7, 50, window_ms // 3, window_ms]))
        assert most_in_any_window(started, window_ms) == count  # reached, never exceeded


def test_a_log_read_back_with_old_starts_counts_only_the_window():
    log = SlidingWindowLog(2, 1000, [10, 20, 5_000, 5_500])  # old rows not yet deleted
    assert log.room(5_999) == 0
    assert log.fits_at(5_999) == 6_000
    assert log.room(6_000) == 1


def test_a_gate_takes_the_tighter_limit_and_says_which_held_back():
    gate = Gate("q", "q", 4, 10, 60_000)
    assert gate_room(gate, 0, 8, running=1, starts=[]) == GateRoom(3, "concurrency", None)
    assert gate_room(gate, 100, 8, running=0, starts=[50] * 9) == GateRoom(1, "rate", 60_050)
    assert gate_room(gate, 0, 2, running=1, starts=[]) == GateRoom(2, None, None)  # nothing held back
    assert gate_room(Gate("q", "q", 2, None, None), 0, 3, running=5, starts=[]).allowed == 0


def test_an_idle_lane_sleeps_until_the_first_limit_may_let_more_through():
    rate, conc = GateRoom(0, "rate", 5_000), GateRoom(0, "concurrency", None)
    assert held_back_ms([(rate, True)], now=4_000) == 1_000
    assert held_back_ms([(rate, True), (conc, True)], now=0) == CONCURRENCY_POLL_MS
    assert held_back_ms([(rate, False), (GateRoom(3, None, None), True)], now=0) is None  # nothing waits


@pytest.mark.parametrize(
    "text, parsed", [("100/1m", (100, 60_000)), ("5/s", (5, 1_000)), ("1/250ms", (1, 250)), ("7/2h", (7, 7_200_000))]
)
def test_rates_parse(text, parsed):
    assert parse_rate(text) == parsed


@pytest.mark.parametrize("bad", ["0/1m", "x", "10", "10/0s", "-1/1s", "1/1y", " 5/s", "5/s\n", "1000001/1s", 5, None])
def test_bad_rates_do_not_parse(bad):
    assert parse_rate(bad) is None


@pytest.mark.parametrize(
    "options, words",
    [
        ({"concurrency": 0}, ["tasks.lim", "concurrency", "0"]),
        ({"concurrency": -3}, ["tasks.lim", "-3"]),
        ({"concurrency": 2.5}, ["tasks.lim", "2.5"]),
        ({"concurrency": True}, ["tasks.lim", "True"]),
        ({"rate": "0/1m"}, ["tasks.lim", "rate", "0/1m"]),
        ({"rate": "lots"}, ["tasks.lim", "lots"]),
        ({"rate": "10/0s"}, ["tasks.lim", "10/0s"]),
    ],
)
def test_a_bad_limit_is_a_value_error_at_declaration_naming_signal_and_value(options, words):
    with pytest.raises(ValueError) as err:
        signal.once("tasks.lim", **options)
    assert all(w in str(err.value) for w in words)


def test_limits_are_for_queue_signals_only():
    with pytest.raises(TypeError, match="once and broadcast"):
        signal.live("feed.lim", concurrency=2)
    declared = signal.broadcast("fan.lim", concurrency=2, rate="3/s")
    assert (declared.concurrency, declared.rate, declared.limited) == (2, "3/s", True)


def test_an_override_replaces_each_limit_it_names_and_a_row_written_by_hand_badly_does_not():
    from engine.store.limits import Limits, Override, in_force

    assert in_force(5, "10/1m", None) == Limits(5, "10/1m", False)
    assert in_force(5, "10/1m", Override(2, None)) == Limits(2, "10/1m", True)
    assert in_force(5, "10/1m", Override(0, "none")) == Limits(None, None, True)  # lifted
    assert in_force(None, None, Override(None, "3/s")) == Limits(None, "3/s", True)
    assert in_force(5, "10/1m", Override(-4, "lots")) == Limits(5, "10/1m", True)  # by hand: ignored


def test_a_window_with_room_is_counted_not_read_start_by_start() -> None:
    """A claim sums the window's starts; it reads them one by one only when the sum may not leave
    room for what it wants, and then the answer is the one the full log gives."""
    gate = Gate("q", "q", None, 10, 60_000)
    assert not needs_starts(gate, started=2, wanted=8)  # 8 fit beside 2 of 10: a sum is enough
    assert gate_room(gate, 100, 8, running=0, starts=[], started=2) == GateRoom(8, None, None)
    assert needs_starts(gate, started=9, wanted=8)
    log = [50] * 9
    assert gate_room(gate, 100, 8, running=0, starts=log, started=9) == gate_room(gate, 100, 8, 0, log)
    assert gate_room(gate, 100, 8, running=0, starts=log, started=9) == GateRoom(1, "rate", 60_050)
    assert expand([(50, 3), (70, 1)]) == [50, 50, 50, 70]
    assert not needs_starts(Gate("q", "q", 3, None, None), started=0, wanted=99)  # no rate: nothing to read
