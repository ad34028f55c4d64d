"""The body of one SSE stream: replay after a cursor from the store, then live from the hub.

Frames are `id: <id>` + `data: <json>` + a blank line. A heartbeat goes out when
nothing was sent for HEARTBEAT_S: a comment on a plain stream, an id-only frame
with the head id on a filtered one (it moves the client's cursor past events it
filtered out). On shutdown the stream ends with `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from sqlalchemy import Connection

from ..store import Store
from . import tape
from .hub import DONE, RESET, HubRegistry, Subscription, TapeHub

HEARTBEAT_S = 15.0
DONE_FRAME = b"data: [DONE]\n\n"
Match = Callable[[Any], bool]


class StreamControl:
    """The open subscriptions of a server, so shutdown can end each with [DONE]."""

    def __init__(self) -> None:
        self.subscriptions: set[Subscription] = set()
        self.closing = False

    def close_all(self) -> None:
        self.closing = True
        for sub in list(self.subscriptions):
            sub.end()


def _accept(match: Match | None, value: Any) -> bool:
    if match is None:
        return True
    try:
        return bool(match(value))
    except Exception:  # a user's match that raises filters the event out, never kills the stream
        return False


REPLAY_BATCH = 1000


def _frames(epoch: str, events: list[tape.TapeEvent], match: Match | None) -> bytes:
    """The frames of stored events as one chunk: built straight from the stored JSON when there is
    no filter (no decode per event), else decoded once each to ask `match`."""
    if match is None:
        return "".join(f"id: {epoch}.{ev.seq}\ndata: {ev.payload}\n\n" for ev in events).encode()
    return b"".join(item.frame for item in tape.items(epoch, events) if _accept(match, item.value))


async def _pages(
    store: Store, signal: str, epoch: str, after: int, match: Match | None, until: int | None = None
) -> AsyncIterator[tuple[int, bytes]]:
    """(seq of the page's last event, its frames that pass `match`) per stored page after `after`
    (through `until`): one chunk per page, since a write per frame is what a replay costs."""
    while True:
        events = await store.read(_page_after(signal, after))
        kept = events if until is None else [ev for ev in events if ev.seq <= until]
        if kept:
            after = kept[-1].seq
            yield after, _frames(epoch, kept, match)
        if len(events) < REPLAY_BATCH or len(kept) < len(events):
            return  # a short page is the end of what was committed when it was read


def _page_after(signal: str, after: int) -> Callable[[Connection], list[tape.TapeEvent]]:
    return lambda conn: tape.read_after(conn, signal, after, REPLAY_BATCH)


_NOTHING: Any = object()  # no marker held back by _drain (None is a marker: dropped)


def _drain(sub: Subscription, first: list[tape.LiveItem]) -> tuple[list[list[tape.LiveItem]], Any]:
    """`first` and every batch already waiting behind it, so they go out in one write; a marker
    (DONE, RESET, None for dropped) met on the way is returned, to be handled after them."""
    batches = [first]
    while not sub.queue.empty():
        more = sub.queue.get_nowait()
        if not isinstance(more, list):
            return batches, more
        batches.append(more)
    return batches, _NOTHING


_HEARTBEAT = "heartbeat"  # what _Stream._next returns when nothing was written for heartbeat_s


async def live_stream(
    store: Store,
    hubs: HubRegistry,
    control: StreamControl,
    signal: str,
    epoch: str,
    after_seq: int,
    match: Match | None,
    *,
    heartbeat_s: float = HEARTBEAT_S,
    first_page: list[tape.TapeEvent] | None = None,
    page_head: int = 0,
) -> AsyncIterator[bytes]:
    """Every retained event after `after_seq` that passes `match`, then live ones, without a hole.

    Whatever is ready goes out as one chunk: a replay page, or every hub batch waiting in the
    queue. A write (ASGI send, socket write) per frame per subscriber was the fan-out cost.

    A heartbeat goes out whenever nothing was written for `heartbeat_s`, counted from the last
    write rather than the last batch: a filtered stream over a busy tape sends no events, and its
    client must still hear from it (and move its cursor to the head).

    `first_page` is the first replay page when the caller read it already (with the tape's head
    at that moment, `page_head`), saving a round of the store per connection.
    """
    stream = _Stream(store, hubs, control, signal, epoch, after_seq, match, heartbeat_s)
    try:
        # The hub offers every event after its `last_seq` from the moment it is ready; replaying the
        # store after that moment covers everything up to it, so no event falls between the two.
        await stream.hub.ready.wait()
        async with aclosing(stream.replay(first_page, page_head)) as replayed:
            async for chunk in replayed:
                yield chunk
        async with aclosing(stream.follow()) as followed:
            async for chunk in followed:
                yield chunk
        yield DONE_FRAME
    finally:
        stream.leave()


class _Stream:
    """One stream's state between its steps: its subscription, the last seq it passed on (`last`,
    sent or filtered out) and when it last wrote (`sent_at`, for the heartbeat)."""

    __slots__ = (
        "store",
        "hubs",
        "control",
        "signal",
        "epoch",
        "prefix",
        "match",
        "heartbeat_s",
        "loop",
        "hub",
        "sub",
        "last",
        "sent_at",
        "held",
        "reset",
    )

    def __init__(
        self,
        store: Store,
        hubs: HubRegistry,
        control: StreamControl,
        signal: str,
        epoch: str,
        after_seq: int,
        match: Match | None,
        heartbeat_s: float,
    ) -> None:
        self.store = store
        self.hubs = hubs
        self.control = control
        self.signal = signal
        self.epoch = epoch
        self.prefix = f"{epoch}."
        self.match = match
        self.heartbeat_s = heartbeat_s
        self.loop = asyncio.get_running_loop()
        self.hub, self.sub = self._join()
        self.last = after_seq
        self.sent_at = self.loop.time()
        self.held: Any = _NOTHING  # a marker _drain met after the batches it sent
        self.reset = False  # the tape was reset under this stream: it ends (the resume gets 410 reset)

    def _join(self) -> tuple[TapeHub, Subscription]:
        hub = self.hubs.hub(self.signal)  # the registry's hub, even if an older one was forgotten
        sub = hub.subscribe()
        self.control.subscriptions.add(sub)
        return hub, sub

    def leave(self) -> None:
        self.control.subscriptions.discard(self.sub)
        self.hub.unsubscribe(self.sub)

    def _sent(self, chunk: bytes) -> bytes:
        self.sent_at = self.loop.time()
        return chunk

    async def replay(self, first_page: list[tape.TapeEvent] | None, page_head: int) -> AsyncGenerator[bytes, None]:
        """The stored events after the cursor: the first page the caller read, then the store's pages
        as far as the hub may not have them."""
        replay_from: int | None = self.last
        if first_page is not None:
            if first_page:
                self.last = first_page[-1].seq
                chunk = _frames(self.epoch, first_page, self.match)
                if chunk:
                    yield self._sent(chunk)
            replay_from = self._after_first_page(len(first_page), page_head)
        if replay_from is not None:
            async for chunk in self._store_pages(replay_from, stop_on_close=True):
                yield chunk

    def _after_first_page(self, count: int, page_head: int) -> int | None:
        """Where the store's replay goes on after the first page; None when the hub covers the rest."""
        if count >= REPLAY_BATCH:
            return self.last
        self.last = max(self.last, page_head)  # the page held everything committed up to its head
        # the hub offers what follows its last_seq; the store fills anything in between
        return self.last if (self.hub.last_seq or 0) > self.last else None

    async def _store_pages(
        self, after: int, until: int | None = None, stop_on_close: bool = False
    ) -> AsyncIterator[bytes]:
        """The store's pages after `after` (through `until`), moving `last` page by page."""
        async for last, chunk in _pages(self.store, self.signal, self.epoch, after, self.match, until):
            self.last = last
            if chunk:
                yield self._sent(chunk)
            if stop_on_close and self.control.closing:
                return

    async def follow(self) -> AsyncGenerator[bytes, None]:
        """Hub batches as they come (every batch already waiting joins the same write), heartbeats
        between them, until the server closes, the tape is reset or the stream is told it is done."""
        while not self.control.closing:
            batch = await self._next()
            if isinstance(batch, list):
                batches, self.held = _drain(self.sub, batch)
                chunk, rest = self._collect(batches)
                if chunk:
                    yield self._sent(chunk)
                if rest:
                    async for chunk in self._fill(rest):
                        yield chunk
                if self.reset:
                    return
            elif batch == _HEARTBEAT:
                yield self._sent(
                    f"id: {self.epoch}.{self.last}\n\n".encode() if self.match is not None and self.last else b":\n\n"
                )
            elif batch is None:  # too slow for the hub: rejoin, and catch up from the store
                async for chunk in self._rejoin():
                    yield chunk
            elif batch == DONE or (batch == RESET and self.hub.epoch != self.epoch):
                return  # shutting down, or the tape was reset under this stream (the resume gets 410)

    async def _next(self) -> list[tape.LiveItem] | str | None:
        """The held marker, else the queue's next batch or marker, else _HEARTBEAT once nothing was
        written for heartbeat_s."""
        if self.held is not _NOTHING:
            batch: list[tape.LiveItem] | str | None = self.held
            self.held = _NOTHING
            return batch
        wait = self.sent_at + self.heartbeat_s - self.loop.time()
        if wait <= 0:
            return _HEARTBEAT
        try:
            async with asyncio.timeout(wait):
                return await self.sub.queue.get()
        except TimeoutError:
            return _HEARTBEAT

    def _collect(self, batches: list[list[tape.LiveItem]]) -> tuple[bytes, list[list[tape.LiveItem]]]:
        """The frames of `batches` as one chunk, up to the first batch that starts after a hole: that
        batch and the ones after it are returned, to follow once the store filled the hole."""
        parts: list[bytes] = []
        for index, items in enumerate(batches):
            if not items[0].id.startswith(self.prefix):
                self.reset = True
                break
            if items[-1].seq <= self.last:
                continue
            if items[0].seq > self.last + 1:
                return b"".join(parts), batches[index:]
            self._keep(items, parts)
        return b"".join(parts), []

    def _keep(self, items: list[tape.LiveItem], parts: list[bytes]) -> None:
        """The frames of the items after `last` that pass the match, added to `parts`."""
        last, match = self.last, self.match
        for item in items:
            if item.seq > last:
                last = item.seq
                if _accept(match, item.value):
                    parts.append(item.frame)
        self.last = last

    async def _fill(self, rest: list[list[tape.LiveItem]]) -> AsyncIterator[bytes]:
        """Each hole between what was sent and the hub's batches, from the store, then the batches."""
        while rest:
            async for chunk in self._store_pages(self.last, until=rest[0][0].seq - 1):
                yield chunk
            parts: list[bytes] = []
            self._keep(rest[0], parts)
            chunk, rest = self._collect(rest[1:])
            chunk = b"".join(parts) + chunk
            if chunk:
                yield self._sent(chunk)

    async def _rejoin(self) -> AsyncIterator[bytes]:
        """A new subscription (joined before the old one leaves, so a shared hub keeps its reader),
        then the store's pages from `last`."""
        old_hub, old = self.hub, self.sub
        self.hub, self.sub = self._join()
        self.control.subscriptions.discard(old)
        old_hub.unsubscribe(old)
        await self.hub.ready.wait()
        async for chunk in self._store_pages(self.last):
            yield chunk
