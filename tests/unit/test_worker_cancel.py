"""The cancel watcher (engine/worker/cancelling.py) and the runner's side of a stop: when a pool
reads the operators' requests to stop a running handler (never while it holds nothing; without
notices every CANCEL_POLL_S, with live notices on a notice or after CANCEL_TRUST_S), and how an
attempt it stops ends (Cancelled, even when the handler swallows the cancel; a handler that
returned first keeps its outcome). A fake monotonic clock and a store double: no database."""

from __future__ import annotations

import asyncio

import pytest
from workerkit import Clock, StoreDouble, claimed, route, runtime

from engine.store.wake import PauseNotices
from engine.worker import cancelling
from engine.worker.cancelling import CANCEL_POLL_S, CANCEL_TRUST_S, CancelWatcher
from engine.worker.running import Runner


class Handlers:
    """The runner as the watcher sees it: how many messages it holds, and what it was asked to stop."""

    def __init__(self, held: int = 1) -> None:
        self.held = held
        self.asked: list[dict[str, str]] = []

    def stop_running(self, requests):
        self.asked.append(dict(requests))
        return list(requests)


def _watcher(monkeypatch: pytest.MonkeyPatch, store: StoreDouble, handlers: Handlers) -> tuple[CancelWatcher, Clock]:
    clock = Clock()
    monkeypatch.setattr(cancelling, "time", clock)
    return CancelWatcher(store, "w1", handlers), clock


def _reads(store: StoreDouble) -> int:
    return sum(name == "cancel_requests" for name, _ in store.calls)


async def test_a_pool_holding_nothing_never_reads_the_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    store, handlers = StoreDouble(), Handlers(held=0)
    watcher, clock = _watcher(monkeypatch, store, handlers)
    for _ in range(5):
        clock.now += CANCEL_POLL_S * 10
        assert await watcher.check(woken=True) == []
    assert _reads(store) == 0


async def test_without_notices_the_requests_are_read_every_poll_while_holding(monkeypatch: pytest.MonkeyPatch) -> None:
    store, handlers = StoreDouble(), Handlers()
    watcher, clock = _watcher(monkeypatch, store, handlers)
    assert await watcher.check() == [] and _reads(store) == 1  # no request: nothing asked of the runner
    store.requests = {"m1": "wrong recipient"}
    clock.now += CANCEL_POLL_S * 0.9
    assert await watcher.check() == [] and _reads(store) == 1
    clock.now += CANCEL_POLL_S * 0.1
    assert await watcher.check() == ["m1"] and handlers.asked == [{"m1": "wrong recipient"}]
    assert watcher.wait_s() == CANCEL_POLL_S


async def test_with_live_notices_a_read_waits_for_a_notice_or_the_trust(monkeypatch: pytest.MonkeyPatch) -> None:
    listening = asyncio.Event()
    listening.set()
    store, handlers = StoreDouble(), Handlers()
    store.cancel_heard = PauseNotices(listening)
    watcher, clock = _watcher(monkeypatch, store, handlers)
    await watcher.check()
    clock.now += CANCEL_TRUST_S * 0.9
    await watcher.check()
    assert _reads(store) == 1 and watcher.wait_s() == CANCEL_TRUST_S
    store.cancel_heard.heard()  # the NOTIFY of a cancel
    await watcher.check()
    assert _reads(store) == 2
    clock.now += CANCEL_TRUST_S
    await watcher.check()
    assert _reads(store) == 3  # the net for a notice sent while the connection was away
    listening.clear()
    clock.now += CANCEL_POLL_S
    await watcher.check()
    assert _reads(store) == 4 and watcher.wait_s() == CANCEL_POLL_S


async def test_an_outage_skips_a_read_and_the_next_check_reads_again(monkeypatch: pytest.MonkeyPatch) -> None:
    store, handlers = StoreDouble(), Handlers()
    store.requests = {"m1": "x"}
    watcher, _clock = _watcher(monkeypatch, store, handlers)
    store.outage("cancel_requests")
    assert await watcher.check() == []
    assert await watcher.check() == ["m1"]  # not counted as read: no wait for the next poll


def _runner(store: StoreDouble, do) -> tuple[Runner, list, list]:
    settled, stopped = [], []
    runner = Runner(runtime(store), store, route("unit.q", do), 1, settled.append, stopped.append)
    return runner, settled, stopped


async def test_a_stopped_handler_ends_cancelled_even_when_it_swallows_the_cancel() -> None:
    started = asyncio.Event()
    seen: list[str] = []

    async def swallow(payload, fx):
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("cancelled")
        await asyncio.sleep(0)  # and returns normally, late
        seen.append("returned")

    store = StoreDouble()
    runner, settled, stopped = _runner(store, swallow)
    runner.start([claimed(1)], 0.0)
    await asyncio.wait_for(started.wait(), 5)
    assert runner.stop_running({"m1": "wrong recipient", "m9": "not here"}) == ["m1"]
    assert runner.stop_running({"m1": "again"}) == []  # cancelled once, not again
    while runner.busy():
        await asyncio.sleep(0.01)
    assert seen == ["cancelled", "returned"] and settled == []
    [out] = stopped
    assert (out.claimed.id, out.ok, out.code, out.message) == ("m1", False, "Cancelled", "wrong recipient")


async def test_a_handler_that_returned_first_keeps_its_outcome_and_its_task_runs_on_uncancelled() -> None:
    """The request comes after the handler returned: nothing to stop, the outcome stays a success.
    A stopped handler's task goes on to the next message with no cancel left pending in it."""
    gate = asyncio.Event()
    runs: list[str] = []

    async def handler(payload, fx):
        runs.append(fx.message_id)
        if fx.message_id == "m1":
            await gate.wait()
        else:
            await asyncio.sleep(0.01)  # would be cut short by a leftover cancel

    store = StoreDouble()
    runner, settled, stopped = _runner(store, handler)
    runner.start([claimed(1), claimed(2)], 0.0)  # one slot: m2 waits and runs in m1's task after it
    while runs != ["m1"]:
        await asyncio.sleep(0)
    assert runner.stop_running({"m1": "stop"}) == ["m1"]
    while runner.busy():
        await asyncio.sleep(0.01)
    assert runs == ["m1", "m2"] and [o.claimed.id for o in stopped] == ["m1"]
    assert [(o.claimed.id, o.ok) for o in settled] == [("m2", True)]
    assert runner.stop_running({"m2": "too late"}) == []  # it returned: the request is void for it


async def test_two_attempts_of_one_message_in_one_worker_each_end_on_their_own() -> None:
    """A lease ran out under a slow handler and this worker claimed the message again: both
    attempts run here at once. Each ends with its own outcome, whichever ends first."""
    release_old = asyncio.Event()
    began: list[int] = []

    async def handler(payload, fx):
        began.append(fx.attempt)
        if fx.attempt == 1:
            await release_old.wait()

    store = StoreDouble()
    settled, stopped = [], []
    runner = Runner(runtime(store), store, route("unit.q", handler), 2, settled.append, stopped.append)
    old = claimed(1)
    runner.start([old], 0.0)
    while began != [1]:
        await asyncio.sleep(0)
    runner.start([old._replace(attempts=2)], 0.0)
    while runner.held == 2:
        await asyncio.sleep(0.01)  # the newer attempt returned first
    release_old.set()
    while runner.busy():
        await asyncio.sleep(0.01)
    assert sorted((o.claimed.attempts, o.ok) for o in settled) == [(1, True), (2, True)] and stopped == []
