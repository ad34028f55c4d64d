"""Per-process fan-out of live tapes: one reader per tape, many SSE streams.

A thousand connected clients must not mean a thousand queries per event. Each
process keeps one `TapeHub` per tape with subscribers: it reads new events once
(woken by local appends, by NOTIFY on PostgreSQL, by WAL changes on SQLite, and
by a slow poll as a fallback) and hands each batch to every subscriber's queue.
A subscriber too slow to keep up is dropped; its client resumes by id.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from sqlalchemy import Connection

from ..store import Store
from . import tape

log = logging.getLogger("engine.live.hub")
FALLBACK_POLL_S = 1.0
WAL_POLL_S = 0.02
QUEUE_BATCHES = 256
# Pacing: with many subscribers every read costs one socket write per subscriber, so reads are spaced
# by PACE_PER_SUBSCRIBER_S per subscriber (capped at PACE_MAX_S): at 1,000 streams and 200 events/s
# each write then carries ~4 events instead of 1, at most 20 ms later. A few streams are not paced.
PACE_PER_SUBSCRIBER_S = 0.00002
PACE_MAX_S = 0.02


DONE = "done"  # put in a queue when the server shuts down
RESET = "reset"  # put in every queue when the tape's epoch changed (wipe, restore)


class Subscription:
    """One stream's view of a hub: batches of events; None when dropped for being slow."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[list[tape.LiveItem] | None | str] = asyncio.Queue(QUEUE_BATCHES)
        self.dropped = False

    def end(self) -> None:
        """Tell the stream the server is shutting down."""
        try:
            self.queue.put_nowait(DONE)
        except asyncio.QueueFull:
            self.queue.get_nowait()
            self.queue.put_nowait(DONE)

    def offer(self, batch: list[tape.LiveItem] | str) -> None:
        if self.dropped:
            return
        try:
            self.queue.put_nowait(batch)
        except asyncio.QueueFull:
            self.dropped = True
            self.queue.get_nowait()
            self.queue.put_nowait(None)


class TapeHub:
    def __init__(self, store: Store, signal: str, on_empty: Callable[[TapeHub], None]) -> None:
        self.store = store
        self.signal = signal
        self.subscribers: set[Subscription] = set()
        self.wake = asyncio.Event()
        self.last_seq: int | None = None
        self.ready = asyncio.Event()  # set once last_seq is known: every later event will be offered
        self.epoch = ""
        self.on_empty = on_empty
        self.task: asyncio.Task[None] | None = None

    def subscribe(self) -> Subscription:
        """Join the hub. Once `ready` is set, every event after `last_seq` reaches the subscription;
        a stream replays the store at least through `last_seq` after waiting for `ready`."""
        sub = Subscription()
        self.subscribers.add(sub)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name=f"oke-hub:{self.signal}")
        return sub

    def pace_s(self) -> float:
        """The least time between two reads that offered events (grows with the fan-out)."""
        return min(PACE_MAX_S, PACE_PER_SUBSCRIBER_S * len(self.subscribers))

    def unsubscribe(self, sub: Subscription) -> None:
        self.subscribers.discard(sub)
        if not self.subscribers:
            if self.task is not None:
                self.task.cancel()
                self.task = None
            self.last_seq = None
            self.ready.clear()
            self.on_empty(self)

    async def _run(self) -> None:
        """Read and offer until the last subscriber leaves: pace, read, then wait for a wake-up."""
        wal = _WalWatch.of(self.store)
        loop = asyncio.get_running_loop()
        backoff = 0.1
        offered_at = -1.0
        while self.subscribers:
            pause = offered_at + self.pace_s() - loop.time()
            if pause > 0:
                await asyncio.sleep(pause)  # let events gather: one write per stream carries them all
            self.wake.clear()  # before reading: an append that lands during the read wakes the next round
            try:
                offered = await self._read_round()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the store is away: keep the streams, retry
                await self._back_off(err, backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if offered is not None:
                offered_at = offered
            backoff = 0.1
            await self._idle(wal)

    async def _read_round(self) -> float | None:
        """Learn the head (first round), else offer what was appended; when it last offered events."""
        if self.last_seq is None:
            await self._load_head()
            return None
        return await self._catch_up(self.last_seq)

    async def _load_head(self) -> None:
        """The tape's head and epoch: from now on every later event is offered (`ready`)."""
        state = await self.store.read(lambda c: tape.state(c, self.signal))
        self.last_seq = state.head if state else 0
        self.epoch = state.epoch if state else ""
        self.ready.set()

    async def _catch_up(self, after: int) -> float | None:
        """Offer every event after `after` to every subscriber, page by page; the loop time of the
        last offer (None when there was nothing new)."""
        loop = asyncio.get_running_loop()
        offered_at: float | None = None
        while True:
            epoch, head, events = await self.store.read(_since(self.signal, after))
            if epoch is not None and epoch != self.epoch:
                self._reset(epoch)
                if head < after:  # a restore may have rolled the head back
                    self.last_seq = after = head
                    continue
            if not events:
                return offered_at
            self.last_seq = after = events[-1].seq
            batch = tape.items(self.epoch, events)
            for sub in list(self.subscribers):
                sub.offer(batch)
            offered_at = loop.time()

    def _reset(self, epoch: str) -> None:
        """Wiped or restored: label new events with the new epoch, and tell every stream; those still
        on the old epoch end, so their clients learn of the reset (410) now rather than at the next event."""
        self.epoch = epoch
        for sub in list(self.subscribers):
            sub.offer(RESET)

    async def _back_off(self, err: Exception, backoff: float) -> None:
        log.warning("live tape %s: read failed (%s); retrying in %.1fs", self.signal, err, backoff)
        # a wake-up (a local append, the LISTEN connection back) ends the back-off early:
        # after a long outage the streams must not wait up to 5 s more for the first read
        try:
            await asyncio.wait_for(self.wake.wait(), backoff)
        except TimeoutError:
            pass

    async def _idle(self, wal: _WalWatch) -> None:
        """Until a wake-up, a change of the SQLite WAL (another process appended), or the fallback poll."""
        waited = 0.0
        step = WAL_POLL_S if wal.path else FALLBACK_POLL_S
        while not self.wake.is_set() and waited < FALLBACK_POLL_S:
            try:
                await asyncio.wait_for(self.wake.wait(), step)
            except TimeoutError:
                waited += step
                if wal.changed():
                    return


def _since(signal: str, after: int) -> Callable[[Connection], tuple[str | None, int, list[tape.TapeEvent]]]:
    return lambda conn: tape.read_since(conn, signal, after)


class _WalWatch:
    """On SQLite, the WAL file's (mtime, size): a change means another process may have appended."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.seen = _stat(path)

    @classmethod
    def of(cls, store: Store) -> _WalWatch:
        db = getattr(store, "path", None)
        return cls(db + "-wal" if store.dialect == "sqlite" and db else None)

    def changed(self) -> bool:
        if self.path is None:
            return False
        now = _stat(self.path)
        if now == self.seen:
            return False
        self.seen = now
        return True


def _stat(path: str | None) -> tuple[int, int]:
    if path is None:
        return (0, 0)
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


class HubRegistry:
    """The hubs of one store in this process, woken by appends and notifications."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.hubs: dict[str, TapeHub] = {}
        store.on_notify(tape.TAPE_CHANNEL, self._on_notify)

    def hub(self, signal: str) -> TapeHub:
        found = self.hubs.get(signal)
        if found is None:
            found = self.hubs[signal] = TapeHub(self.store, signal, self._forget)
        return found

    def _forget(self, hub: TapeHub) -> None:
        if self.hubs.get(hub.signal) is hub:
            del self.hubs[hub.signal]

    def wake(self, signal: str) -> None:
        hub = self.hubs.get(signal)
        if hub is not None:
            hub.wake.set()

    def _on_notify(self, payload: str) -> None:
        if not payload:  # the LISTEN connection came back: anything may have happened
            for hub in self.hubs.values():
                hub.wake.set()
            return
        _head, _, signal = payload.partition(" ")
        self.wake(signal)

    def close(self) -> None:
        for hub in list(self.hubs.values()):
            if hub.task is not None:
                hub.task.cancel()
        self.hubs.clear()
