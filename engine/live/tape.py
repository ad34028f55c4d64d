"""The live tape: append, prune, read after a cursor, and tell a resumable cursor from a gap.

Each live signal has one metadata row (`epoch`, `head`, `pruned_through`)
locked and updated in the same transaction as every append and prune, so seq
follows commit order, is never reused, and any hole a cursor would jump is
detectable. Event ids are `<epoch>.<seq>`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, func, select, update

from ..ids import base32, now_ms
from ..signals import Signal
from ..store import schema
from ..store.sql.append import lock_tape
from ..store.sql.notify import notify_tape

_CURSOR = re.compile(r"([0-9a-z]{1,40})\.(0|[1-9][0-9]{0,17})")  # fullmatch: "$" allows a final "\n"
t = schema.tapes
e = schema.tape_events


@dataclass(frozen=True, slots=True)
class TapeEvent:
    seq: int
    payload: str  # JSON text, sent as the SSE data line unchanged
    created_at: int


@dataclass(frozen=True, slots=True)
class LiveItem:
    """An event ready to send: its SSE frame encoded once, its payload decoded once for filters."""

    seq: int
    id: str
    value: Any
    frame: bytes


def items(epoch: str, events: list[TapeEvent]) -> list[LiveItem]:
    out = []
    for ev in events:
        event_id = f"{epoch}.{ev.seq}"
        out.append(
            LiveItem(ev.seq, event_id, json.loads(ev.payload), f"id: {event_id}\ndata: {ev.payload}\n\n".encode())
        )
    return out


@dataclass(frozen=True, slots=True)
class TapeState:
    signal: str
    epoch: str
    head: int
    pruned_through: int
    pruned_count: int
    first_seq: int | None  # oldest retained event, None when the tape is empty

    def event_id(self, seq: int) -> str:
        return f"{self.epoch}.{seq}"


@dataclass(frozen=True, slots=True)
class Gap:
    """Why a cursor cannot be honoured (410 LiveResumeGap)."""

    reason: str  # malformed | reset | unknown | pruned
    first_id: str | None
    missed: int | None


def new_epoch() -> str:
    return base32(int.from_bytes(os.urandom(8), "big"), 12)


def _lock_tape(conn: Connection, signal: str) -> Any:
    """The tape's metadata row, created if missing, locked for this transaction."""
    return lock_tape(conn, signal, new_epoch)


def ensure_tape(conn: Connection, signal: str) -> None:
    """Create the tape's metadata (and its epoch) if it does not exist yet."""
    _lock_tape(conn, signal)


def ensure_tapes(conn: Connection, signals: Iterable[str]) -> None:
    """`ensure_tape` for each of `signals` (a booting app's live signals), in one transaction."""
    for signal in signals:
        _lock_tape(conn, signal)


def append(
    conn: Connection,
    sig: Signal,
    payloads: list[str],
    parent_run_id: str | None,
    parent_run_ids: Sequence[str | None] | None = None,
) -> list[str]:
    """Append events in one transaction, prune by retention, notify readers; returns their ids.

    `parent_run_ids`, when given, is one parent per payload (a group commit joins emits from
    different runs into one transaction); otherwise every event gets `parent_run_id`.
    """
    if parent_run_ids is not None and len(parent_run_ids) != len(payloads):
        raise ValueError("live.append: one parent_run_id per payload")
    parents = parent_run_ids if parent_run_ids is not None else [parent_run_id] * len(payloads)
    row = _lock_tape(conn, sig.name)
    now = now_ms()
    first = row.head + 1
    conn.execute(
        e.insert(),
        [
            {"signal": sig.name, "seq": first + i, "payload": p, "created_at": now, "parent_run_id": parents[i]}
            for i, p in enumerate(payloads)
        ],
    )
    head = row.head + len(payloads)
    conn.execute(update(t).where(t.c.signal == sig.name).values(head=head))
    _prune(conn, sig, head, row.pruned_through, now)
    notify_tape(conn, sig.name, head)
    return [f"{row.epoch}.{seq}" for seq in range(first, head + 1)]


def _prune(conn: Connection, sig: Signal, head: int, pruned_through: int, now: int) -> None:
    rule = sig.retention_rule
    cut = pruned_through
    if rule.max_count is not None:
        cut = max(cut, head - rule.max_count)
    if rule.max_age_ms is not None:
        oldest_kept = conn.execute(
            select(func.min(e.c.seq)).where(e.c.signal == sig.name, e.c.created_at >= now - rule.max_age_ms)
        ).scalar()
        cut = max(cut, (oldest_kept - 1) if oldest_kept is not None else head)
    if cut <= pruned_through:
        return
    gone = conn.execute(delete(e).where(e.c.signal == sig.name, e.c.seq <= cut)).rowcount
    conn.execute(
        update(t).where(t.c.signal == sig.name).values(pruned_through=cut, pruned_count=t.c.pruned_count + max(gone, 0))
    )


def prune(conn: Connection, sig: Signal) -> None:
    """Apply the retention rule now (age-based retention ages without appends)."""
    if sig.retention_rule.max_age_ms is None and sig.retention_rule.max_count is None:
        return
    row = _lock_tape(conn, sig.name)
    _prune(conn, sig, row.head, row.pruned_through, now_ms())


def state(conn: Connection, signal: str) -> TapeState | None:
    row = conn.execute(
        select(t.c.epoch, t.c.head, t.c.pruned_through, t.c.pruned_count).where(t.c.signal == signal)
    ).first()
    if row is None:
        return None
    first = conn.execute(select(func.min(e.c.seq)).where(e.c.signal == signal)).scalar()
    return TapeState(signal, row.epoch, row.head, row.pruned_through, row.pruned_count, first)


def read_after(conn: Connection, signal: str, after_seq: int, limit: int = 1000) -> list[TapeEvent]:
    """Retained events with seq > after_seq, oldest first."""
    rows = conn.execute(
        select(e.c.seq, e.c.payload, e.c.created_at)
        .where(e.c.signal == signal, e.c.seq > after_seq)
        .order_by(e.c.seq)
        .limit(limit)
    )
    return [TapeEvent(r.seq, r.payload, r.created_at) for r in rows]


def read_since(
    conn: Connection, signal: str, after_seq: int, limit: int = 1000
) -> tuple[str | None, int, list[TapeEvent]]:
    """The tape's current epoch and head, and its retained events after `after_seq`, in one transaction."""
    row = conn.execute(select(t.c.epoch, t.c.head).where(t.c.signal == signal)).first()
    if row is None:
        return None, 0, []
    return row.epoch, row.head, read_after(conn, signal, after_seq, limit)


def read_last(conn: Connection, signal: str, count: int) -> list[TapeEvent]:
    """The newest `count` retained events, oldest first."""
    rows = conn.execute(
        select(e.c.seq, e.c.payload, e.c.created_at).where(e.c.signal == signal).order_by(e.c.seq.desc()).limit(count)
    ).all()
    return [TapeEvent(r.seq, r.payload, r.created_at) for r in reversed(rows)]


def check_cursor(tape: TapeState | None, cursor: str) -> tuple[int | None, Gap | None]:
    """The seq to resume after, or the gap that makes `cursor` impossible to honour."""
    first_id = tape.event_id(tape.first_seq) if tape and tape.first_seq is not None else None
    match = _CURSOR.fullmatch(cursor)
    if match is None:
        return None, Gap("malformed", first_id, None)
    if tape is None or match.group(1) != tape.epoch:
        return None, Gap("reset", first_id, None)
    seq = int(match.group(2))
    if seq > tape.head:
        return None, Gap("unknown", first_id, None)
    if seq < tape.pruned_through:
        return None, Gap("pruned", first_id, tape.pruned_through - seq)
    return seq, None


def wipe(conn: Connection, signal: str) -> str:
    """Empty a tape and give it a new epoch, so every old cursor is told it was reset."""
    conn.execute(delete(e).where(e.c.signal == signal))
    epoch = new_epoch()
    row = _lock_tape(conn, signal)
    conn.execute(update(t).where(t.c.signal == signal).values(epoch=epoch, pruned_through=row.head, pruned_count=0))
    return epoch


def tape_names(conn: Connection) -> list[str]:
    return [r[0] for r in conn.execute(select(t.c.signal).order_by(t.c.signal))]
