"""One app's live exposures for the two clients' shared rules (tests/test_client_rules.py for the
Python client, tests/test_browser_client.py for /_oke/client.js in Chromium).

The gate records every stream request it sees (path, Last-Event-ID, when), so a test sees exactly
what a client sent and how long it waited between tries; `BUSY` makes it answer 503 to the next N
stream requests, the way a server whose store is away does. The listing (`/_oke/exposures`) asks
the gate too, to filter what it shows; those calls are not recorded.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from starlette.responses import HTMLResponse, StreamingResponse

from engine import Unauthorized, flow, gate, http, on, signal
from engine.http.routes import HttpError

TOKEN = "s3cret"


@dataclass
class Seen:
    path: str
    last_event_id: str | None
    at: float


SEEN: list[Seen] = []
BUSY = {"left": 0}  # 503 to this many more stream requests


class Busy(HttpError):
    status = 503
    code = "StoreUnavailable"


def reset() -> None:
    SEEN.clear()
    BUSY["left"] = 0


def bearer(request):
    if request.url.path != "/_oke/exposures":
        SEEN.append(Seen(request.url.path, request.headers.get("last-event-id"), time.monotonic()))
        if BUSY["left"] > 0:
            BUSY["left"] -= 1
            raise Busy("the store is away (a test's gate says so)")
    if request.headers.get("authorization") != f"Bearer {TOKEN}":
        raise Unauthorized("missing or wrong token")
    return {"user": "ops"}


def bad_frames(_input, _fx):
    """A custom flow that serves SSE of its own: a JSON event, a frame that is not JSON, another
    JSON event, then heartbeats (so the stream stays healthy and open)."""

    async def body():
        yield 'id: x.1\ndata: {"n": 1}\n\n'
        yield "id: x.2\ndata: not json {\n\n"
        yield 'id: x.3\ndata: {"n": 3}\n\n'
        while True:
            yield ": heartbeat\n\n"
            await asyncio.sleep(0.2)

    return StreamingResponse(body(), media_type="text/event-stream")


def declare(retention=None, page=None):
    """order-status: a gated firehose, a gated `/orders/:orderId/events`, the public custom flow
    `orders.vip` (shipped events only) and the gated custom flow `orders.odd` (a non-JSON frame).
    `page` (HTML) is served at GET /page for the browser."""
    status = signal.live("order-status", retention=retention)
    member = gate("member", bearer)
    on(http.live(status).gate(member))
    on(http.get("/orders/:orderId/events").gate(member).live(status))
    on(http.get("/orders/vip/events").public().live(status),
       flow("orders.vip", do=lambda _in, fx: fx.live(status, match=lambda p: p.get("status") == "shipped")))
    on(http.get("/odd/events").gate(member).live(status), flow("orders.odd", do=bad_frames))
    if page is not None:
        on(http.get("/page").public(), flow("page", do=lambda _in, fx: HTMLResponse(page)))
    return status

