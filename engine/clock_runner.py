"""Emits this app's clock ticks while it runs: each tick one `once` message of the clock's signal.

Every process running the app emits every tick it is awake for; the tick time is the message's
dedupe key, held for past the next tick (`dedupe_for`), so however many processes emit it (late,
restarted, racing) the store keeps exactly one message per tick. A tick that no process was running
for is skipped; `catch_up=True` emits the latest missed one at start (a no-op if it was emitted).
A paused clock signal gets no ticks: a resumed clock does not run its backlog.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .clocks import Schedule, hold_ms
from .errors import StoreUnavailable
from .ids import now_ms
from .signals import Signal
from .store import Store
from .store.outage import describe, is_outage

log = logging.getLogger("engine.clocks")
RECHECK_S = 30.0  # a sleep until the next tick looks at the wall clock again at least this often
RETRY_S = 0.2  # a tick the store did not take is tried again this often, until the next tick is due

Emit = Callable[..., Awaitable[str]]


class ClockRunner:
    """The ticks of one app's clocks, one task per clock, until `stopping` is set."""

    def __init__(
        self,
        store: Store,
        emit: Emit,
        clocks: dict[Signal, Schedule],
        stopping: asyncio.Event,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._store = store
        self._emit = emit
        self._clocks = clocks
        self._stopping = stopping
        self._now = clock

    async def run(self) -> None:
        await asyncio.gather(*(self._ticks(sig, schedule) for sig, schedule in self._clocks.items()))

    async def _ticks(self, sig: Signal, schedule: Schedule) -> None:
        now = self._now()
        if schedule.catch_up:
            latest = schedule.latest_at_or_before(now)
            if latest is not None:
                await self.tick(sig, schedule, latest)
        at = schedule.next_after(now)
        while await self._sleep_until(at):
            await self.tick(sig, schedule, at)
            at = self._after(schedule, at)

    def _after(self, schedule: Schedule, at: int) -> int:
        """The tick to emit after `at`: the next one, or when a slow emit or a stalled loop let later
        ticks pass meanwhile, the latest of those at once (the ones before it are skipped)."""
        latest = schedule.latest_at_or_before(self._now())
        return latest if latest is not None and latest > at else schedule.next_after(at)

    async def _sleep_until(self, at: int) -> bool:
        """Wait until `at` by this machine's clock; False when the app stops first."""
        while (left_ms := at - self._now()) > 0:
            try:
                await asyncio.wait_for(self._stopping.wait(), min(left_ms / 1000, RECHECK_S))
            except TimeoutError:
                continue
            return False
        return not self._stopping.is_set()

    async def tick(self, sig: Signal, schedule: Schedule, at: int) -> str | None:
        """Emit tick `at` (its id, or None when paused or the store never took it before the next tick)."""
        window_s = hold_ms(schedule, at) / 1000
        give_up = schedule.next_after(at)
        while True:
            try:
                if sig.name in await self._store.paused_signals():
                    return None
                payload: dict[str, Any] = {"at": at}
                return await self._emit(sig, payload, dedupe=str(at), dedupe_for=window_s)
            except Exception as err:
                if not isinstance(err, StoreUnavailable) and not is_outage(err):
                    log.exception("clock %s: tick %d was not emitted", sig.name, at)
                    return None
                if self._now() >= give_up or self._stopping.is_set():
                    log.warning("clock %s: tick %d skipped, the store was away (%s)", sig.name, at, describe(err))
                    return None
            await asyncio.sleep(RETRY_S)
