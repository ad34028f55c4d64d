"""Retention of finished work: delete delivered messages, dead letters and runs older than the
app's `keep_*` durations, one bounded batch per transaction (engine/retention.py paces them).

Each batch walks one signal's rows of one status in seq order through the (signal, status, seq)
index, so a batch never scans the table: of the oldest `limit` rows it deletes those finished
before the cut. A message that finished later than younger ones waits for its own turn (the walk
stops at the first batch that was not wholly old). A message's failures, runs and step results go
in the same transaction; the count triggers see the deletes like any other. Runs are walked by
their time-ordered id (the primary key), so no index is added for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, delete, select, update

from ..ids import base32
from . import counts, history, schema, search_index

m = schema.messages
RUN_PREFIX = "run_"


@dataclass(frozen=True, slots=True)
class Batch:
    """What one batch deleted, and whether more old rows may be waiting behind it."""

    deleted: int
    more: bool


def finished_signals(conn: Connection, status: str) -> list[str]:
    """Signals with at least one message of `status`, from the trigger-kept counters (cheap;
    with PostgreSQL's pending deltas, store/counts.py)."""
    return sorted(signal for (signal, st), n in counts.status_counts(conn).items() if st == status and n > 0)


def delete_messages(conn: Connection, signal: str, status: str, before_ms: int, limit: int, now: int) -> Batch:
    """Delete `signal`'s `status` messages finished before `before_ms`, among its oldest `limit`,
    with their failures, runs, steps and search index entries; counted as `pruned` in history."""
    oldest = conn.execute(
        select(m.c.seq, m.c.finished_at)
        .where(m.c.signal == signal, m.c.status == status)
        .order_by(m.c.seq)
        .limit(limit)
    ).all()
    old = [seq for seq, finished_at in oldest if finished_at is not None and finished_at < before_ms]
    if not old:
        return Batch(0, False)
    gone = conn.execute(delete(m).where(m.c.seq.in_(old), m.c.status == status).returning(m.c.id, m.c.seq)).all()
    ids = [row.id for row in gone]
    if ids:
        finished = dict(oldest)
        _keep_windows(conn, [(row.id, finished[row.seq]) for row in gone])
        search_index.forget(conn, [row.seq for row in gone])
        conn.execute(delete(schema.failures).where(schema.failures.c.message_id.in_(ids)))
        conn.execute(delete(schema.runs).where(schema.runs.c.message_id.in_(ids)))
        conn.execute(delete(schema.steps).where(schema.steps.c.message_id.in_(ids)))
        history.record(conn, signal, now, pruned=len(ids))
    return Batch(len(ids), len(old) == limit)


def _keep_windows(conn: Connection, gone: list[tuple[str, int]]) -> None:
    """A deleted message that holds its dedupe key for a window (`dedupe_for`) leaves the hold's
    end behind, so deleting it never frees the key early."""
    h = schema.dedupe_holds
    conn.execute(
        update(h)
        .where(h.c.msg_id == bindparam("gone_id"), h.c.until.is_(None))
        .values(until=bindparam("gone_at") + h.c.window_ms),
        [{"gone_id": msg_id, "gone_at": finished_at} for msg_id, finished_at in gone],
    )


def delete_lapsed_holds(conn: Connection, limit: int, now: int) -> Batch:
    """Delete up to `limit` dedupe holds whose window ended after their message was deleted."""
    h = schema.dedupe_holds
    lapsed = conn.execute(select(h.c.queue, h.c.dedupe).where(h.c.until < now).limit(limit)).all()
    for queue, dedupe in lapsed:
        conn.execute(delete(h).where(h.c.queue == queue, h.c.dedupe == dedupe, h.c.until < now))
    return Batch(len(lapsed), len(lapsed) == limit)


def delete_runs(conn: Connection, before_ms: int, limit: int, now: int) -> Batch:
    """Delete up to `limit` runs started before `before_ms` (by their time-ordered id); counted
    as `pruned_runs` per signal in history (runs of no signal, e.g. HTTP flows, under "")."""
    r = schema.runs
    bound = RUN_PREFIX + base32(max(before_ms, 0), 10)
    old = list(
        conn.execute(
            select(r.c.run_id).where(r.c.run_id >= RUN_PREFIX, r.c.run_id < bound).order_by(r.c.run_id).limit(limit)
        ).scalars()
    )
    if not old:
        return Batch(0, False)
    signals = conn.execute(delete(r).where(r.c.run_id.in_(old)).returning(r.c.signal)).scalars().all()
    tally = history.HistoryTally()
    for signal in signals:
        tally.add(signal or "", now, history.PRUNED_RUNS)
    history.write_counts(conn, tally.take())
    return Batch(len(signals), len(old) == limit)
