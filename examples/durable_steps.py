"""Durable flows: `fx.step` runs its function once per message, even across retries.

    python examples/durable_steps.py

The first attempt charges the card (a step), then fails while sending the receipt; the retry gets
the recorded charge back instead of charging a second time.
"""
from __future__ import annotations

import asyncio

from engine import flow, oke, on, signal

checkout = signal.once("steps.checkout", retries=1)
charges: list[str] = []


def charge_card(order_id: str) -> dict:
    charges.append(order_id)
    return {"charge_id": f"ch_{order_id}", "amount": 42}


@on(checkout)
@flow("steps.checkout", durable=True)
async def run_checkout(payload: dict, fx) -> None:
    charge = await fx.step("charge", lambda: charge_card(payload["order_id"]))
    if fx.attempt == 1:
        raise ConnectionError("mail server away")  # fails after the step: the message is retried
    print(f"attempt {fx.attempt}: receipt for {charge['charge_id']} ({charge['amount']})")


async def main() -> None:
    async with oke("steps") as app:
        await app.emit(checkout, {"order_id": "o1"})
        await app.drain()
    print(f"the card was charged {len(charges)} time(s)")


if __name__ == "__main__":
    asyncio.run(main())
