"""Which rows an emit writes: one for a once message, one per flow for a broadcast.

The emit path's delivery rule, between the app (which validated the payload and found the flows)
and the store (which writes the rows as they are): neither a live tape's concern nor persistence.
"""

from __future__ import annotations

from .ids import new_id, now_ms
from .signals import Signal
from .store import NewMessage, queue_name


def rows_for(
    signal: Signal,
    payload: str,
    key: str | None,
    parent_run_id: str | None,
    flows: list[str],
    traceparent: str | None = None,
) -> tuple[str, list[NewMessage]]:
    """The message id to return and the rows to store for one emit.

    A broadcast copy gets its own id per flow (each has its own attempts and
    dead letter); the first copy's id is returned. A once message gets one row
    whether or not a worker is bound yet (an optional signal may be consumed later).
    """
    created = now_ms()
    if signal.kind == "once":
        ids = [new_id("msg_")]
        targets: list[str | None] = [flows[0] if flows else None]
    else:
        targets = list(flows)
        ids = [new_id("msg_") for _ in targets]
    rows = [
        NewMessage(
            id=msg_id,
            signal=signal.name,
            queue=queue_name(signal.name, flow, signal.kind),
            flow=flow,
            key=key,
            payload=payload,
            retries=signal.retries,
            dead_letter=signal.dead_letter,
            parent_run_id=parent_run_id,
            created_at=created,
            traceparent=traceparent,
        )
        for msg_id, flow in zip(ids, targets, strict=False)
    ]
    return (ids[0] if ids else new_id("msg_")), rows
