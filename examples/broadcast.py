"""Broadcast: every bound flow gets its own copy of each message.

    python examples/broadcast.py
"""
from __future__ import annotations

import asyncio

from engine import flow, oke, on, signal

catalog_changed = signal.broadcast("broadcast.catalog-changed")
done: list[str] = []


@on(catalog_changed)
@flow("broadcast.search-index")
async def reindex(payload: dict, fx) -> None:
    done.append(f"search index: reindex {payload['sku']}")


@on(catalog_changed)
@flow("broadcast.cache")
def drop_cache(payload: dict, fx) -> None:  # a sync handler runs in a thread
    done.append(f"cache: drop {payload['sku']}")


async def main() -> None:
    async with oke("broadcast") as app:
        await app.emit(catalog_changed, {"sku": "mug-01"})
        await app.drain()
    print("\n".join(sorted(done)))  # the two flows ran concurrently, in no fixed order


if __name__ == "__main__":
    asyncio.run(main())
