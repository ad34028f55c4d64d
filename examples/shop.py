"""A small shop to run with `okconsole serve`:

    cd examples && okconsole serve shop:app --port 6530

- `POST /orders` (bearer token) stores an order on the `shop.orders` once signal and answers its id;
- the `shop.fulfil` flow handles each order and publishes its progress on the `shop.order-status`
  live tape;
- `GET /orders/:orderId/events` streams one order's status events over SSE, and
  `GET /_oke/live/shop.order-status` all of them (both need the token);
- `GET /order` is a page (order_status.html) that shows an order's status live in a browser with
  the engine's module `/_oke/client.js`: open http://127.0.0.1:6530/order and press Follow.

Try it from another terminal:

    curl -s -H 'Authorization: Bearer shop-token' -H 'Content-Type: application/json' \\
         -d '{"orderId": "o1", "customer": "ada", "total_cents": 1250}' http://127.0.0.1:6530/orders
    curl -N -H 'Authorization: Bearer shop-token' http://127.0.0.1:6530/orders/o1/events

The store is OKE_DATABASE_URL, else .oke/oke.db in the current directory; the token is
SHOP_TOKEN, else "shop-token".
"""
from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

from starlette.responses import HTMLResponse

from engine import Unauthorized, flow, gate, http, oke, on, signal

TOKEN = os.environ.get("SHOP_TOKEN", "shop-token")


class Order(BaseModel):
    orderId: str = Field(min_length=1, max_length=100)
    customer: str
    total_cents: int = Field(ge=0)


orders = signal.once("shop.orders", schema=Order, retries=3, description="Orders to fulfil")
order_status = signal.live("shop.order-status", retention={"max_age": "7d", "max_count": 10_000},
                           description="Order progress, for browsers")


def bearer(request) -> dict:
    if request.headers.get("authorization") != f"Bearer {TOKEN}":
        raise Unauthorized("missing or wrong token")
    return {"user": "shop"}


member = gate("member", bearer)


@on(http.post("/orders", input=Order).gate(member))
@flow("shop.place-order")
async def place_order(order: Order, fx) -> dict:
    message_id = await fx.emit(orders, order.model_dump(), key=order.customer)  # per-customer order
    return {"orderId": order.orderId, "message": message_id}


@on(orders)
@flow("shop.fulfil")
async def fulfil(order: Order, fx) -> None:
    for status in ("paid", "shipped"):
        await fx.emit(order_status, {"orderId": order.orderId, "status": status})


on(http.live(order_status).gate(member))                                   # the firehose
on(http.get("/orders/:orderId/events").gate(member).live(order_status))    # one order's events


@on(http.get("/order").public())  # the page holds no data: the token is typed into it
@flow("shop.order-page")
def order_page(_input, _fx) -> HTMLResponse:
    return HTMLResponse((Path(__file__).parent / "order_status.html").read_text(encoding="utf-8"))

app = oke("shop")
