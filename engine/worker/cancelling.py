"""Stopping a running handler an operator cancelled: the worker's side of `okconsole cancel`.

`ops.cancel` of a message under a live lease writes a request (`oke_cancels`, engine/store/cancels.py)
and, on PostgreSQL, NOTIFYs oke_cancel at commit. Each pool's `CancelWatcher` reads the requests
only while the pool holds messages, never on a claim or a settle: on a notice (PostgreSQL's LISTEN
connection, or a cancel committed in this process) at once, and otherwise every CANCEL_POLL_S
(SQLite, or while that connection is down), or every CANCEL_TRUST_S while it listens (the net for
a notice sent while it reconnected). A named message whose handler runs here has its task
cancelled (the runner's `stop_running`); the attempt then ends Cancelled and the watcher writes
that (`confirm_cancelled`): the message ends dead, the request is deleted. Why a table read now
and then rather than a column the claim or the settle reads: docs/design/cancel-requests.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Protocol

from ..store import Outcome
from ..store.outage import is_outage
from ..store.wake import Waker
from .worker_store import WorkerStore

log = logging.getLogger("engine.worker")

CANCEL_POLL_S = 0.5  # without notices: a request reaches a running handler within about this
CANCEL_TRUST_S = 2.0  # with live notices: read again at least this often while holding messages
CONFIRM_TRIES_AT_STOP = 3  # a stopping pool's last attempts to write its Cancelled outcomes


class HandlerTasks(Protocol):
    """What the watcher asks of the runner: whether it holds messages, and to stop some."""

    @property
    def held(self) -> int: ...

    def stop_running(self, requests: Mapping[str, str]) -> list[str]: ...


class CancelWatcher:
    """Owns the cancel requests' reading (when last read, the notices' epoch it was read in) and the
    Cancelled outcomes not written yet."""

    def __init__(self, store: WorkerStore, worker_id: str, handlers: HandlerTasks) -> None:
        self._store, self._worker_id, self._handlers = store, worker_id, handlers
        self._read_at = float("-inf")
        self._epoch: int | None = None  # the notices' epoch the last read began in, if listening
        self._stopped: list[Outcome] = []  # attempts stopped here, their end not written yet
        self._stopping = False
        self._waker: Waker | None = None  # while `run` runs: woken by a confirmation or a stop

    def read_due(self) -> bool:
        """Whether to read the requests now: never while this pool holds no message (nothing here
        to stop); with live notices once one arrived since the last read, or CANCEL_TRUST_S after
        it; without them CANCEL_POLL_S after it."""
        if not self._handlers.held:
            return False
        age = time.monotonic() - self._read_at
        notices = self._store.cancel_notices()
        if notices is not None and notices.live:
            return notices.epoch != self._epoch or age >= CANCEL_TRUST_S
        return age >= CANCEL_POLL_S

    def wait_s(self) -> float:
        """How long `run` waits unwoken: the poll without live notices, the net with them."""
        notices = self._store.cancel_notices()
        return CANCEL_TRUST_S if notices is not None and notices.live else CANCEL_POLL_S

    async def check(self, woken: bool = False) -> list[str]:
        """Read the requests when due (or `woken` by a notice while holding messages) and stop the
        running handlers they name; the ids stopped now. An outage skips this read."""
        if not (self.read_due() or (woken and self._handlers.held)):
            return []
        notices = self._store.cancel_notices()
        epoch = notices.epoch if notices is not None and notices.live else None
        try:
            requests = await self._store.cancel_requests()
        except Exception as err:
            if not is_outage(err):
                raise
            log.warning("could not read the cancel requests (%s: %s)", type(err).__name__, err)
            return []
        self._read_at, self._epoch = time.monotonic(), epoch
        stopped = self._handlers.stop_running(requests) if requests else []
        if stopped:
            log.info("cancelled the running handlers of %s as an operator asked", ", ".join(stopped))
        return stopped

    def confirm(self, outcome: Outcome) -> None:
        """A stopped attempt's Cancelled outcome (from the runner): written by `run` soon."""
        self._stopped.append(outcome)
        if self._waker is not None:
            self._waker.wake()

    async def write_stopped(self) -> bool:
        """Write the Cancelled outcomes waiting; False (they wait on) when the store is away."""
        if not self._stopped:
            return True
        batch, self._stopped = self._stopped, []
        try:
            held = await self._store.confirm_cancelled(self._worker_id, batch)
        except Exception as err:
            self._stopped[:0] = batch
            if not is_outage(err):
                raise
            log.warning("could not record %d cancelled attempts (%s: %s)", len(batch), type(err).__name__, err)
            return False
        for out, still in zip(batch, held, strict=True):
            if not still:
                log.warning("cancelled %s attempt %d after its lease was lost", out.claimed.id, out.claimed.attempts)
        return True

    def stop(self) -> None:
        """The pool is stopping: write what is left and end."""
        self._stopping = True
        if self._waker is not None:
            self._waker.wake()

    async def run(self) -> None:
        """Until `stop`: wait for a notice, a confirmation or the poll; read when due; write what
        was stopped. At the stop, a few last tries; after that a stopped attempt's message is left
        to its lease, and its request stands for whoever takes it next."""
        waker = self._store.cancel_waker()
        self._waker = waker
        try:
            while not self._stopping:
                await waker.wait(self.wait_s())
                woken = waker.event.is_set()
                waker.clear()
                await self.check(woken)
                if not await self.write_stopped():
                    await asyncio.sleep(CANCEL_POLL_S)
            for _ in range(CONFIRM_TRIES_AT_STOP):
                if await self.write_stopped():
                    break
                await asyncio.sleep(CANCEL_POLL_S)
        finally:
            self._waker = None
            waker.close()
