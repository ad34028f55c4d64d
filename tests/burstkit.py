"""Many messages stored through the engine's own routing and `store.enqueue`, 1,000 per transaction:
a big table in a second (one `app.emit` each would take far longer)."""
from __future__ import annotations

from typing import Any

from engine import payloads as codec
from engine.emitting import rows_for


async def emit_many(app: Any, sig: Any, payloads: list[Any], key: str | None = None) -> list[str]:
    """Emit `payloads` to `sig` for the flows bound to it in `app`'s manifest; the message ids."""
    flows = [f.name for f in app.manifest.signal_flows.get(sig.name, [])]
    ids: list[str] = []
    for start in range(0, len(payloads), 1000):
        rows = []
        for value in payloads[start:start + 1000]:
            msg_id, new_rows = rows_for(sig, codec.encode(sig, value), key, None, flows)
            ids.append(msg_id)
            rows += new_rows
        await app.store.enqueue(rows)
    return ids
