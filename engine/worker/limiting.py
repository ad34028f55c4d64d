"""Flow limits: which of the pool's queues a claim takes through the gated claim, and their limits.

A signal's concurrency and rate limits are declared with it (`signal.once(..., concurrency=5,
rate="100/1m")`) and may be overridden by an operator (`okconsole limit`, a row of `oke_limits`).
The store enforces them inside the claim (engine/store/sql/gates.py); this watcher only says which
queues are limited and by what, so a pool with no limits claims with the plain statement as before.
It reads the overrides as the pause watcher reads pauses: after a notice where the store announces
changes (PostgreSQL, on the pause channel) and at least every PAUSE_TRUST_S, else every
LIMIT_REFRESH_S; so a change is in force in every process from at most a second after it commits.
A broadcast's limits hold per flow copy queue.
"""

from __future__ import annotations

import logging
import time

from ..durations import parse_rate
from ..store.limits import Override, in_force
from ..store.outage import is_outage
from ..store.sql.gates import Gate
from .pausing import PAUSE_TRUST_S
from .route import Route
from .worker_store import WorkerStore

log = logging.getLogger("engine.worker")

LIMIT_REFRESH_S = 0.5


class LimitWatcher:
    """Owns the overrides as last read, when they were read, and each queue's gate (its limits in
    force; none for an unlimited queue)."""

    def __init__(self, store: WorkerStore, routes: dict[str, Route]) -> None:
        self._store, self._routes = store, routes
        self._overrides: dict[str, Override] = {}
        self._read_at = float("-inf")
        self._epoch: int | None = None
        self._gates: dict[str, Gate] = self._gates_for({})

    def _gates_for(self, overrides: dict[str, Override]) -> dict[str, Gate]:
        gates: dict[str, Gate] = {}
        for queue, route in self._routes.items():
            signal = route.signal
            limits = in_force(signal.concurrency, signal.rate, overrides.get(signal.name))
            rate = None if limits.rate is None else parse_rate(limits.rate)
            if limits.concurrency is not None or rate is not None:
                count, window = rate if rate is not None else (None, None)
                gates[queue] = Gate(queue, signal.name, limits.concurrency, count, window)
        return gates

    def ungated(self, queues: list[str]) -> list[str]:
        """`queues` without the limited ones (no read here): what an idle pool offers to emits."""
        gates = self._gates
        return [q for q in queues if q not in gates] if gates else queues

    async def split(self, queues: list[str]) -> tuple[list[str], list[Gate]]:
        """`queues` as the plain claim's and the gated claim's (re-reading the overrides when stale)."""
        if self._stale():
            await self._read()
        gates = self._gates
        if not gates:
            return queues, []
        return [q for q in queues if q not in gates], [gates[q] for q in queues if q in gates]

    def _stale(self) -> bool:
        age = time.monotonic() - self._read_at
        notices = self._store.pause_notices()
        if notices is not None and notices.live:
            return notices.epoch != self._epoch or age >= PAUSE_TRUST_S
        return age >= LIMIT_REFRESH_S

    async def _read(self) -> None:
        """Re-read the overrides; on an outage keep the last ones (and read again next time)."""
        notices = self._store.pause_notices()
        epoch = notices.epoch if notices is not None and notices.live else None
        try:
            overrides = await self._store.limit_overrides()
        except Exception as err:
            if not is_outage(err):
                raise
            log.warning("could not read the flow limits (%s: %s); keeping the last ones", type(err).__name__, err)
            return
        self._read_at, self._epoch = time.monotonic(), epoch
        if overrides != self._overrides:
            self._overrides = overrides
            self._gates = self._gates_for(overrides)
            log.info("flow limits now: %s", ", ".join(f"{g.queue}={g.concurrency}/{g.rate_count}" for g in
                                                       self._gates.values()) or "none")  # fmt: skip
