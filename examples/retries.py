"""Failures, retries and dead letters, read back through `engine.ops`.

    python examples/retries.py

A handler that raises fails the attempt; with retries=2 a message gets 3 attempts in all and then
becomes `dead`, keeping one failure record per attempt. `okconsole dlq retries.charge` lists it.
"""
from __future__ import annotations

import asyncio

from engine import flow, oke, on, ops, signal

charge = signal.once("retries.charge", retries=2)


class CardDeclined(Exception):
    code = "CARD_DECLINED"  # the failure code; without it the class name is the code


@on(charge)
@flow("retries.charge-card")
async def charge_card(payload: dict, fx) -> None:
    if payload["card"] == "4000-0000-0000-0002":
        raise CardDeclined(f"card {payload['card']} declined (attempt {fx.attempt})")
    print(f"charged {payload['amount']} to {payload['card']}")


async def main() -> None:
    async with oke("retries") as app:
        await app.emit(charge, {"card": "4242-4242-4242-4242", "amount": 10})
        bad = await app.emit(charge, {"card": "4000-0000-0000-0002", "amount": 99})
        await app.drain()
        detail = await ops.show(app.store, bad)
        print(f"{bad}: {detail.status} after {detail.attempts} attempts")
        for failure in detail.failures:
            print(f"  attempt {failure.attempt}: {failure.code}: {failure.message}")


if __name__ == "__main__":
    asyncio.run(main())
