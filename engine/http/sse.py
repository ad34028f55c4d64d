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
from ..bus.hub import DONE, HubRegistry, Subscription
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


async def _replay(store: Store, signal: str, epoch: str, after: int, until: int | None = None
                  ) -> AsyncIterator[live.LiveItem]:
    while True:
        events = await store.read(lambda c: live.read_after(c, signal, after))
        if not events:
            return
        for item in live.items(epoch, events):
            if until is not None and item.seq > until:
                return
            after = item.seq
            yield item


async def live_stream(store: Store, hubs: HubRegistry, control: StreamControl, signal: str, epoch: str,
                      after_seq: int, match: Match | None) -> AsyncIterator[bytes]:
    """Every retained event after `after_seq` that passes `match`, then live ones, without a hole."""
    hub = hubs.hub(signal)
    sub = hub.subscribe()
    control.subscriptions.add(sub)
    last = after_seq
    try:
        async for item in _replay(store, signal, epoch, last):
            last = item.seq
            if _accept(match, item.value):
                yield item.frame
            if control.closing:
                break
        while not control.closing:
            try:
                async with asyncio.timeout(HEARTBEAT_S):
                    batch = await sub.queue.get()
            except TimeoutError:
                yield f"id: {epoch}.{last}\n\n".encode() if match is not None and last else b":\n\n"
                continue
            if batch == DONE:
                break
            if batch is None:  # too slow for the hub: rejoin, and fill the hole from the store
                hub.unsubscribe(sub)
                control.subscriptions.discard(sub)
                sub = hub.subscribe()
                control.subscriptions.add(sub)
                continue
            assert isinstance(batch, list)
            if batch[-1].seq <= last:
                continue
            if batch[0].seq > last + 1:
                async for item in _replay(store, signal, epoch, last, until=batch[0].seq - 1):
                    last = item.seq
                    if _accept(match, item.value):
                        yield item.frame
            for item in batch:
                if item.seq > last:
                    last = item.seq
                    if _accept(match, item.value):
                        yield item.frame
        yield DONE_FRAME
    finally:
        control.subscriptions.discard(sub)
        hub.unsubscribe(sub)
