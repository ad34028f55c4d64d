"""The settler (engine/worker/settling.py): outcomes that pile up during a settle go in the next
one; where the store settles inside a claim's transaction a claim coming soon carries them, and
gives them back when it fails; an outage is retried after a growing back-off, and given up only
at a stop once the back-off is at its longest. Store double, no database."""

from __future__ import annotations

import asyncio
import logging

import pytest
from workerkit import StoreDouble, claimed, outcome, route, runtime

from engine.worker import MAX_BACKOFF_S, WorkerPool, settling
from engine.worker.settling import Settler
from engine.worker.waiting import FIRST_BACKOFF_S


async def _until(check: object) -> None:
    async with asyncio.timeout(5):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0)


async def test_outcomes_that_finish_during_a_settle_go_in_the_next_one_together() -> None:
    store = StoreDouble()
    store.gate = asyncio.Event()
    settler = Settler(store, "w1", lambda: False)
    task = asyncio.create_task(settler.run())
    settler.add(outcome(1))
    await _until(lambda: store.calls)
    for n in (2, 3, 4):
        settler.add(outcome(n))
    store.gate.set()
    await _until(lambda: len(store.settled) == 4)
    settler.stop()
    await asyncio.wait_for(task, 5)
    assert store.calls == [("settle", ["m1"]), ("settle", ["m2", "m3", "m4"])]


async def test_a_claim_coming_soon_takes_the_outcomes_and_gives_them_back_when_it_fails() -> None:
    store = StoreDouble(settles_with_claims=True)
    settler = Settler(store, "w1", lambda: False)
    task = asyncio.create_task(settler.run())
    settler.add(outcome(1))
    settler.add(outcome(2))
    lent = settler.lend_to_claim()
    assert [o.claimed.id for o in lent] == ["m1", "m2"] and settler.busy()
    for _ in range(5):
        await asyncio.sleep(0)
    assert store.calls == []  # the claim carries them: the settler leaves them
    settler.take_back(lent)  # the claim failed
    settler.claim_over()
    assert settler.count == 1 and settler.busy()
    for _ in range(5):
        await asyncio.sleep(0)
    assert store.calls == []  # the lane will claim again, carrying them once more
    settler.claim_idle()  # no claim is coming after all: the settler writes them itself
    await _until(lambda: len(store.settled) == 2)
    settler.stop()
    await asyncio.wait_for(task, 5)
    assert store.calls == [("settle", ["m1", "m2"])] and not settler.busy()


def test_a_store_that_cannot_settle_with_claims_lends_nothing() -> None:
    settler = Settler(StoreDouble(settles_with_claims=False), "w1", lambda: False)
    settler.add(outcome(1))
    assert settler.lend_to_claim() == [] and settler.busy()


async def test_in_a_pool_outcomes_ride_with_the_next_claim_and_survive_its_failure() -> None:
    """A pool on a store that settles with claims: outcomes reach the store inside the next claim;
    that claim fails once (an outage: nothing settled), and every outcome is still settled exactly
    once, by the retried claim or the settler."""
    store = StoreDouble([claimed(n) for n in range(1, 7)], settles_with_claims=True)
    store.claim_rows_max = 2  # three claims of two
    store.outage("settle_and_claim")

    async def handle(payload: object, fx: object) -> None:
        return None

    async with asyncio.timeout(10):
        await WorkerPool(runtime(store), route("unit.q", handle), 2).run(until_idle=True)
    assert sorted(o.claimed.seq for o in store.settled) == list(range(1, 7))
    carried = [ids for name, ids in store.calls if name == "settle_and_claim"]
    assert carried[0] == carried[1] and carried[0], store.calls  # the failed claim's outcomes, carried again


async def test_an_outage_is_retried_after_a_doubling_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float | None] = []

    async def no_wait(*events: asyncio.Event, timeout: float | None = None) -> None:
        waits.append(timeout)

    monkeypatch.setattr(settling, "wait_any", no_wait)
    store = StoreDouble()
    store.outage("settle", 3)
    settler = Settler(store, "w1", lambda: False)
    task = asyncio.create_task(settler.run())
    settler.add(outcome(1))
    await _until(lambda: store.settled)
    settler.stop()
    await asyncio.wait_for(task, 5)
    assert waits == [FIRST_BACKOFF_S, 2 * FIRST_BACKOFF_S, 4 * FIRST_BACKOFF_S]
    assert [o.claimed.id for o in store.settled] == ["m1"]


async def test_at_a_stop_the_settler_gives_up_only_after_the_longest_back_off_failed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    waits: list[float | None] = []

    async def no_wait(*events: asyncio.Event, timeout: float | None = None) -> None:
        waits.append(timeout)

    monkeypatch.setattr(settling, "wait_any", no_wait)
    store = StoreDouble()
    store.outage("settle", 100)
    settler = Settler(store, "w1", lambda: False)
    settler.add(outcome(1))
    settler.add(outcome(2))
    settler.stop()
    with caplog.at_level(logging.ERROR, logger="engine.worker"):
        await asyncio.wait_for(settler.run(), 5)
    # 0.05 s doubling up to 3.2 s; the attempt after that last wait failed too, with the back-off
    # now at its ceiling: given up (at a stop only, and never right after a wait)
    assert waits == [FIRST_BACKOFF_S * 2**n for n in range(7)] and 2 * waits[-1] > MAX_BACKOFF_S
    assert [name for name, _ in store.calls] == ["settle"] * 8
    assert not settler.busy()
    [given_up] = [r.getMessage() for r in caplog.records if "giving up" in r.getMessage()]
    assert "m1 attempt 1, m2 attempt 1" in given_up
