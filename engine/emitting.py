"""Which rows an emit writes: one for a once message, one per flow for a broadcast.

The emit path's delivery rule, between the app (which validated the payload and found the flows)
and the store (which writes the rows as they are): neither a live tape's concern nor persistence.
"""

from __future__ import annotations

from .ids import new_id, now_ms
from .signals import Signal
from .store import NewMessage, queue_name
from .timing import Schedule, check_dedupe, check_live_options, check_priority, schedule_of


def rows_for(
    signal: Signal,
    payload: str,
    key: str | None,
    parent_run_id: str | None,
    flows: list[str],
    options: tuple[Schedule, int, str | None] = (Schedule(), 0, None),
) -> tuple[str, list[NewMessage]]:
    """The message id to return and the rows to store for one emit.

    A broadcast copy gets its own id per flow (each has its own attempts and
    dead letter); the first copy's id is returned. A once message gets one row
    whether or not a worker is bound yet (an optional signal may be consumed later).
    `options` are the checked schedule, priority and dedupe key, the same on every copy.
    """
    schedule, priority, dedupe = options
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
            delay_ms=schedule.delay_ms,
            run_at=schedule.run_at,
            priority=priority,
            dedupe=dedupe,
        )
        for msg_id, flow in zip(ids, targets, strict=False)
    ]
    return (ids[0] if ids else new_id("msg_")), rows


def emit_options(
    signal: Signal, delay: object, at: object, dedupe: object, priority: object
) -> tuple[Schedule, int, str | None]:
    """The checked time and order options of one emit (TypeError / ValueError before any write)."""
    label = f'emit("{signal.name}")'
    schedule = schedule_of(label, delay, at)
    checked_priority = check_priority(label, priority)
    checked_dedupe = check_dedupe(label, dedupe)
    if signal.kind == "live":
        check_live_options(label, schedule, checked_priority, checked_dedupe)
    return schedule, checked_priority, checked_dedupe
