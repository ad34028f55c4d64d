"""`WorkerPool`: wires the worker's parts and runs them, start to stop.

The parts and what each owns (docs/architecture.md has the table): the claimer (claims in flight),
the runner (the slots, held messages and the line of claimed ones waiting), the settler (pending
outcomes), the pause watcher (the paused set), the limit watcher (which queues are limited), the
cancel watcher (operators' requests to stop a running handler), the hand-off offer (the standing
offer to emits).
The pool holds no state of its own beyond them; it starts the claim lanes and the settlers, and on
the way out lets running handlers finish (or cancels them) and settles what they left.
"""

from __future__ import annotations

import asyncio

from ..runtime import Runtime
from ..store import Outcome
from ..store.wake import Waker
from .cancelling import CancelWatcher
from .claiming import Claimer
from .handoff import HandoffOffer
from .limiting import LimitWatcher
from .pausing import PauseWatcher
from .route import Route
from .running import Runner
from .settling import Settler
from .worker_store import WorkerStore


class WorkerPool:
    """Runs the flows of one app until stopped (`run`) or until nothing is eligible (`drain`)."""

    def __init__(self, runtime: Runtime, routes: dict[str, Route], concurrency: int) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an int ≥ 1, got {concurrency!r}")
        self.runtime = runtime
        self.concurrency = concurrency
        store: WorkerStore = runtime.store
        self._store = store
        self._queues = sorted(routes)
        self._lanes = max(1, store.concurrent_claims)
        self.settler = Settler(store, runtime.worker_id, self._handlers_running)
        self.runner = Runner(runtime, store, routes, concurrency, self.settler.add, self._stopped)
        self.cancels = CancelWatcher(store, runtime.worker_id, self.runner)
        self.pauses = PauseWatcher(store, routes)
        self.limits = LimitWatcher(store, routes)
        self.offer = HandoffOffer(store, runtime, self.pauses, self.runner, self._wants_work, self.limits.ungated)
        self.claimer = Claimer(
            runtime, store, self._queues, concurrency, self.runner, self.settler, self.pauses, self.offer, self.limits
        )

    @property
    def held(self) -> int:
        """Messages leased and not ended (running or waiting for a slot): the heartbeat's `held`."""
        return self.runner.held

    def _handlers_running(self) -> bool:
        return self.runner.busy()

    def _stopped(self, outcome: Outcome) -> None:
        self.cancels.confirm(outcome)

    def _wants_work(self) -> bool:
        return self.claimer.wants_work()

    async def run(self, until_idle: bool = False) -> None:
        if not self._queues:
            if not until_idle:
                await self.runtime.stop.wait()
            return
        wakers = [self._store.waker() for _ in range(self._lanes)]
        # A settler per lane: where claims overlap (PostgreSQL), a large settle no longer holds up
        # the outcomes that finish meanwhile.
        settlers = [asyncio.create_task(self.settler.run(), name="oke-settler") for _ in range(self._lanes)]
        stop_wakes = asyncio.create_task(self._wake_on_stop(wakers), name="oke-stop-wakes")
        cancels = asyncio.create_task(self.cancels.run(), name="oke-cancel-watch")
        runner = self.runner
        try:
            await self._run_lanes(wakers, until_idle)
            if self.runtime.stop.is_set():
                await self.offer.withdraw()  # nothing more is handed to this pool
                await runner.hand_back_waiting()  # before the grace: others take them meanwhile
            if runner.busy():
                await runner.finish()
        except asyncio.CancelledError:
            if runner.busy():  # the caller gave up (a timeout around drain()): do not wait on handlers
                await runner.cancel()
            raise
        except BaseException:
            if runner.busy():  # a lane failed: running handlers may still end within the grace
                await runner.finish()
            raise
        finally:
            self.offer.close()  # a lane failed or the run was cancelled: the offer lapses
            stop_wakes.cancel()
            runner.stop_renewing()  # messages still waiting keep their leases until they run out
            for waker in wakers:
                waker.close()
            self.settler.stop()
            self.cancels.stop()  # after the handlers: their Cancelled outcomes are written first
            await asyncio.gather(*settlers, cancels)

    async def _wake_on_stop(self, wakers: list[Waker]) -> None:
        """A lane waiting for work waits on its waker alone: a stop ends that wait this way."""
        await self.runtime.stop.wait()
        for waker in wakers:
            waker.wake()

    async def _run_lanes(self, wakers: list[Waker], until_idle: bool) -> None:
        """A claim loop per lane until they all end; a lane's error is raised as itself."""
        try:
            async with asyncio.TaskGroup() as lanes:
                for n, waker in enumerate(wakers):
                    lanes.create_task(self.claimer.run_lane(waker, until_idle), name=f"oke-claim-{n}")
        except BaseExceptionGroup as group:  # one lane's error, not a group, to the caller
            raise group.exceptions[0] from None
        finally:
            self.settler.claim_idle()  # no more claims: the settler takes every outcome from here on
