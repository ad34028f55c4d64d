"""Live tapes for operators: state, the last N events, events after a cursor.

The console tails a tape from the store through these (no SQL of its own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from ..live import tape as live
from ..store import Store, schema


@dataclass(frozen=True)
class TapeInfo:
    signal: str
    epoch: str
    head_id: str | None
    first_id: str | None
    retained: int
    pruned_through: int
    head: int = 0  # events ever appended in this epoch: a rate comes from it, not from `retained`


@dataclass(frozen=True)
class TapeEntry:
    id: str
    seq: int
    data: Any
    created_at: int


def _entries(epoch: str, events: list[live.TapeEvent]) -> list[TapeEntry]:
    return [TapeEntry(f"{epoch}.{e.seq}", e.seq, json.loads(e.payload), e.created_at) for e in events]


async def tape_info(store: Store, signal: str) -> TapeInfo | None:
    """The tape's epoch, head and oldest retained id; None when the store has no such tape."""
    tape = await store.read(lambda conn: live.state(conn, signal))
    if tape is None:
        return None
    return TapeInfo(
        signal,
        tape.epoch,
        tape.event_id(tape.head) if tape.head else None,
        tape.event_id(tape.first_seq) if tape.first_seq is not None else None,
        (tape.head - tape.first_seq + 1) if tape.first_seq is not None else 0,
        tape.pruned_through,
        tape.head,
    )


async def tape_last(store: Store, signal: str, count: int) -> list[TapeEntry]:
    """The newest `count` retained events, oldest first."""
    tape = await store.read(lambda conn: live.state(conn, signal))
    if tape is None or count <= 0:
        return []
    events = await store.read(lambda conn: live.read_last(conn, signal, count))
    return _entries(tape.epoch, events)


async def tape_after(
    store: Store, signal: str, cursor: str | None, limit: int = 1000
) -> tuple[list[TapeEntry], live.Gap | None]:
    """Events after `cursor` (None: from the oldest retained), or the gap that makes it impossible."""
    tape = await store.read(lambda conn: live.state(conn, signal))
    if tape is None:
        return [], None
    after = 0
    if cursor:
        seq, gap = live.check_cursor(tape, cursor)
        if gap is not None:
            return [], gap
        after = seq or 0
    events = await store.read(lambda conn: live.read_after(conn, signal, after, limit))
    return _entries(tape.epoch, events), None


async def live_signals(store: Store) -> list[str]:
    """Names of the signals that have a tape."""
    return await store.read(live.tape_names)


async def tape_heads(store: Store) -> dict[str, int]:
    """Events ever appended to each tape in its epoch (its head), by signal: one read for all."""

    def heads(conn: Any) -> dict[str, int]:
        return {row.signal: int(row.head) for row in conn.execute(select(schema.tapes.c.signal, schema.tapes.c.head))}

    return await store.read(heads)
