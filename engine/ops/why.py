"""`why`: read the snapshot of one message that `verdict.decide` judges, in one read transaction.

The reads are point lookups: the message by id, its newest failure, the worker its lease names,
the head of its key (the ready-key index), the signal's pause, the bindings of its queue, and
the flow limit holding its queue back (engine/ops/flow_limits.py).
"""

from __future__ import annotations

from sqlalchemy import Connection, func, select

from ..ids import now_ms
from ..store import limits, registry, schema
from ..store.base import lease_clock_ms
from . import flow_limits, keyheads, queries
from .records import UnknownMessage
from .verdict import Head, Holder, LimitHeld, Pause, Snapshot

m = schema.messages
w = schema.workers
b = schema.bindings
ID_PREFIX = "msg_"


def _holder(conn: Connection, worker_id: str | None) -> Holder | None:
    if worker_id is None:
        return None
    row = conn.execute(
        select(w.c.host, w.c.pid, w.c.last_seen, w.c.stopped_at).where(w.c.worker_id == worker_id)
    ).first()
    if row is None:
        return Holder(worker_id)
    return Holder(worker_id, row.host, row.pid, row.last_seen, row.stopped_at)


def _head(conn: Connection, row: object) -> Head | None:
    blocker = queries._blocker(conn, row)
    if blocker is None:
        return None
    failed = keyheads.failed_attempts(blocker.status, blocker.attempts)
    return Head(blocker.id, blocker.status, failed, keyheads.last_failure(conn, blocker.id) if failed else None)


def _pause(conn: Connection, signal: str) -> Pause | None:
    p = schema.pauses
    row = conn.execute(select(p.c.paused_at, p.c.actor, p.c.reason).where(p.c.signal == signal)).first()
    return None if row is None else Pause(row.paused_at, row.actor, row.reason)


def _bound_seen_ago_ms(conn: Connection, signal: str, queue: str, flow: str | None) -> int | None:
    """Since a process bound to this queue was last seen (a broadcast copy: its own flow's binding;
    a once message: any flow of the signal); None when no such binding is recorded (or all are retired)."""
    where = [b.c.signal == signal, b.c.retired_at.is_(None)]
    if "\x1f" in queue:
        where.append(b.c.flow == flow)
    seen = conn.execute(select(func.max(registry.LAST_SEEN)).where(*where)).scalar()
    return None if seen is None else max(0, now_ms() - int(seen))


def _limit(conn: Connection, signal: str, queue: str, now: int) -> LimitHeld | None:
    """The flow limit holding `queue` back now, if one does."""
    held = flow_limits.holds(conn, signal, limits.limits_of(conn, signal), now, queue)
    if not held:
        return None
    h = held[0]
    return LimitHeld(h.limit, h.running, h.concurrency, h.rate, h.until)


def snapshot(conn: Connection, message_id: str) -> Snapshot:
    """What `verdict.decide` needs of `message_id`; UnknownMessage when there is no such message."""
    if not isinstance(message_id, str) or not message_id.startswith(ID_PREFIX):
        raise UnknownMessage([message_id], None)
    row = conn.execute(select(m).where(m.c.id == message_id)).first()
    if row is None:
        raise UnknownMessage([message_id], None)
    unfinished = row.status in ("pending", "inflight")
    now = lease_clock_ms(conn)
    return Snapshot(
        id=row.id,
        signal=row.signal,
        status=row.status,
        attempts=row.attempts,
        created_at=row.created_at,
        updated_at=row.updated_at,
        now=now,
        key=row.key,
        finished_at=row.finished_at,
        run_at=row.run_at,
        lease_expires_at=row.lease_expires_at,
        holder=_holder(conn, row.locked_by) if row.status == "inflight" else None,
        last_failure=keyheads.last_failure(conn, row.id) if row.attempts or not unfinished else None,
        head=_head(conn, row) if unfinished else None,
        pause=_pause(conn, row.signal) if unfinished else None,
        bound_seen_ago_ms=_bound_seen_ago_ms(conn, row.signal, row.queue, row.flow) if unfinished else 0,
        limit=_limit(conn, row.signal, row.queue, now) if row.status == "pending" else None,
    )
