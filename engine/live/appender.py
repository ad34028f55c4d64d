"""Group commit for live tapes: concurrent emits on one tape share one append transaction.

One `store.write` per emit costs one fsync on SQLite (every commit is synced) and one round trip on
PostgreSQL; at a few hundred emits/s they queue behind each other and emit→receive latency grows
to seconds. Here the first emit on a tape starts a flusher task; emits that arrive while it
commits wait in the tape's queue, and its next transaction takes them all (up to MAX_BATCH, so one
transaction stays short). Nothing waits for a timer: a lone emit commits at once.

Ids follow queue order (one `tape.append` assigns consecutive seqs in that order), so a caller
that emitted first gets the smaller id. A store error reaches every caller of the batch it hit;
later batches are tried anew. A caller cancelled before its batch was taken is left out (its event
is not stored); one cancelled later just does not hear the result. The flusher runs in its own
task, so a caller's cancellation never interrupts a transaction that carries other callers' events.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..errors import StoreUnavailable
from ..signals import Signal
from ..store import Store
from . import tape

log = logging.getLogger("engine.live.appender")
MAX_BATCH = 500


class AppendInterrupted(StoreUnavailable):
    """The app closed while an append was queued or in flight: it was not (or may not be) stored."""


@dataclass(slots=True)
class _Pending:
    signal: Signal
    payload: str
    parent_run_id: str | None
    future: asyncio.Future[str]


class _Lane:
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
        self._lanes: dict[str, _Lane] = {}
        self._closing = False

    async def append(self, signal: Signal, payload: str, parent_run_id: str | None) -> str:
        """The event's id once the transaction carrying it committed; else the store's error."""
        if self._closing:
            raise AppendInterrupted(f'emit("{signal.name}"): the app is closing, so the event was not stored')
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(signal.name)
        if lane is None:
            lane = self._lanes[signal.name] = _Lane(signal.name)
        pending = _Pending(signal, payload, parent_run_id, loop.create_future())
        lane.queue.append(pending)
        if lane.task is None:
            lane.task = loop.create_task(self._flush(lane), name=f"oke-append:{signal.name}")
        return await pending.future

    def _take(self, lane: _Lane) -> list[_Pending]:
        """The next batch: queued callers still waiting, in order, of one Signal object."""
        batch: list[_Pending] = []
        while lane.queue and len(batch) < self.max_batch:
            head = lane.queue[0]
            if batch and head.signal is not batch[0].signal:
                break  # another declaration of the same name (its retention may differ): next batch
            lane.queue.popleft()
            if not head.future.done():  # a caller cancelled while queued: its event is not stored
                batch.append(head)
        return batch

    async def _flush(self, lane: _Lane) -> None:
        """Commit the lane's queue batch by batch until it is empty, then leave (the next emit
        starts a new flusher)."""
        batch: list[_Pending] = []
        try:
            while lane.queue:
                batch = self._take(lane)
                if batch:
                    await self._commit(lane, batch)
                batch = []
        except BaseException:
            # cancelled (the app closed without waiting) or broken: nobody may wait forever
            _fail(
                batch,
                AppendInterrupted(
                    f'emit("{lane.name}"): the app closed before the store confirmed '
                    "the append, so the event may not be stored"
                ),
            )
            _fail(
                lane.queue,
                AppendInterrupted(
                    f'emit("{lane.name}"): the app closed before the event was appended, so it was not stored'
                ),
            )
            lane.queue.clear()
            raise
        finally:
            lane.task = None
            if self._lanes.get(lane.name) is lane:
                del self._lanes[lane.name]

    async def _commit(self, lane: _Lane, batch: list[_Pending]) -> None:
        """One transaction for the batch; each caller hears its id, or the store's error."""
        sig = batch[0].signal
        payloads = [p.payload for p in batch]
        parents = [p.parent_run_id for p in batch]
        try:
            ids = await self.store.write(lambda conn: tape.append(conn, sig, payloads, None, parents))
        except asyncio.CancelledError:
            raise
        except Exception as err:
            _fail(batch, err)
            return
        try:
            self.on_commit(lane.name)
        except Exception:  # a failed wake-up costs latency (the poll catches up), not events
            log.exception("live tape %s: waking the local streams failed", lane.name)
        for p, event_id in zip(batch, ids, strict=False):
            if not p.future.done():
                p.future.set_result(event_id)

    async def close(self) -> None:
        """Refuse new appends and flush the queued ones (the store is still open); no task is left.

        Cancelled while flushing, it cancels the flushers, whose waiting callers get AppendInterrupted.
        """
        self._closing = True
        while True:
            tasks = [t.task for t in self._lanes.values() if t.task is not None]
            if not tasks:
                return
            try:
                await asyncio.wait(tasks)
            except asyncio.CancelledError:
                for task in tasks:
                    task.cancel()
                await asyncio.wait(tasks)
                raise


def _fail(waiting: Iterable[_Pending], err: BaseException) -> None:
    """`err` to every caller in `waiting` still listening."""
    for p in waiting:
        if not p.future.done():
            p.future.set_exception(err)
