"""Who holds the leases: the workers seen lately, and whether a lease's holder is gone (orphaned).

A lease is orphaned when its holder has not beaten for `orphan_after_ms` (or stopped, or has no
record at all): it is stuck until it expires, not slow. "Not seen" is judged by the store's lease
clock, the clock the lease itself is judged by.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection

from ..store.base import lease_clock_ms
from ..store.workers import FORGET_MS, WorkerRow, leases_by_holder, live_holders, seen_since

ORPHAN_AFTER_MS = 30_000  # a holder not seen for 30 s
SEEN_WITHIN_MS = FORGET_MS  # `okconsole workers` lists the workers seen in the last hour


@dataclass(frozen=True)
class WorkerInfo:
    """One worker pool as the store last saw it.

    `state`: "running" (seen within the orphan window), "lost" (not seen since: its leases are
    orphaned), "stopped" (stopped cleanly), or "unknown" for a lease holder with no record (gone for
    over an hour, or an okengine without heartbeats): then app, host, pid and the times are null.
    `held` is what the pool reported at its last beat; `leases` what the store says it holds now,
    `orphaned` how many of those are orphaned. `seen_ago_ms` is by the store's clock."""

    worker_id: str
    state: str
    app: str | None
    host: str | None
    pid: int | None
    concurrency: int | None
    started_at: int | None
    last_seen: int | None
    stopped_at: int | None
    seen_ago_ms: int | None
    held: int
    leases: int
    orphaned: int


def _state(row: WorkerRow, now: int, orphan_after_ms: int) -> str:
    if row.stopped_at is not None:
        return "stopped"
    return "running" if row.last_seen > now - orphan_after_ms else "lost"


def workers(
    conn: Connection, seen_within_ms: int = SEEN_WITHIN_MS, orphan_after_ms: int = ORPHAN_AFTER_MS
) -> list[WorkerInfo]:
    """Workers seen within `seen_within_ms`, then lease holders with no record, with their leases."""
    now = lease_clock_ms(conn)
    leases = leases_by_holder(conn)
    found = []
    for row in seen_since(conn, now - seen_within_ms):
        state = _state(row, now, orphan_after_ms)
        held_now = leases.pop(row.worker_id, 0)
        found.append(
            WorkerInfo(
                worker_id=row.worker_id,
                state=state,
                app=row.app,
                host=row.host,
                pid=row.pid,
                concurrency=row.concurrency,
                started_at=row.started_at,
                last_seen=row.last_seen,
                stopped_at=row.stopped_at,
                seen_ago_ms=max(0, now - row.last_seen),
                held=row.held,
                leases=held_now,
                orphaned=0 if state == "running" else held_now,
            )
        )
    alive = live_holders(conn, leases, now - orphan_after_ms)  # seen, though longer ago than the listing
    for holder, n in sorted(leases.items()):
        if holder not in alive:
            found.append(_unknown_holder(holder, n))
    return found


def _unknown_holder(holder: str, leases: int) -> WorkerInfo:
    return WorkerInfo(
        worker_id=holder,
        state="unknown",
        app=None,
        host=None,
        pid=None,
        concurrency=None,
        started_at=None,
        last_seen=None,
        stopped_at=None,
        seen_ago_ms=None,
        held=0,
        leases=leases,
        orphaned=leases,
    )


def lease_orphaned(conn: Connection, status: str, holder: str | None, orphan_after_ms: int = ORPHAN_AFTER_MS) -> bool:
    """Whether an inflight message's lease holder is gone: not seen for `orphan_after_ms`, stopped,
    or never recorded."""
    if status != "inflight" or holder is None:
        return False
    return holder not in live_holders(conn, [holder], lease_clock_ms(conn) - orphan_after_ms)
