"""The bundled demo: a small shop running embedded, producing traffic with some failures.

Orders are placed every few hundred milliseconds; each order sends an e-mail
(some fail, a few always fail and go dead), publishes its status on the
`order-status` live tape (gated firehose + a filtered per-order route), and now
and then the catalog changes (a broadcast to two flows). Everything runs on the
same store the console reads.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

import engine
from engine import OkeApp, Unauthorized, flow, gate, oke, on, signal

DEMO_TOKEN = "demo-token"
CUSTOMERS = ["ada", "grace", "linus", "barbara", "ken", "margaret", "dennis", "radia"]


class Order(BaseModel):
    order_id: str
    customer: str
    total_cents: int


class Email(BaseModel):
    to: str
    subject: str
    body: str


class SmtpTimeout(Exception):
    code = "SMTP_TIMEOUT"


class MailboxFull(Exception):
    code = "MAILBOX_FULL"


def bearer(request: Any) -> dict[str, str]:
    if (
        request.headers.get("authorization") != f"Bearer {DEMO_TOKEN}"
        and request.query_params.get("token") != DEMO_TOKEN
    ):
        raise Unauthorized("missing or wrong token (the demo's is Bearer demo-token)")
    return {"user": "demo"}


def declare(rng: random.Random) -> tuple[Any, ...]:
    """Declare the demo's signals, flows and routes; returns the signals."""
    orders = signal.once("orders.placed", schema=Order, retries=2, description="New orders to fulfil")
    emails = signal.once("tasks.email", schema=Email, retries=2, description="Transactional e-mail")
    catalog = signal.broadcast("catalog.changed", description="Catalog edits, fanned out")
    status = signal.live(
        "order-status", retention={"max_age": "1h", "max_count": 5000}, description="Order status updates for browsers"
    )

    @on(orders)
    @flow("workers.orders")
    async def fulfil(order: Order, fx: Any) -> None:
        await asyncio.sleep(rng.uniform(0.005, 0.05))
        await fx.emit(status, {"orderId": order.order_id, "status": "paid"})
        domain = "bounce.test" if order.customer == "dennis" else "example.com"
        await fx.emit(
            emails,
            {
                "to": f"{order.customer}@{domain}",
                "subject": f"Order {order.order_id}",
                "body": f"Thanks! Total {order.total_cents / 100:.2f}",
            },
            key=order.customer,
        )
        if rng.random() < 0.5:
            await fx.emit(status, {"orderId": order.order_id, "status": "shipped"})

    @on(emails)
    @flow("workers.email")
    async def send(mail: Email, fx: Any) -> None:
        await asyncio.sleep(rng.uniform(0.005, 0.03))
        if mail.to.endswith("@bounce.test"):
            raise MailboxFull(f"{mail.to}: mailbox full")
        if rng.random() < 0.15:
            raise SmtpTimeout("smtp.example.com:587 timed out after 10s")

    on(catalog, flow("search.reindex", do=lambda change, fx: None))

    @on(catalog)
    @flow("cache.purge")
    async def purge_cache(change: Any, fx: Any) -> None:
        if rng.random() < 0.1:
            raise RuntimeError("cache node unreachable")

    member = gate("member", bearer)
    # engine.http, the public route builder (a `from engine import http` reads as the engine.http package)
    on(engine.http.live(status).gate(member))
    on(engine.http.get("/orders/:orderId/events").gate(member).live(status))
    return orders, emails, catalog, status


async def produce(app: OkeApp, orders: Any, catalog: Any, rng: random.Random, stop: asyncio.Event) -> None:
    """Place an order every 150–600 ms and change the catalog every few seconds."""
    n = 0
    while not stop.is_set():
        n += 1
        customer = rng.choice(CUSTOMERS)
        await app.emit(
            orders,
            {"order_id": f"ord_{n:05d}", "customer": customer, "total_cents": rng.randint(500, 25_000)},
            key=customer,
        )
        if n % 12 == 0:
            await app.emit(catalog, {"sku": f"sku_{rng.randint(1, 99):02d}", "change": "price"})
        try:
            await asyncio.wait_for(stop.wait(), rng.uniform(0.15, 0.6))
        except TimeoutError:
            pass


class DemoRunner:
    """The demo app, its HTTP server and its producer, started and stopped together."""

    def __init__(self, database_url: str | None, port: int, seed: int | None = None) -> None:
        engine.reset()
        self.rng = random.Random(seed)
        self.orders, _emails, self.catalog, _status = declare(self.rng)
        self.app = oke("demo-shop", database_url=database_url, lease_ms=10_000)
        self.port = port
        self.stop_event = asyncio.Event()
        self.tasks: list[asyncio.Task[Any]] = []

    async def start(self) -> None:
        await self.app.start()
        self.tasks = [
            asyncio.create_task(self.app.serve(port=self.port, concurrency=4), name="demo-serve"),
            asyncio.create_task(
                produce(self.app, self.orders, self.catalog, self.rng, self.stop_event), name="demo-producer"
            ),
        ]

    async def stop(self) -> None:
        self.stop_event.set()
        await self.app.stop()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.app.close()


async def run_headless(
    database_url: str | None, seconds: float | None, port: int, announce: Callable[[], None] | None = None
) -> None:
    """Run the demo without the TUI for `seconds` (None: until cancelled); `announce` runs once it is up."""
    runner = DemoRunner(database_url, port)
    await runner.start()
    if announce is not None:
        announce()
    try:
        if seconds is None:
            await asyncio.Event().wait()
        else:
            await asyncio.sleep(seconds)
    finally:
        await runner.stop()
