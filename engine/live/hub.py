"""Per-process fan-out of live tapes: one reader per tape, many SSE streams.

A thousand connected clients must not mean a thousand queries per event. Each
process keeps one `TapeHub` per tape with subscribers: it reads new events once
(woken through `store.tape_waker`: by local appends, by NOTIFY on PostgreSQL, by WAL
changes on SQLite, and by a slow poll as a fallback) and hands each batch to every subscriber's queue.
A subscriber too slow to keep up is dropped; its client resumes by id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial

from ..store import Store
from ..store.wake import Waker
from . import tape as live_tape

log = logging.getLogger("engine.live.hub")
FALLBACK_POLL_S = 1.0
QUEUE_BATCHES = 256
# Pacing: with many subscribers every read costs one socket write per subscriber, so reads are spaced
# by PACE_PER_SUBSCRIBER_S per subscriber (capped at PACE_MAX_S): at 1,000 streams and 200 events/s
# each write then carries ~4 events instead of 1, at most 20 ms later. A few streams are not paced.
PACE_PER_SUBSCRIBER_S = 0.00002
PACE_MAX_S = 0.02
READ_BATCH = 1000  # tape events per read; a full batch is followed by another read at once


DONE = "done"  # put in a queue when the server shuts down
RESET = "reset"  # put in every queue when the tape's epoch changed (wipe, restore)


class Subscription:
    """One stream's view of a hub: batches of events; None when dropped for being slow."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[list[live_tape.LiveItem] | None | str] = asyncio.Queue(QUEUE_BATCHES)
        self.dropped = False

    def end(self) -> None:
        """Tell the stream the server is shutting down."""
        try:
            self.queue.put_nowait(DONE)
        except asyncio.QueueFull:
            self.queue.get_nowait()
            self.queue.put_nowait(DONE)

    def offer(self, batch: list[live_tape.LiveItem] | str) -> None:
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
        self.waker: Waker | None = None  # while the reader runs
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
        self.waker = waker = self.store.tape_waker(self.signal)
        try:
            await self._read_while_subscribed(waker)
        finally:
            waker.close()
            if self.waker is waker:
                self.waker = None

    async def _read_while_subscribed(self, waker: Waker) -> None:
        backoff = 0.1
        loop = asyncio.get_running_loop()
        offered_at = -1.0
        while self.subscribers:
            pause = offered_at + self.pace_s() - loop.time()
            if pause > 0:
                await asyncio.sleep(pause)  # let events gather: one write per stream carries them all
            waker.clear()  # before reading: an append that lands during the read wakes the next round
            try:
                if self.last_seq is None:
                    tape = await self.store.read(lambda c: live_tape.state(c, self.signal))
                    self.last_seq = tape.head if tape else 0
                    self.epoch = tape.epoch if tape else ""
                    self.ready.set()
                else:
                    while True:
                        after = self.last_seq
                        epoch, head, events = await self.store.read(
                            partial(live_tape.read_since, signal=self.signal, after_seq=after, limit=READ_BATCH)
                        )
                        if epoch is not None and epoch != self.epoch:
                            # wiped or restored: label new events with the new epoch, and tell every
                            # stream; those still on the old epoch end, so their clients learn of the
                            # reset (410) now rather than at the next event
                            self.epoch = epoch
                            for sub in list(self.subscribers):
                                sub.offer(RESET)
                            if head < self.last_seq:  # a restore may have rolled the head back
                                self.last_seq = head
                                continue
                        if not events:
                            break
                        self.last_seq = events[-1].seq
                        batch = live_tape.items(self.epoch, events)
                        for sub in list(self.subscribers):
                            sub.offer(batch)
                        offered_at = loop.time()
                        if len(events) < READ_BATCH:
                            break  # caught up: what lands next wakes the next, paced, round
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the store is away: keep the streams, retry
                log.warning("live tape %s: read failed (%s); retrying in %.1fs", self.signal, err, backoff)
                # a wake-up (a local append, the LISTEN connection back) ends the back-off early:
                # after a long outage the streams must not wait up to 5 s more for the first read
                try:
                    await asyncio.wait_for(waker.event.wait(), backoff)
                except TimeoutError:
                    pass
                backoff = min(backoff * 2, 5.0)
                continue
            await waker.wait(FALLBACK_POLL_S)


class HubRegistry:
    """The hubs of one store in this process, woken by appends and notifications."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.hubs: dict[str, TapeHub] = {}

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
        if hub is not None and hub.waker is not None:
            hub.waker.wake()

    def close(self) -> None:
        for hub in list(self.hubs.values()):
            if hub.task is not None:
                hub.task.cancel()
        self.hubs.clear()
