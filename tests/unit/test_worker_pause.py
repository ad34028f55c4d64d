"""The pause watcher (engine/worker/pausing.py): when a pool re-reads the paused set before a claim.
Without pause notices (SQLite) a read is trusted PAUSE_REFRESH_S; with live notices (PostgreSQL)
until a notice or a reconnect moves their epoch, or PAUSE_TRUST_S; a read lost to an outage keeps
the last set but is not trusted. A fake monotonic clock and a store double: no database."""

from __future__ import annotations

import asyncio

import pytest
from workerkit import Clock, StoreDouble, route

from engine.store.wake import PauseNotices
from engine.worker import pausing
from engine.worker.pausing import PAUSE_REFRESH_S, PAUSE_TRUST_S, PauseWatcher


def _watcher(monkeypatch: pytest.MonkeyPatch, store: StoreDouble) -> tuple[PauseWatcher, Clock]:
    clock = Clock()
    monkeypatch.setattr(pausing, "time", clock)
    routes = route("unit.a", lambda payload, fx: None) | route("unit.b", lambda payload, fx: None)
    return PauseWatcher(store, routes), clock


def _reads(store: StoreDouble) -> int:
    return sum(name == "paused_signals" for name, _ in store.calls)


async def test_without_notices_the_paused_set_is_read_again_after_the_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    store = StoreDouble()
    watcher, clock = _watcher(monkeypatch, store)
    assert await watcher.claimable_queues() == ["unit.a", "unit.b"] and _reads(store) == 1
    store.paused = frozenset({"unit.a"})
    clock.now += PAUSE_REFRESH_S * 0.9
    assert await watcher.claimable_queues() == ["unit.a", "unit.b"] and _reads(store) == 1
    clock.now += PAUSE_REFRESH_S * 0.1
    assert await watcher.claimable_queues() == ["unit.b"] and _reads(store) == 2
    assert watcher.claimable == ["unit.b"]


async def test_with_live_notices_a_read_holds_until_a_notice_or_the_trust_runs_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listening = asyncio.Event()
    listening.set()
    store = StoreDouble()
    store.notices = PauseNotices(listening)
    watcher, clock = _watcher(monkeypatch, store)
    await watcher.claimable_queues()
    clock.now += PAUSE_TRUST_S * 0.9
    await watcher.claimable_queues()
    assert _reads(store) == 1  # no notice: no read on the claim path
    store.notices.heard()
    await watcher.claimable_queues()
    assert _reads(store) == 2
    clock.now += PAUSE_TRUST_S
    await watcher.claimable_queues()
    assert _reads(store) == 3  # the net for a pause written by hand with SQL
    listening.clear()  # the LISTEN connection is down: back to the refresh
    clock.now += PAUSE_REFRESH_S
    await watcher.claimable_queues()
    assert _reads(store) == 4


async def test_a_read_lost_to_an_outage_keeps_the_last_set_and_reads_again_at_the_next_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = StoreDouble()
    store.paused = frozenset({"unit.a"})
    watcher, clock = _watcher(monkeypatch, store)
    assert await watcher.claimable_queues() == ["unit.b"]
    clock.now += PAUSE_REFRESH_S
    store.outage("paused_signals")
    store.paused = frozenset()
    assert await watcher.claimable_queues() == ["unit.b"]
    clock.now += 0.001
    assert await watcher.claimable_queues() == ["unit.a", "unit.b"]  # not trusted: read again at once
    assert _reads(store) == 3


async def test_an_idle_lane_polls_no_longer_than_a_refresh_while_something_is_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = StoreDouble()
    watcher, _clock = _watcher(monkeypatch, store)
    await watcher.claimable_queues()
    assert watcher.idle_poll_s(30.0) == 30.0
    store.paused = frozenset({"unit.b"})
    _clock.now += PAUSE_REFRESH_S
    await watcher.claimable_queues()
    assert watcher.idle_poll_s(30.0) == PAUSE_REFRESH_S and watcher.idle_poll_s(0.1) == 0.1
