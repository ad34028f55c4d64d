"""A tiny deterministic shop the console tests populate a store with (and drain in a subprocess).

`python -m console_workers.shop URL drain` boots the same flows in a second process and
delivers whatever is eligible, exactly as a separate worker deployment would.
"""
from __future__ import annotations

import asyncio
import sys
from typing import Any

import engine
from engine import flow, http, oke, on, signal


class Refused(Exception):
    code = "REFUSED"


def declare() -> dict[str, Any]:
    """Forget earlier declarations in this process, then declare the shop afresh."""
    engine.reset()
    orders = signal.once("orders.placed", retries=1)
    emails = signal.once("tasks.email", retries=1)
    status = signal.live("order-status", retention={"max_count": 500})

    @on(orders)
    @flow("workers.orders")
    async def fulfil(order: Any, fx: Any) -> None:
        await fx.emit(emails, {"to": order["to"], "n": order["n"]}, key=order["to"])
        await fx.emit(status, {"orderId": f"o{order['n']}", "status": "paid"})

    @on(emails)
    @flow("workers.email")
    async def send(mail: Any, fx: Any) -> None:
        if mail["to"].endswith("@bounce.test") and not mail.get("fixed"):
            raise Refused(f"{mail['to']} refused the message")

    on(http.live(status).public())
    return {"orders": orders, "emails": emails, "status": status}


async def populate(url: str, orders: int = 6, bounces: int = 2) -> None:
    """Orders; every `orders // bounces`-th goes to a bouncing address and ends dead."""
    sigs = declare()
    async with oke("shop", database_url=url) as app:
        for n in range(orders):
            to = f"user{n}@bounce.test" if n < bounces else f"user{n}@example.com"
            await app.emit(sigs["orders"], {"n": n, "to": to})
        await app.drain()


async def drain(url: str) -> None:
    declare()
    async with oke("shop", database_url=url) as app:
        await app.drain()


if __name__ == "__main__":
    asyncio.run(drain(sys.argv[1]))
