"""A live tape over SSE: emit events, follow them with the Python client, resume by id.

    python examples/live_tape.py [PORT]

The app serves `GET /_oke/live/live.order-status` (the firehose) and `GET /orders/:orderId/events`
(one order's events), both behind a bearer-token gate. The client follows one order, stops after
two events, then resumes after the first with its id as the cursor.
"""
from __future__ import annotations

import asyncio
import sys

from engine import Unauthorized, gate, http, oke, on, signal
from engine.client import Client

TOKEN = "s3cret"
order_status = signal.live("live.order-status", retention={"max_age": "7d", "max_count": 10_000})


def bearer(request) -> dict:
    if request.headers.get("authorization") != f"Bearer {TOKEN}":
        raise Unauthorized("missing or wrong token")
    return {"user": "ops"}


member = gate("member", bearer)
on(http.live(order_status).gate(member))                                       # the firehose
on(http.get("/orders/:orderId/events").gate(member).live(order_status))        # one order's events


async def main(port: int) -> None:
    async with oke("live") as app:
        server = asyncio.create_task(app.serve(port=port))
        for status in ("paid", "packed", "shipped"):
            await app.emit(order_status, {"orderId": "o1", "status": status})
        await app.emit(order_status, {"orderId": "o2", "status": "paid"})  # filtered out below

        api = Client(f"http://127.0.0.1:{port}", token=TOKEN)
        seen = []
        async for event in api.stream(order_status, {"orderId": "o1"}):  # /orders/o1/events
            seen.append(event)
            print(event.id, event.data["status"])
            if len(seen) == 2:
                break
        async for event in api.stream(order_status, {"orderId": "o1"}, last_event_id=seen[0].id):
            print("resumed after", seen[0].id, "->", event.id, event.data["status"])
            break
        await app.stop()
        await server


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 6530))
