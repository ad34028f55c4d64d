"""Cancelling a running handler on every store shape: `ops.cancel` of a message under a live lease,
issued through ANOTHER store on the same database (another process's view), reaches the holder,
which cancels the handler's task; the attempt is recorded Cancelled with the operator's reason and
the message ends dead, replayable. The races: a handler that swallows the cancel still ends
Cancelled; one that returned before the request reached it stays delivered; the holder's
confirmation is fenced like a settle."""

from __future__ import annotations

import asyncio
import time

from workers.db import scalar

from engine import flow, on, ops, signal
from engine.ids import now_ms
from engine.store import Outcome
from engine.store.cancels import CANCELLED


class Slow:
    """A handler that waits until cancelled (or released), recording what it saw."""

    def __init__(self, swallow: bool = False) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.swallow = swallow
        self.cancelled_at: float | None = None
        self.cleaned = False
        self.runs = 0

    async def __call__(self, payload, fx) -> None:
        self.runs += 1
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled_at = time.monotonic()
            if not self.swallow:
                raise
            await asyncio.sleep(0.05)  # a late return, after the cancel
        finally:
            self.cleaned = True


async def _cancel_from_another_store(shape, msg: str, reason: str = "wrong recipient"):
    other = shape.store()
    await other.open()
    try:
        return await ops.cancel(other, "c.slow", [msg], actor="ana", reason=reason)
    finally:
        await other.close()


async def test_a_cancel_reaches_the_running_handler_and_ends_its_message_dead(shape):
    slow = Slow()
    jobs = signal.once("c.slow", retries=3)
    on(jobs, flow("w.slow", do=slow))
    async with shape.app() as app:
        msg = await app.emit(jobs, {"n": 1})
        drain = asyncio.create_task(app.drain(concurrency=2))
        await asyncio.wait_for(slow.started.wait(), 20)
        asked = time.monotonic()
        result = await _cancel_from_another_store(shape, msg)
        assert (result.cancelled, result.ids, result.requested, result.skipped) == (0, [], [msg], [])
        await asyncio.wait_for(drain, 20)
        assert slow.cancelled_at is not None and slow.cancelled_at - asked < 2.0 and slow.cleaned
        detail = await ops.show(app.store, msg)
        assert detail.status == "dead" and detail.attempts == 1
        assert [(f.code, f.message, f.attempt) for f in detail.failures] == [(CANCELLED, "wrong recipient", 1)]
        assert await scalar(shape.url, "SELECT count(*) FROM oke_cancels") == 0  # confirmed: the request is gone
        audit = (await ops.audit(app.store))[0]
        assert (audit.action, audit.ids, audit.reason) == ("cancel", [msg], "wrong recipient")

        slow.release.set()  # the replay runs to its end
        assert (await ops.replay(app.store, "c.slow", [msg], actor="ana")).replayed == 1
        await asyncio.wait_for(app.drain(), 20)
        assert (await ops.show(app.store, msg)).status == "delivered" and slow.runs == 2


async def test_a_handler_that_swallows_the_cancel_and_returns_still_ends_cancelled(shape):
    slow = Slow(swallow=True)
    jobs = signal.once("c.slow", retries=3)
    on(jobs, flow("w.slow", do=slow))
    async with shape.app() as app:
        msg = await app.emit(jobs, {"n": 1})
        drain = asyncio.create_task(app.drain(concurrency=1))
        await asyncio.wait_for(slow.started.wait(), 20)
        assert (await _cancel_from_another_store(shape, msg)).requested == [msg]
        await asyncio.wait_for(drain, 20)
        assert slow.cancelled_at is not None  # it returned normally after the cancel
        detail = await ops.show(app.store, msg)
        assert detail.status == "dead"
        assert [f.code for f in detail.failures] == [CANCELLED]
        runs = await scalar(shape.url, "SELECT count(*) FROM oke_runs WHERE status = 'succeeded'")
        assert runs == 0


async def test_a_handler_that_returned_before_the_request_stays_delivered(shape):
    """The request reaches a holder whose handler already returned: its outcome settles as it was
    (delivered), the request is void, and the next cancel prunes it."""
    jobs = signal.once("c.slow", retries=3)
    on(jobs, flow("w.slow", do=lambda payload, fx: None))
    async with shape.app() as app:
        msg = await app.emit(jobs, {"n": 1})
        [claimed] = await app.store.claim(["c.slow"], "w1", 60_000, 1)
        # the handler returned; its outcome is not settled yet when the operator's cancel commits
        assert (await ops.cancel(app.store, "c.slow", [msg], actor="ana")).requested == [msg]
        at = now_ms()
        assert await app.store.settle("w1", [Outcome(claimed, "run_1", "w.slow", True, at, at)]) == [True]
        assert (await ops.show(app.store, msg)).status == "delivered"
        again = await ops.cancel(app.store, "c.slow", [msg], actor="ana")
        assert (again.requested, [(s.id, s.status) for s in again.skipped]) == ([], [(msg, "delivered")])
        assert await scalar(shape.url, "SELECT count(*) FROM oke_cancels") == 0  # pruned


async def test_the_holders_confirmation_is_fenced_like_a_settle(shape):
    """An attempt whose lease another worker took meanwhile is not ended by the old holder."""
    jobs = signal.once("c.slow", retries=3)
    on(jobs, flow("w.slow", do=lambda payload, fx: None))
    async with shape.app() as app:
        msg = await app.emit(jobs, {"n": 1})
        [first] = await app.store.claim(["c.slow"], "w1", 1, 1)  # a lease that runs out at once
        await asyncio.sleep(0.05)
        [second] = await app.store.claim(["c.slow"], "w2", 60_000, 1)
        assert (first.id, second.id, second.attempts) == (msg, msg, 2)
        at = now_ms()
        late = Outcome(first, "run_1", "w.slow", False, at, at, CANCELLED, "stop")
        assert await app.store.confirm_cancelled("w1", [late]) == [False]
        detail = await ops.show(app.store, msg)
        assert (detail.status, detail.attempts, detail.failures) == ("inflight", 2, [])
        now = Outcome(second, "run_2", "w.slow", False, at, at, CANCELLED, "stop")
        assert await app.store.confirm_cancelled("w2", [now]) == [True]
        assert (await ops.show(app.store, msg)).status == "dead"
