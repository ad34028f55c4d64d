"""The statements of `oke_workers`: a worker pool's heartbeat, its clean stop, and who was seen when.

Every time here is read from the store's lease clock (`lease_clock_ms`), the clock leases are
judged by, so "not seen for 30 s" and "the lease expires in 10 s" are measured alike even when the
machines' clocks disagree. A beat is one upsert plus a delete of rows not seen for `FORGET_MS`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from sqlalchemy import Connection, delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from . import schema
from .base import lease_clock_ms

w = schema.workers
m = schema.messages
FORGET_MS = 3_600_000  # a worker not seen for an hour is forgotten (its row deleted by any beat)


class WorkerRow(NamedTuple):
    worker_id: str
    app: str
    host: str
    pid: int
    started_at: int
    last_seen: int
    stopped_at: int | None
    concurrency: int
    held: int


def beat(conn: Connection, worker_id: str, held: int, *, start: dict[str, Any] | None = None) -> int:
    """This worker is alive now, holding `held` leases; with `start` (app, host, pid, concurrency)
    it (re)starts: started_at is now and a former stop is forgotten. Returns the store's now."""
    now = lease_clock_ms(conn)
    if start is not None:
        row = {"worker_id": worker_id, **start, "started_at": now, "last_seen": now, "stopped_at": None, "held": held}
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        stmt = dialect.insert(w).values(row)
        updates = {c: stmt.excluded[c] for c in row if c != "worker_id"}
        conn.execute(stmt.on_conflict_do_update(index_elements=["worker_id"], set_=updates))
    else:
        found = conn.execute(update(w).where(w.c.worker_id == worker_id).values(last_seen=now, held=held))
        if found.rowcount == 0:
            return now  # forgotten meanwhile (an hour's outage): the next start records it again
    conn.execute(delete(w).where(w.c.last_seen < now - FORGET_MS))
    return now


def stopped(conn: Connection, worker_id: str, held: int) -> None:
    """A clean stop: the row stays (an operator sees who ran lately) with stopped_at set."""
    now = lease_clock_ms(conn)
    conn.execute(update(w).where(w.c.worker_id == worker_id).values(last_seen=now, stopped_at=now, held=held))


def seen_since(conn: Connection, since_ms: int) -> list[WorkerRow]:
    """Workers seen at or after `since_ms` (store clock), most recently started first."""
    rows = conn.execute(
        select(*w.c).where(w.c.last_seen >= since_ms).order_by(w.c.started_at.desc(), w.c.worker_id)
    ).all()
    return [WorkerRow(*r) for r in rows]


def leases_by_holder(conn: Connection) -> dict[str, int]:
    """Inflight messages per lease holder (the partial index on locked_by keeps this to the leased rows)."""
    rows = conn.execute(
        select(m.c.locked_by, func.count())
        .where(m.c.locked_by.is_not(None), m.c.status == "inflight")
        .group_by(m.c.locked_by)
    ).all()
    return {str(holder): int(n) for holder, n in rows}


def live_holders(conn: Connection, holders: Iterable[str], seen_after_ms: int) -> set[str]:
    """Those of `holders` seen after `seen_after_ms` and not stopped: their leases are not orphaned."""
    wanted = sorted(set(holders))
    if not wanted:
        return set()
    rows = conn.execute(
        select(w.c.worker_id).where(w.c.worker_id.in_(wanted), w.c.last_seen > seen_after_ms, w.c.stopped_at.is_(None))
    ).all()
    return {r[0] for r in rows}
