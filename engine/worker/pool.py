"""`WorkerPool.run`: start the claim lanes and the settlers, and on the way out let running handlers
finish (or cancel them) and settle what they left."""

from __future__ import annotations

import asyncio

from ..store.wake import Waker
from .claiming import Claiming


class WorkerPool(Claiming):
    """Runs the flows of one app until stopped (`run`) or until nothing is eligible (`drain`)."""

    async def run(self, until_idle: bool = False) -> None:
        if not self.queues:
            if not until_idle:
                await self.runtime.stop.wait()
            return
        wakers = [self.store.waker() for _ in range(self.lanes)]
        # A settler per lane: where claims overlap (PostgreSQL), a large settle no longer holds up
        # the outcomes that finish meanwhile (32 handlers: 11,700 -> 14,100 msgs/s, bench/ONCE.md).
        settlers = [asyncio.create_task(self._settle_loop(), name="oke-settler") for _ in range(self.lanes)]
        stop_wakes = asyncio.create_task(self._wake_on_stop(wakers), name="oke-stop-wakes")
        try:
            await self._run_lanes(wakers, until_idle)
            if self.runtime.stop.is_set():
                await self._withdraw_offer()  # nothing more is handed to this pool
                await self._hand_back_waiting()  # before the grace: others take them meanwhile
            if self.running:
                await self._finish_running()
        except asyncio.CancelledError:
            if self.running:  # the caller gave up (a timeout around drain()): do not wait on handlers
                await self._cancel_running()
            raise
        except BaseException:
            if self.running:  # a lane failed: running handlers may still end within the grace
                await self._finish_running()
            raise
        finally:
            self._stop_taking()  # a lane failed or the run was cancelled: the offer lapses
            stop_wakes.cancel()
            if self.renewer is not None:
                self.renewer.cancel()  # messages still waiting keep their leases until they run out
            for waker in wakers:
                waker.close()
            self.stopping = True
            self.outcome_ready.set()
            await asyncio.gather(*settlers)

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
                    lanes.create_task(self._claim_loop(waker, until_idle), name=f"oke-claim-{n}")
        except BaseExceptionGroup as group:  # one lane's error, not a group, to the caller
            raise group.exceptions[0] from None
        finally:
            self._claim_idle()  # no more claims: the settler takes every outcome from here on
