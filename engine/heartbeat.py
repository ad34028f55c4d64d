"""A running worker pool's record in `oke_workers`: written before its first claim, refreshed every
`interval_s` (one small upsert: the held count comes from the pool's own counter, never a query),
and marked stopped on a clean stop.

An operator (`okconsole workers`, `show`, `doctor`) reads these rows to tell a lease whose holder
is gone (orphaned: stuck until the lease expires) from one whose holder is alive (slow).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from types import TracebackType

from .store import Store
from .store import workers as registry
from .store.outage import describe, is_outage

DEFAULT_INTERVAL_S = 5.0  # at least every 5 s
# The start and the stop are awaited by the pool's run: a store that hangs (a network blackhole)
# must not hold the workers' start, or a cancelled drain's return, for longer than this.
EDGE_WAIT_S = 5.0
log = logging.getLogger("engine.heartbeat")


class WorkerHeartbeat:
    """`async with WorkerHeartbeat(...)` around a pool's run: recorded on entry, beating meanwhile."""

    def __init__(
        self,
        store: Store,
        worker_id: str,
        app: str,
        concurrency: int,
        held: Callable[[], int],
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.start = {"app": app, "host": socket.gethostname(), "pid": os.getpid(), "concurrency": concurrency}
        self.held = held
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._recorded = False  # the start is written (until then each beat tries the start again)

    async def __aenter__(self) -> WorkerHeartbeat:
        try:
            await asyncio.wait_for(self._beat(), EDGE_WAIT_S)
        except TimeoutError:
            log.warning(
                "worker %s: the store did not record its start in %.0fs; beating on", self.worker_id, EDGE_WAIT_S
            )
        self._task = asyncio.create_task(self._loop(), name="oke-worker-heartbeat")
        return self

    async def __aexit__(
        self, _type: type[BaseException] | None, _err: BaseException | None, _tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        held = self.held()
        try:
            await asyncio.wait_for(
                self.store.write(lambda conn: registry.stopped(conn, self.worker_id, held)), EDGE_WAIT_S
            )
        except Exception as err:  # the store is away: the row ages out as a worker not seen
            why = "no answer" if isinstance(err, TimeoutError) else describe(err)
            log.warning("could not record worker %s as stopped (%s)", self.worker_id, why)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self._beat()

    async def _beat(self) -> None:
        held = self.held()
        begin = None if self._recorded else self.start
        try:
            await self.store.write(lambda conn: registry.beat(conn, self.worker_id, held, start=begin))
            self._recorded = True
        except Exception as err:  # an outage (or a bug) must not stop the workers: the next beat retries
            if is_outage(err):
                log.warning("worker heartbeat failed (%s); retrying in %.1fs", describe(err), self.interval_s)
            else:
                log.exception("worker heartbeat failed; retrying in %.1fs", self.interval_s)
