"""Group commit for live tapes: concurrent emits on one tape share one append transaction.

One `store.write` per emit costs one fsync on SQLite (every commit is synced) and one round trip on
PostgreSQL; at a few hundred emits/s they queue behind each other and emit→receive latency grows
to seconds. Here the first emit on a tape starts a flusher task; emits that arrive while it
commits wait in the tape's queue, and its next transaction takes them all (up to MAX_BATCH, so one
transaction stays short). Nothing waits for a timer: a lone emit commits at once.

Ids follow queue order (one `live.append` assigns consecutive seqs in that order), so a caller
that emitted first gets the smaller id. A store error reaches every caller of the batch it hit;
later batches are tried anew. A caller cancelled before its batch was taken is left out (its event
is not stored); one cancelled later just does not hear the result. The flusher runs in its own
task, so a caller's cancellation never interrupts a transaction that carries other callers' events.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Callable

from ..errors import StoreUnavailable
from ..signals import Signal
from ..store import Store
from . import live

log = logging.getLogger("engine.bus.appender")
MAX_BATCH = 500


class AppendInterrupted(StoreUnavailable):
    """The app closed while an append was queued or in flight: it was not (or may not be) stored."""


@dataclass(slots=True)
class _Pending:
    signal: Signal
    payload: str
    parent_run_id: str | None
    future: asyncio.Future[str]


class _Tape:
    """The queue of one tape and the task flushing it (None when the queue is idle)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.queue: deque[_Pending] = deque()
        self.task: asyncio.Task[None] | None = None


class LiveAppender:
    """Appends to live tapes through one flusher task per busy tape."""

    def __init__(self, store: Store, on_commit: Callable[[str], None], max_batch: int = MAX_BATCH) -> None:
        self.store = store
        self.on_commit = on_commit  # called with the signal name after each committed batch
        self.max_batch = max_batch
        self._tapes: dict[str, _Tape] = {}
        self._closing = False

    async def append(self, signal: Signal, payload: str, parent_run_id: str | None) -> str:
        """The event's id once the transaction carrying it committed; else the store's error."""
        if self._closing:
            raise AppendInterrupted(f'emit("{signal.name}"): the app is closing, so the event was not stored')
        loop = asyncio.get_running_loop()
        tape = self._tapes.get(signal.name)
        if tape is None:
            tape = self._tapes[signal.name] = _Tape(signal.name)
        pending = _Pending(signal, payload, parent_run_id, loop.create_future())
        tape.queue.append(pending)
        if tape.task is None:
            tape.task = loop.create_task(self._flush(tape), name=f"oke-append:{signal.name}")
        return await pending.future

    def _take(self, tape: _Tape) -> list[_Pending]:
        """The next batch: queued callers still waiting, in order, of one Signal object."""
        batch: list[_Pending] = []
        while tape.queue and len(batch) < self.max_batch:
            head = tape.queue[0]
            if batch and head.signal is not batch[0].signal:
                break  # another declaration of the same name (its retention may differ): next batch
            tape.queue.popleft()
            if not head.future.done():  # a caller cancelled while queued: its event is not stored
                batch.append(head)
        return batch

    async def _flush(self, tape: _Tape) -> None:
        batch: list[_Pending] = []
        try:
            while tape.queue:
                batch = self._take(tape)
                if not batch:
                    continue
                sig = batch[0].signal
                payloads = [p.payload for p in batch]
                parents = [p.parent_run_id for p in batch]
                try:
                    ids = await self.store.write(lambda conn: live.append(conn, sig, payloads, None, parents))
                except asyncio.CancelledError:
                    raise
                except Exception as err:
                    for p in batch:
                        if not p.future.done():
                            p.future.set_exception(err)
                    batch = []
                    continue
                try:
                    self.on_commit(tape.name)
                except Exception:  # a failed wake-up costs latency (the poll catches up), not events
                    log.exception("live tape %s: waking the local streams failed", tape.name)
                for p, event_id in zip(batch, ids):
                    if not p.future.done():
                        p.future.set_result(event_id)
                batch = []
        except BaseException:
            # cancelled (the app closed without waiting) or broken: nobody may wait forever
            in_flight = AppendInterrupted(f'emit("{tape.name}"): the app closed before the store confirmed '
                                          "the append, so the event may not be stored")
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(in_flight)
            queued = AppendInterrupted(f'emit("{tape.name}"): the app closed before the event was appended, '
                                       "so it was not stored")
            while tape.queue:
                p = tape.queue.popleft()
                if not p.future.done():
                    p.future.set_exception(queued)
            raise
        finally:
            tape.task = None
            if self._tapes.get(tape.name) is tape:
                del self._tapes[tape.name]

    async def close(self) -> None:
        """Refuse new appends and flush the queued ones (the store is still open); no task is left.

        Cancelled while flushing, it cancels the flushers, whose waiting callers get AppendInterrupted.
        """
        self._closing = True
        while True:
            tasks = [t.task for t in self._tapes.values() if t.task is not None]
            if not tasks:
                return
            try:
                await asyncio.wait(tasks)
            except asyncio.CancelledError:
                for task in tasks:
                    task.cancel()
                await asyncio.wait(tasks)
                raise
