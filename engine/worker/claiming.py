"""The claimer: claim lanes that ask the store for work, sized ahead of the free slots
(claim_ahead.py), carrying the settler's pending outcomes where the store settles with claims;
when the queues are empty they wait for work, or (drain) tell whether everything is idle."""

from __future__ import annotations

import asyncio
import logging
import time

from ..runtime import Runtime
from ..store import Claimed
from ..store.outage import is_outage
from ..store.sql.gates import Gate
from ..store.wake import Waker
from .averages import ewma
from .claim_ahead import claim_ahead, claim_size
from .handoff import HandoffOffer
from .limiting import LimitWatcher
from .pausing import PauseWatcher
from .running import Runner
from .settling import Settler
from .waiting import IDLE_POLL_S, Backoff, wait_any
from .worker_store import WorkerStore

log = logging.getLogger("engine.worker")


class Claimer:
    """Owns the claims in flight (the rows they asked for), the claim-time average, and which lane
    listens for work while the others wait for a burst. It asks the runner how much it holds, the
    settler for outcomes to carry, the pause watcher which queues to claim from."""

    def __init__(
        self,
        runtime: Runtime,
        store: WorkerStore,
        queues: list[str],
        concurrency: int,
        runner: Runner,
        settler: Settler,
        pauses: PauseWatcher,
        offer: HandoffOffer,
        limits: LimitWatcher,
    ) -> None:
        self._runtime, self._store, self._queues, self._concurrency = runtime, store, queues, concurrency
        self._runner, self._settler, self._pauses, self._offer = runner, settler, pauses, offer
        self._limits = limits
        self._held_back_ms: int | None = None  # the last gated claim: how soon a limit may let more through
        self._requested = 0  # rows asked for by claims in flight
        self._claim_s = 0.0  # moving average; 0 until measured (no claiming ahead before that)
        self._listening = False  # an idle lane waits for wake-ups; the others for `_burst`
        self._burst = asyncio.Event()  # a claim came back full: there may be more work than one lane takes

    def wants_work(self) -> bool:
        """A lane waits for work and a slot is free (neither held nor asked for): what an offer to
        emits needs (handoff.py)."""
        return self._listening and self._runner.held + self._requested < self._concurrency

    def size(self) -> int:
        """How many messages the next claim asks for (claim_ahead.py), counting what is held and
        what claims in flight asked for."""
        store, concurrency = self._store, self._concurrency
        ahead = claim_ahead(
            concurrency, self._claim_s, self._runner.handler_s, store.concurrent_claims, store.claim_rows_max
        )
        return claim_size(self._runner.held + self._requested, concurrency, ahead, store.claim_rows_max)

    async def run_lane(self, waker: Waker, until_idle: bool) -> None:
        """One lane, until stopped, or (`until_idle`) until nothing is eligible and nothing runs."""
        stop = self._runtime.stop
        backoff = Backoff()
        while not stop.is_set():
            # Before the size: from the size on, nothing awaits until `_requested` counts it, so two
            # lanes never both ask for the same free slots.
            queues, gates = await self._limits.split(await self._pauses.claimable_queues())
            size = self.size()
            if gates and not queues:  # limited queues only: claimed for free slots, never ahead
                size = min(size, self._concurrency - self._runner.held - self._requested)
            if size <= 0:
                # No claim until a slot frees (the slots and the claimed-ahead messages are all
                # taken): outcomes must not wait for one, they go to the settler meanwhile.
                self._settler.claim_idle()
                await self._runner.wait_for_room(stop)
                await asyncio.sleep(0)  # let sibling completions land: claim in batches
                continue
            settles_before = self._settler.count
            claim = await self._claim(waker, size, backoff, queues, gates)
            if claim is None:
                continue  # an outage, its back-off waited out
            batch, claimed_at = claim
            if batch:
                if len(batch) == size:
                    self._burst.set()  # there may be more: an idle lane claims too
                self._runner.start(batch, claimed_at)
                await asyncio.sleep(0)  # the handlers start before this lane prepares its next claim
                continue
            if until_idle:
                if await self._drained(waker, settles_before):
                    return
                continue
            await self._wait_for_work(waker)

    async def _claim(
        self, waker: Waker, size: int, backoff: Backoff, queues: list[str], gates: list[Gate]
    ) -> tuple[list[Claimed], float] | None:
        """One claim of up to `size` messages and when it was sent; None after an outage, once the
        back-off is waited out (until then its size and outcomes count as in flight). Limited
        queues (`gates`) take the gated claim, for free slots only: a message claimed ahead would
        hold a slot of the limit (or a start of the window) while it waits here."""
        waker.clear()
        if not queues and not gates:  # every signal of this pool is paused: nothing to claim
            return [], time.monotonic()
        settler, runtime = self._settler, self._runtime
        free = self._concurrency - self._runner.held - self._requested
        outcomes = settler.lend_to_claim()
        self._requested += size
        started = time.monotonic()
        self._held_back_ms = None
        try:
            if gates:
                gated = await self._store.claim_gated(
                    runtime.worker_id, outcomes, queues, gates, runtime.lease_ms, size, min(size, free)
                )
                batch, self._held_back_ms = gated.claimed, gated.held_back_ms
            elif outcomes:
                _held, batch = await self._store.settle_and_claim(
                    runtime.worker_id, outcomes, queues, runtime.lease_ms, size
                )
            else:
                batch = await self._store.claim(queues, runtime.worker_id, runtime.lease_ms, size)
            backoff.reset()
            settler.store_answered()
            self._claim_s = ewma(self._claim_s, time.monotonic() - started)
            return batch, started
        except Exception as err:
            if outcomes:  # not settled: back to the settler, which retries or gives up as usual
                settler.take_back(outcomes)
            if not is_outage(err):
                raise
            await self._back_off(err, waker, backoff)
            return None
        finally:
            self._requested -= size
            self._runner.room_changed()  # what this claim asked for is free to ask for again, whatever it got
            if outcomes:
                settler.claim_over()

    async def _back_off(self, err: Exception, waker: Waker, backoff: Backoff) -> None:
        """After a claim lost to an outage: wait before the next one."""
        log.warning("claim failed (%s: %s); retrying in %.2fs", type(err).__name__, err, backoff.delay)
        # a wake-up (the LISTEN connection is back, a local emit landed) cuts the back-off short
        await wait_any(self._runtime.stop, waker.event, timeout=backoff.delay)
        backoff.grow()

    async def _drained(self, waker: Waker, settles_before: int) -> bool:
        """After an empty claim in a drain: True when nothing runs, waits or changed meanwhile;
        else False once there may be work again (claim now, or after a wait)."""
        runner, settler = self._runner, self._settler
        settler.claim_idle()
        held_back = self._held_back_ms
        if held_back is not None and held_back <= IDLE_POLL_S * 1000:
            # Due messages wait behind a limit that lets more through within a poll: not drained
            # yet. One a longer rate window holds stays pending (a drain does not wait out an hour).
            await wait_any(self._runtime.stop, runner.handler_done, timeout=held_back / 1000)
            runner.handler_done.clear()
            return False
        if not runner.busy() and not settler.busy():
            # A settle that landed during the claim: claim again now. Waiting for its `settled`
            # could wait out IDLE_POLL_S, since the other lane may have cleared it already.
            return settles_before == settler.count
        # Not the runner's room: every claim ends by signalling it, so two lanes would wake each
        # other into empty claims for as long as a handler runs. A finished handler (the drain may
        # be over), a settle (work may be eligible again) or an emit is what counts here.
        await wait_any(
            runner.handler_done,
            settler.settled,
            self._runtime.stop,
            waker.event,
            timeout=self._pauses.idle_poll_s(IDLE_POLL_S),
        )
        runner.handler_done.clear()
        settler.settled.clear()
        return False

    async def _wait_for_work(self, waker: Waker) -> None:
        """The queues are empty: wait for a wake-up (an emit, a notification), a stop, the next
        delayed message's due time, or the poll, whichever comes first.

        One idle lane waits so; the others wait for its claim to come back full (a burst), so one
        emit to an idle worker costs one claim, not one a lane, each slowing the other."""
        self._settler.claim_idle()
        stop = self._runtime.stop
        if self._listening:
            await wait_any(self._burst, stop)
            self._burst.clear()
            return
        self._listening = True
        try:
            await self._offer.offer_idle()  # an emit may hand its message to this pool now (handoff.py)
            timeout = self._pauses.idle_poll_s(await self._until_next_due())
            if not stop.is_set():  # from here a stop wakes the waker (pool.py)
                await waker.wait(timeout)
        finally:
            self._listening = False

    async def _until_next_due(self) -> float:
        """Seconds to sleep when idle: until the earliest not-yet-due message is due, at most
        IDLE_POLL_S (a delay emitted meanwhile wakes the worker through its emit's wake-up), and no
        longer than a limit that held due messages back may take to let more through."""
        held_back_s = IDLE_POLL_S if self._held_back_ms is None else self._held_back_ms / 1000
        try:
            due_in_ms = await self._store.next_due_in_ms(self._queues)
        except Exception as err:
            if not is_outage(err):
                raise
            return min(IDLE_POLL_S, held_back_s)  # the next claim meets the outage and backs off
        if due_in_ms is None:
            return min(IDLE_POLL_S, held_back_s)
        return min(IDLE_POLL_S, held_back_s, (due_in_ms + 1) / 1000)
