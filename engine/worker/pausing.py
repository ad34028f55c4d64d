"""Paused signals: which of the pool's queues a claim may take from.

An operator's pause is a row in `oke_pauses` (engine/store/pauses.py), written by any process.
Each pool reads the paused set at claim time when its copy is stale (one tiny query, not one per
claim) and leaves the paused signals' queues (the once queue and every broadcast copy queue) out
of its claims. Handlers already running finish; emits are still stored.

When is the copy stale? Where the store announces pause changes (PostgreSQL: engine.ops NOTIFYs
oke_pause at commit, heard on the workers' LISTEN connection), at the next claim after a notice,
and otherwise after PAUSE_TRUST_S (the net for a pause written by hand with SQL); so the first
claim after an idle spell waits for no read. Where it does not (SQLite), or while that connection
is down, after PAUSE_REFRESH_S: no process claims a paused signal's messages from PAUSE_REFRESH_S
plus one claim after the pause commits. Why notices rather than a read on every claim:
docs/design/pause-notices.md.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..store.outage import is_outage
from .route import Route
from .worker_store import WorkerStore

log = logging.getLogger("engine.worker")

PAUSE_REFRESH_S = 0.5
PAUSE_TRUST_S = 5.0


class PauseWatcher:
    """Owns the paused set as last read, when it was read, and the claimable queues it leaves."""

    def __init__(self, store: WorkerStore, routes: dict[str, Route]) -> None:
        self._store, self._routes = store, routes
        self._queues = sorted(routes)
        self._paused: frozenset[str] = frozenset()
        self._read_at = float("-inf")  # the last read that answered
        self._tried_at = float("-inf")  # the last read begun, answered or not
        self._epoch: int | None = None  # the pause notices' epoch that read began in, if listening
        self._lock = asyncio.Lock()
        self._claimable: list[str] = self._queues

    @property
    def claimable(self) -> list[str]:
        """The pool's queues whose signal was not paused at the last read (no read here)."""
        return self._claimable

    async def claimable_queues(self) -> list[str]:
        """The pool's queues whose signal is not paused (re-read when the last read is stale). The
        lanes share one read: a lane never claims with the old set while another lane reads."""
        asked_at = time.monotonic()
        if self._stale() or self._lock.locked():
            async with self._lock:
                # A lane that waited for another's read takes its result, answered or not: during an
                # outage the lanes do not each wait out a read of their own, one after the other.
                if self._stale() and self._tried_at < asked_at:
                    self._tried_at = time.monotonic()
                    notices = self._store.pause_notices()
                    epoch = notices.epoch if notices is not None and notices.live else None
                    if await self._read():
                        self._read_at = time.monotonic()
                        self._epoch = epoch
        return self._claimable

    def _stale(self) -> bool:
        """Whether the paused set must be read before the next claim (see the module's docstring)."""
        age = time.monotonic() - self._read_at
        notices = self._store.pause_notices()
        if notices is not None and notices.live:  # a notice (or a reconnect) since the read: stale now
            return notices.epoch != self._epoch or age >= PAUSE_TRUST_S
        return age >= PAUSE_REFRESH_S

    async def _read(self) -> bool:
        """Re-read the paused set; False when the store was away. The last set is kept then, but
        not counted as fresh: the next claim reads again first, so a pause that committed just
        before an outage holds from the first claim after it."""
        try:
            paused = await self._store.paused_signals()
        except Exception as err:
            if not is_outage(err):
                raise
            log.warning("could not read the paused signals (%s: %s); keeping the last set", type(err).__name__, err)
            return False
        if paused != self._paused:
            self._paused = paused
            self._claimable = [q for q in self._queues if self._routes[q].signal.name not in paused]
            log.info("paused signals now: %s", ", ".join(sorted(paused)) or "none")
        return True

    def idle_poll_s(self, poll_s: float) -> float:
        """How long an idle lane waits unwoken: no longer than a refresh while a queue is paused, so a
        resume in a process that cannot wake this one (SQLite elsewhere) is seen soon."""
        return min(poll_s, PAUSE_REFRESH_S) if self._paused else poll_s
