"""Which rows an emit writes: one for a once message, one per flow for a broadcast.

The emit path's delivery rule, between the app (which validated the payload and found the flows)
and the store (which writes the rows as they are): neither a live tape's concern nor persistence.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import zip_longest
from typing import Any

from . import payloads
from .errors import OkeError
from .ids import new_id, now_ms
from .signals import Signal
from .store import NewMessage, queue_name
from .store.base import check_key
from .timing import Schedule, check_dedupe, check_dedupe_for, check_live_options, check_priority, schedule_of

# when it is due, its priority, its dedupe key and how long that stays held after it finished
EmitOptions = tuple[Schedule, int, str | None, int | None]
PLAIN: EmitOptions = (Schedule(), 0, None, None)

MAX_KEY_LENGTH = 1000
_MISSING = object()


def check_emit_key(signal: Signal, key: object, what: str = "emit") -> None:
    """A key is a string of 1 to MAX_KEY_LENGTH characters that every backend stores alike."""
    if key is None:
        return
    if not isinstance(key, str):
        raise TypeError(f'{what}("{signal.name}", key=...): a key is a string, got {type(key).__name__}')
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise ValueError(f'{what}("{signal.name}", key=...): a key has 1 to {MAX_KEY_LENGTH} characters')
    check_key(signal.name, key)


def pairs_of(signal: Signal, items: Iterable[Any], keys: Iterable[str | None] | None) -> Iterator[tuple[Any, Any]]:
    """(payload, key) per payload of emit_many; ValueError when `keys` is not one per payload."""
    if isinstance(items, (str, bytes, dict)) or not isinstance(items, Iterable):
        raise TypeError(f'emit_many("{signal.name}", payloads): an iterable of payloads, got {type(items).__name__}')
    if keys is None:
        yield from ((item, None) for item in items)
        return
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
        raise TypeError(f'emit_many("{signal.name}", keys=...): an iterable of one key (or None) per payload')
    for index, (item, key) in enumerate(zip_longest(items, keys, fillvalue=_MISSING)):
        if item is _MISSING or key is _MISSING:
            more = "keys" if item is _MISSING else "payloads"
            raise ValueError(
                f'emit_many("{signal.name}"): keys must give one key (or None) per payload; '
                f"there are more {more} than {'payloads' if more == 'keys' else 'keys'} (from index {index})"
            )
        yield item, key


def rows_for_many(
    signal: Signal,
    items: Iterable[Any],
    keys: Iterable[str | None] | None,
    flows: list[str],
    max_bytes: int,
    traceparent: str | None = None,
    options: EmitOptions = PLAIN,
) -> tuple[list[str], list[NewMessage]]:
    """Every row of an emit_many, validated before any is written: a bad payload is OKE1250 naming
    its index, a bad key a TypeError / ValueError naming it, and nothing is stored."""
    ids: list[str] = []
    rows: list[NewMessage] = []
    for index, (item, key) in enumerate(pairs_of(signal, items, keys)):
        try:
            check_emit_key(signal, key, "emit_many")  # raises plain TypeError / ValueError only
        except (TypeError, ValueError) as err:
            raise type(err)(f"{err} (payload {index})") from None
        try:
            encoded = payloads.encode(signal, item, max_bytes)
        except OkeError as err:
            detail = err.data.get("detail", err.cause)
            raise OkeError.of(1250, resource=signal.name, detail=f"payload {index}: {detail}") from None
        msg_id, more = rows_for(signal, encoded, key, None, flows, options, traceparent)
        ids.append(msg_id)
        rows += more
    return ids, rows


def rows_for(
    signal: Signal,
    payload: str,
    key: str | None,
    parent_run_id: str | None,
    flows: list[str],
    options: EmitOptions = PLAIN,
    traceparent: str | None = None,
) -> tuple[str, list[NewMessage]]:
    """The message id to return and the rows to store for one emit.

    A broadcast copy gets its own id per flow (each has its own attempts and
    dead letter); the first copy's id is returned. A once message gets one row
    whether or not a worker is bound yet (an optional signal may be consumed later).
    `options` are the checked schedule, priority, dedupe key and window, the same on every copy.
    """
    schedule, priority, dedupe, dedupe_for_ms = options
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
            delay_ms=schedule.delay_ms,
            run_at=schedule.run_at,
            priority=priority,
            dedupe=dedupe,
            dedupe_for_ms=dedupe_for_ms,
        )
        for msg_id, flow in zip(ids, targets, strict=False)
    ]
    return (ids[0] if ids else new_id("msg_")), rows


def emit_options(
    signal: Signal,
    delay: object,
    at: object,
    dedupe: object,
    priority: object,
    what: str = "emit",
    dedupe_for: object = None,
) -> EmitOptions:
    """The checked time and order options of one emit (TypeError / ValueError before any write)."""
    if delay is at is dedupe is dedupe_for is None and type(priority) is int and priority == 0:
        return PLAIN  # no option: nothing to check (an idle emit runs this cold: docs/design/idle-path.md)
    label = f'{what}("{signal.name}")'
    schedule = schedule_of(label, delay, at)
    checked_priority = check_priority(label, priority)
    checked_dedupe = check_dedupe(label, dedupe)
    window = check_dedupe_for(label, dedupe_for, checked_dedupe)
    if signal.kind == "live":
        check_live_options(label, schedule, checked_priority, checked_dedupe)
    return schedule, checked_priority, checked_dedupe, window
