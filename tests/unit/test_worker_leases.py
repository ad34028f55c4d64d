"""The renew-ahead rule (engine/worker/claim_ahead.py `WaitingLine`): a message claimed ahead has
its lease renewed each time it has waited AHEAD_LEASE_SHARE of it for a slot, the earliest batch
due first; one whose renewal finds it lost is dropped from the line (not run here) and the runner
is told. A fake monotonic clock and a store double: no database."""

from __future__ import annotations

import asyncio

import pytest
from workerkit import Clock, StoreDouble, claimed

from engine.worker import AHEAD_LEASE_SHARE, claim_ahead
from engine.worker.claim_ahead import WaitingLine
from engine.worker.leases import start_by

LEASE_MS = 10_000
SHARE_S = LEASE_MS / 1000 * AHEAD_LEASE_SHARE


def _line(monkeypatch: pytest.MonkeyPatch, store: StoreDouble) -> tuple[WaitingLine, Clock, list[str]]:
    clock = Clock()
    monkeypatch.setattr(claim_ahead, "time", clock)
    lost: list[str] = []
    return WaitingLine(store, "w1", LEASE_MS, lambda: lost.append("lost")), clock, lost


async def _renewals(store: StoreDouble, count: int) -> None:
    async with asyncio.timeout(5):
        while sum(name == "renew" for name, _ in store.calls) < count:
            await asyncio.sleep(0)


async def test_a_batch_is_renewed_once_it_has_waited_its_share_of_the_lease_and_not_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = StoreDouble()
    line, clock, _lost = _line(monkeypatch, store)
    line.add([claimed(1), claimed(2)], clock.now)
    renewer = asyncio.create_task(line.renew_due())
    try:
        await asyncio.sleep(0.05)
        assert store.calls == []  # not due: half a lease away by the clock (the renewer sleeps that long)
    finally:
        renewer.cancel()
    clock.now += SHARE_S
    renewer = asyncio.create_task(line.renew_due())
    try:
        await _renewals(store, 2)
        await asyncio.sleep(0.01)
        assert store.calls == [("renew", "m1"), ("renew", "m2")]
        assert line.next() == (claimed(1), start_by(clock.now, LEASE_MS))  # starts on the renewed lease
    finally:
        renewer.cancel()


async def test_the_earliest_batch_of_all_is_renewed_first_not_the_head_of_the_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = StoreDouble()
    line, clock, _lost = _line(monkeypatch, store)
    line.add([claimed(1)], clock.now)  # due in half a lease
    line.add([claimed(2)], clock.now - SHARE_S)  # due now: claimed a share of a lease ago
    renewer = asyncio.create_task(line.renew_due())
    try:
        await _renewals(store, 1)
        await asyncio.sleep(0.01)
        assert store.calls == [("renew", "m2")]
    finally:
        renewer.cancel()


async def test_a_message_whose_lease_was_lost_while_it_waited_is_dropped_and_the_runner_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = StoreDouble()
    store.holds = False
    line, clock, lost = _line(monkeypatch, store)
    line.add([claimed(1), claimed(2)], clock.now - SHARE_S)
    line.add([claimed(3)], clock.now)
    renewer = asyncio.create_task(line.renew_due())
    try:
        await _renewals(store, 2)
        await asyncio.sleep(0.01)
    finally:
        renewer.cancel()
    assert lost == ["lost", "lost"]
    assert line.next() is not None and line.next() is None  # only m3 is left to start
    assert line.take_unstarted() == []


def test_a_stop_hands_back_only_messages_neither_started_nor_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    line, clock, _lost = _line(monkeypatch, StoreDouble())
    line.add([claimed(1), claimed(2), claimed(3)], clock.now)
    assert line.next() == (claimed(1), start_by(clock.now, LEASE_MS))
    assert line.take_unstarted() == [claimed(2), claimed(3)] and not line
