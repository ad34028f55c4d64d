"""A claim lane: claim (carrying pending outcomes where the store settles with claims), start the
batch, and when the queues are empty wait for work, or (drain) tell whether everything is idle."""

from __future__ import annotations

import asyncio
import time

from ..store import Claimed
from ..store.outage import is_outage
from ..store.wake import Waker
from .averages import ewma
from .handoff import Handoff
from .pausing import Pausing
from .settling import Settling
from .state import log
from .waiting import IDLE_POLL_S, Backoff, wait_any


class Claiming(Handoff, Settling, Pausing):
    """The claim lanes of a pool."""

    async def _claim_loop(self, waker: Waker, until_idle: bool) -> None:
        """One lane, until stopped, or (`until_idle`) until nothing is eligible and nothing runs."""
        stop = self.runtime.stop
        backoff = Backoff()
        while not stop.is_set():
            # Before the size: from the size on, nothing awaits until `requested` counts it, so two
            # lanes never both ask for the same free slots.
            queues = await self._claimable_queues()
            size = self._claim_size()
            if size <= 0:
                # No claim until a slot frees (the slots and the claimed-ahead messages are all
                # taken): outcomes must not wait for one, they go to the settler meanwhile.
                self._claim_idle()
                self.slot_free.clear()
                await wait_any(self.slot_free, stop)
                await asyncio.sleep(0)  # let sibling completions land: claim in batches
                continue
            settles_before = self.settle_count
            claim = await self._claim(waker, size, backoff, queues)
            if claim is None:
                continue  # an outage, its back-off waited out
            batch, claimed_at = claim
            if batch:
                if len(batch) == size:
                    self.burst.set()  # there may be more: an idle lane claims too
                self._start(batch, claimed_at)
                await asyncio.sleep(0)  # the handlers start before this lane prepares its next claim
                continue
            if until_idle:
                if await self._drained(waker, settles_before):
                    return
                continue
            await self._wait_for_work(waker)

    async def _claim(
        self, waker: Waker, size: int, backoff: Backoff, queues: list[str]
    ) -> tuple[list[Claimed], float] | None:
        """One claim of up to `size` messages and when it was sent; None after an outage, once the
        back-off is waited out (until then its size and outcomes count as in flight)."""
        waker.clear()
        if not queues:  # every signal of this pool is paused: nothing to claim (outcomes go to the settler)
            return [], time.monotonic()
        outcomes = self._outcomes_for_claim()
        self.requested += size
        started = time.monotonic()
        runtime = self.runtime
        try:
            if outcomes:
                _held, batch = await self.store.settle_and_claim(
                    runtime.worker_id, outcomes, queues, runtime.lease_ms, size
                )
            else:
                batch = await self.store.claim(queues, runtime.worker_id, runtime.lease_ms, size)
            backoff.reset()
            self.store_back.set()
            self.claim_s = ewma(self.claim_s, time.monotonic() - started)
            return batch, started
        except Exception as err:
            if outcomes:  # not settled: back to the settler, which retries or gives up as usual
                self.pending_outcomes[:0] = outcomes
                self.outcome_ready.set()
            if not is_outage(err):
                raise
            await self._back_off(err, waker, backoff)
            return None
        finally:
            self.requested -= size
            self.slot_free.set()  # what this claim asked for is free to ask for again, whatever it got
            if outcomes:
                self._end_settle()
                self.settled.set()

    async def _back_off(self, err: Exception, waker: Waker, backoff: Backoff) -> None:
        """After a claim lost to an outage: wait before the next one."""
        log.warning("claim failed (%s: %s); retrying in %.2fs", type(err).__name__, err, backoff.delay)
        # a wake-up (the LISTEN connection is back, a local emit landed) cuts the back-off short
        await wait_any(self.runtime.stop, waker.event, timeout=backoff.delay)
        backoff.grow()

    async def _drained(self, waker: Waker, settles_before: int) -> bool:
        """After an empty claim in a drain: True when nothing runs, waits or changed meanwhile;
        else False once there may be work again (claim now, or after a wait)."""
        self._claim_idle()
        if not self.running and not self.pending_outcomes and not self.settles_in_flight:
            # A settle that landed during the claim: claim again now. Waiting for its `settled`
            # could wait out IDLE_POLL_S, since the other lane may have cleared it already.
            return settles_before == self.settle_count
        # Not slot_free: every claim's `finally` sets it, so two lanes would wake each other
        # into empty claims for as long as a handler runs. A finished handler (the drain may
        # be over), a settle (work may be eligible again) or an emit is what counts here.
        await wait_any(
            self.handler_done, self.settled, self.runtime.stop, waker.event, timeout=self._idle_poll_s(IDLE_POLL_S)
        )
        self.handler_done.clear()
        self.settled.clear()
        return False

    async def _wait_for_work(self, waker: Waker) -> None:
        """The queues are empty: wait for a wake-up (an emit, a notification), a stop, the next
        delayed message's due time, or the poll, whichever comes first.

        One idle lane waits so; the others wait for its claim to come back full (a burst), so one
        emit to an idle worker costs one claim, not one a lane, each slowing the other."""
        self._claim_idle()
        if self.lane_listening:
            await wait_any(self.burst, self.runtime.stop)
            self.burst.clear()
            return
        self.lane_listening = True
        try:
            await self._offer_idle()  # an emit may hand its message to this pool now (handoff.py)
            timeout = self._idle_poll_s(await self._until_next_due())
            if not self.runtime.stop.is_set():  # from here a stop wakes the waker (pool.py)
                await waker.wait(timeout)
        finally:
            self.lane_listening = False

    async def _until_next_due(self) -> float:
        """Seconds to sleep when idle: until the earliest not-yet-due message is due, at most
        IDLE_POLL_S (a delay emitted meanwhile wakes the worker through its emit's wake-up)."""
        try:
            due_in_ms = await self.store.next_due_in_ms(self.queues)
        except Exception as err:
            if not is_outage(err):
                raise
            return IDLE_POLL_S  # the next claim meets the outage and backs off
        if due_in_ms is None:
            return IDLE_POLL_S
        return min(IDLE_POLL_S, (due_in_ms + 1) / 1000)
