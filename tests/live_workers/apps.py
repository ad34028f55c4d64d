"""Declarations shared by the test process and the subprocess scripts (the same app code in each)."""
from __future__ import annotations

from engine import Unauthorized, flow, gate, http, on, signal

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def bearer(request):
    if request.headers.get("authorization") != f"Bearer {TOKEN}":
        raise Unauthorized("missing or wrong token")
    return {"user": "ops"}


def declare_shop(public: bool = False):
    """`order-status` behind a gated firehose and a gated per-order exposure (or public ones)."""
    status = signal.live("order-status")
    route = http.live(status)
    on(route.public() if public else route.gate(gate("member", bearer)))
    orders = http.get("/orders/:orderId/events")
    on((orders.public() if public else orders.gate(gate("member", bearer))).live(status))
    return status


class PurgeFailed(Exception):
    code = "E_PURGE"


def declare_catalog(record=None):
    """A broadcast with two flows; `cache.purge` fails on payloads with "fail": true.

    `record(flow, payload, attempt)` is called on every handler call.
    """
    changed = signal.broadcast("catalog.changed", retries=1)

    @on(changed)
    @flow("search.index")
    async def index(payload, fx):
        if record:
            record("search.index", payload, fx.attempt)

    @on(changed)
    @flow("cache.purge")
    async def purge(payload, fx):
        if record:
            record("cache.purge", payload, fx.attempt)
        if payload.get("fail"):
            raise PurgeFailed(f"purge {payload['n']} failed on attempt {fx.attempt}")

    return changed
