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
            if name in value and _text(value[name]) != wanted:
                return False
        return True

    return match


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _accept(match: Match | None, value: Any) -> bool:
    if match is None:
        return True
    try:
        return bool(match(value))
    except Exception:  # a user's match that raises filters the event out, never kills the stream
        return False


REPLAY_BATCH = 1000


async def _replay(store: Store, signal: str, epoch: str, after: int, until: int | None = None
                  ) -> AsyncIterator[live.LiveItem]:
    while True:
        events = await store.read(lambda c: live.read_after(c, signal, after, REPLAY_BATCH))
        for item in live.items(epoch, events):
            if until is not None and item.seq > until:
                return
            after = item.seq
            yield item
        if len(events) < REPLAY_BATCH:
            return  # a short page is the end of what was committed when it was read


async def live_stream(store: Store, hubs: HubRegistry, control: StreamControl, signal: str, epoch: str,
                      after_seq: int, match: Match | None, *, heartbeat_s: float = HEARTBEAT_S,
                      first_page: list[live.TapeEvent] | None = None, page_head: int = 0
                      ) -> AsyncIterator[bytes]:
    """Every retained event after `after_seq` that passes `match`, then live ones, without a hole.

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
    try:
        # The hub offers every event after its `last_seq` from the moment it is ready; replaying the
        # store after that moment covers everything up to it, so no event falls between the two.
        await hub.ready.wait()
        replay_from: int | None = last
        if first_page is not None:
            for item in live.items(epoch, first_page):
                last = item.seq
                if _accept(match, item.value):
                    sent_at = loop.time()
                    yield item.frame
            if len(first_page) < REPLAY_BATCH:
                last = max(last, page_head)  # the page held everything committed up to its head
                # the hub offers what follows its last_seq; the store fills anything in between
                replay_from = last if (hub.last_seq or 0) > last else None
            else:
                replay_from = last
        if replay_from is not None:
            async for item in _replay(store, signal, epoch, replay_from):
                last = item.seq
                if _accept(match, item.value):
                    sent_at = loop.time()
                    yield item.frame
                if control.closing:
                    break
        while not control.closing:
            wait = sent_at + heartbeat_s - loop.time()
            batch: list[live.LiveItem] | str | None
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
                async for item in _replay(store, signal, epoch, last):
                    last = item.seq
                    if _accept(match, item.value):
                        sent_at = loop.time()
                        yield item.frame
                continue
            assert isinstance(batch, list)
            if not batch[0].id.startswith(f"{epoch}."):
                break  # the tape was reset under this stream: end it; the client's resume gets 410 reset
            if batch[-1].seq <= last:
                continue
            if batch[0].seq > last + 1:
                async for item in _replay(store, signal, epoch, last, until=batch[0].seq - 1):
                    last = item.seq
                    if _accept(match, item.value):
                        sent_at = loop.time()
                        yield item.frame
            frames = []  # one write per batch: a socket write per frame per subscriber is the fan-out cost
            for item in batch:
                if item.seq > last:
                    last = item.seq
                    if _accept(match, item.value):
                        frames.append(item.frame)
            if frames:
                sent_at = loop.time()
                yield b"".join(frames)
        yield DONE_FRAME
    finally:
        control.subscriptions.discard(sub)
        hub.unsubscribe(sub)
