"""Thousands of `once` messages stored through `store.enqueue` in batches of 1,000: a big table in a
second, for tests about plans and statistics (one `app.emit` each would take far longer)."""
from __future__ import annotations

from typing import Any

from engine import payloads as codec
from engine.bus.routing import rows_for


async def enqueue_burst(app: Any, signal: Any, count: int, flow_name: str) -> None:
    """Store `count` messages of `signal` (payloads 0 … count-1) for the flow `flow_name`."""
    for start in range(0, count, 1000):
        rows = []
        for n in range(start, min(start + 1000, count)):
            rows += rows_for(signal, codec.encode(signal, n), None, None, [flow_name])[1]
        await app.store.enqueue(rows)
