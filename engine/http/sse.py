"""The body of one SSE stream: replay after a cursor from the store, then live from the hub.

Frames are `id: <id>` + `data: <json>` + a blank line. A heartbeat goes out when
nothing was sent for HEARTBEAT_S: a comment on a plain stream, an id-only frame
with the head id on a filtered one (it moves the client's cursor past events it
filtered out). On shutdown the stream ends with `data: [DONE]`.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable

from ..bus import live
from ..bus.hub import DONE, RESET, HubRegistry, Subscription
from ..store import Store
from .routes import param_text

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


def param_match(params: dict[str, str]) -> Match | None:
    """Forward an event when every path param present on the payload equals the request's value."""
    if not params:
        return None

    def match(value: Any) -> bool:
        if not isinstance(value, dict):
            return True
        for name, wanted in params.items():
            if name in value and param_text(value[name]) != wanted:
                return False
        return True

    return match


def _accept(match: Match | None, value: Any) -> bool:
    if match is None:
        return True
    try:
        return bool(match(value))
    except Exception:  # a user's match that raises filters the event out, never kills the stream
        return False


REPLAY_BATCH = 1000


def _frames(epoch: str, events: list[live.TapeEvent], match: Match | None) -> bytes:
    """The frames of stored events as one chunk: built straight from the stored JSON when there is
    no filter (no decode per event), else decoded once each to ask `match`."""
    if match is None:
        return "".join(f"id: {epoch}.{ev.seq}\ndata: {ev.payload}\n\n" for ev in events).encode()
    return b"".join(item.frame for item in live.items(epoch, events) if _accept(match, item.value))


async def _pages(store: Store, signal: str, epoch: str, after: int, match: Match | None,
                 until: int | None = None) -> AsyncIterator[tuple[int, bytes]]:
    """(seq of the page's last event, its frames that pass `match`) per stored page after `after`
    (through `until`): one chunk per page, since a write per frame is what a replay costs."""
    while True:
        events = await store.read(lambda c: live.read_after(c, signal, after, REPLAY_BATCH))
        kept = events if until is None else [ev for ev in events if ev.seq <= until]
        if kept:
            after = kept[-1].seq
            yield after, _frames(epoch, kept, match)
        if len(events) < REPLAY_BATCH or len(kept) < len(events):
            return  # a short page is the end of what was committed when it was read


_NOTHING: Any = object()  # no marker held back by _drain (None is a marker: dropped)


def _drain(sub: Subscription, first: list[live.LiveItem]) -> tuple[list[list[live.LiveItem]], Any]:
    """`first` and every batch already waiting behind it, so they go out in one write; a marker
    (DONE, RESET, None for dropped) met on the way is returned, to be handled after them."""
    batches = [first]
    while not sub.queue.empty():
        more = sub.queue.get_nowait()
        if not isinstance(more, list):
            return batches, more
        batches.append(more)
    return batches, _NOTHING


async def live_stream(store: Store, hubs: HubRegistry, control: StreamControl, signal: str, epoch: str,
                      after_seq: int, match: Match | None, *, heartbeat_s: float = HEARTBEAT_S,
                      first_page: list[live.TapeEvent] | None = None, page_head: int = 0
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
    loop = asyncio.get_running_loop()
    hub = hubs.hub(signal)
    sub = hub.subscribe()
    control.subscriptions.add(sub)
    last = after_seq
    sent_at = loop.time()
    held: Any = _NOTHING  # a marker _drain met after the batches it sent
    try:
        # The hub offers every event after its `last_seq` from the moment it is ready; replaying the
        # store after that moment covers everything up to it, so no event falls between the two.
        await hub.ready.wait()
        replay_from: int | None = last
        if first_page is not None:
            if first_page:
                last = first_page[-1].seq
                chunk = _frames(epoch, first_page, match)
                if chunk:
                    sent_at = loop.time()
                    yield chunk
            if len(first_page) < REPLAY_BATCH:
                last = max(last, page_head)  # the page held everything committed up to its head
                # the hub offers what follows its last_seq; the store fills anything in between
                replay_from = last if (hub.last_seq or 0) > last else None
            else:
                replay_from = last
        if replay_from is not None:
            async for last, chunk in _pages(store, signal, epoch, replay_from, match):
                if chunk:
                    sent_at = loop.time()
                    yield chunk
                if control.closing:
                    break
        while not control.closing:
            batch: list[live.LiveItem] | str | None
            if held is not _NOTHING:
                batch, held = held, _NOTHING
            else:
                wait = sent_at + heartbeat_s - loop.time()
                try:
                    if wait <= 0:
                        raise TimeoutError
                    async with asyncio.timeout(wait):
                        batch = await sub.queue.get()
                except TimeoutError:
                    sent_at = loop.time()
                    yield f"id: {epoch}.{last}\n\n".encode() if match is not None and last else b":\n\n"
                    continue
            if batch == DONE:
                break
            if batch == RESET:
                if hub.epoch != epoch:
                    break  # the tape was reset under this stream: end it; the client's resume gets 410 reset
                continue
            if batch is None:  # too slow for the hub: rejoin, and catch up from the store
                old_hub, old = hub, sub
                hub = hubs.hub(signal)  # the registry's hub, even if the old one was forgotten
                sub = hub.subscribe()  # join before leaving, so a shared hub keeps its reader
                control.subscriptions.add(sub)
                control.subscriptions.discard(old)
                old_hub.unsubscribe(old)
                await hub.ready.wait()
                async for last, chunk in _pages(store, signal, epoch, last, match):
                    if chunk:
                        sent_at = loop.time()
                        yield chunk
                continue
            assert isinstance(batch, list)
            batches, held = _drain(sub, batch)
            parts: list[bytes] = []
            reset = False
            for items in batches:
                if not items[0].id.startswith(f"{epoch}."):
                    reset = True  # the tape was reset under this stream: end it (resume gets 410 reset)
                    break
                if items[-1].seq <= last:
                    continue
                if items[0].seq > last + 1:  # a hole between what was sent and the hub: fill from the store
                    if parts:
                        sent_at = loop.time()
                        yield b"".join(parts)
                        parts = []
                    async for last, chunk in _pages(store, signal, epoch, last, match, until=items[0].seq - 1):
                        if chunk:
                            sent_at = loop.time()
                            yield chunk
                for item in items:
                    if item.seq > last:
                        last = item.seq
                        if _accept(match, item.value):
                            parts.append(item.frame)
            if parts:
                sent_at = loop.time()
                yield b"".join(parts)
            if reset:
                break
        yield DONE_FRAME
    finally:
        control.subscriptions.discard(sub)
        hub.unsubscribe(sub)
