"""Operator controls on named messages: cancel, delete, retry now.

Each function runs inside ONE write transaction given by `Store.write`: the status change, the
failure records and the audit row commit together or not at all. Every change is a guarded
statement (`status = 'pending'`, a lease already expired, a finished status), so a message that
moved on meanwhile (a worker claimed it, it finished) is left alone and reported as skipped with
the status that kept it. Times are judged by the lease clock (PostgreSQL's own on PostgreSQL).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, and_, delete, func, or_, select, update
from sqlalchemy.engine import Row

from ..store import cancels, history, schema
from ..store.base import lease_clock_ms
from ..store.cancels import CANCELLED
from ..store.sql.notify import notify_cancel, notify_queues
from . import queries
from .records import Cancelled, CancelPreview, Deleted, Retried, Skipped, UnknownMessage
from .repair import CHUNK, FINISHABLE, MAX_AUDIT_IDS, SAMPLE, default_actor, delete_rows_of, write_audit

m = schema.messages


def _chunks(ids: Sequence[str]) -> list[list[str]]:
    """Named ids in IN-list sized chunks."""
    return [list(ids[i : i + CHUNK]) for i in range(0, len(ids), CHUNK)]


def statuses_of(conn: Connection, signal: str, ids: Sequence[str]) -> dict[str, str]:
    """The status of each named message of `signal`; UnknownSignal / UnknownMessage for a name it lacks."""
    queries.require_signal(conn, signal)
    found: dict[str, str] = {}
    for chunk in _chunks(ids):
        found.update(
            (r.id, r.status)
            for r in conn.execute(select(m.c.id, m.c.status).where(m.c.signal == signal, m.c.id.in_(chunk)))
        )
    missing = [i for i in ids if i not in found]
    if missing:
        raise UnknownMessage(missing, signal)
    return found


def _skipped(conn: Connection, signal: str, ids: Sequence[str], done: Sequence[str]) -> list[Skipped]:
    """The named messages not in `done`, with their status now."""
    taken = set(done)
    left = [i for i in ids if i not in taken]
    if not left:
        return []
    now = statuses_of(conn, signal, left)
    return [Skipped(id=i, status=now[i]) for i in left]


def end_dead(conn: Connection, where: list[Any], *, code: str, note: str, now: int) -> list[str]:
    """The selected pending (or lease-expired inflight) messages → dead, each with a failure record
    {code, note, attempt}; their ids in seq order. The caller's `where` must say which are ready."""
    rows: list[Row[Any]] = []
    for chunk_where in where:
        rows += conn.execute(
            update(m)
            .where(chunk_where)
            .values(status="dead", finished_at=now, updated_at=now, locked_by=None, lease_expires_at=None)
            .returning(m.c.seq, m.c.id, m.c.attempts, m.c.signal)
        ).all()
    if not rows:
        return []
    for signal, dead in Counter(r.signal for r in rows).items():
        history.record(conn, signal, now, dead=dead)  # in this transaction: counted once it commits
    failures = [
        {
            "message_id": r.id,
            "attempt": r.attempts,
            "code": code,
            "message": note,
            "at": now,
            "run_id": None,
            "kind": "failure",
        }
        for r in rows
    ]
    for start in range(0, len(failures), CHUNK):
        conn.execute(schema.failures.insert(), failures[start : start + CHUNK])
    return [r.id for r in sorted(rows, key=lambda r: r.seq)]


def ready_to_end(now: int) -> Any:
    """Pending, or inflight whose lease has expired (nobody holds it): what cancel and unbind may end."""
    return and_(
        m.c.status.in_(("pending", "inflight")),
        or_(m.c.status == "pending", m.c.lease_expires_at < now),
    )


def _cancel_where(signal: str, ids: Sequence[str] | None, key: str | None, now: int) -> list[Any]:
    wheres = []
    for chunk in [None] if ids is None else _chunks(ids):
        conds = [m.c.signal == signal, ready_to_end(now)]
        if key is not None:
            conds.append(m.c.key == key)
        if chunk is not None:
            conds.append(m.c.id.in_(chunk))
        wheres.append(and_(*conds))
    return wheres


def _running(conn: Connection, signal: str, ids: Sequence[str] | None, key: str | None, now: int) -> list[str]:
    """The messages of `signal` (named, or all; of `key`) inflight under a live lease, in seq order:
    the ones whose holder `cancel` asks to stop."""
    found: list[tuple[int, str]] = []
    for chunk in [None] if ids is None else _chunks(ids):
        conds = [m.c.signal == signal, m.c.status == "inflight", m.c.lease_expires_at >= now]
        if key is not None:
            conds.append(m.c.key == key)
        if chunk is not None:
            conds.append(m.c.id.in_(chunk))
        found += [(r.seq, r.id) for r in conn.execute(select(m.c.seq, m.c.id).where(*conds))]
    return [message_id for _seq, message_id in sorted(found)]


def cancel(
    conn: Connection,
    signal: str,
    ids: Sequence[str] | None,
    *,
    key: str | None,
    actor: str | None,
    reason: str | None,
    source: str | None = None,
) -> Cancelled:
    """pending (due or not) and lease-expired inflight messages → dead with code "Cancelled"
    (replayable); a message under a live lease gets a request to stop that its holder carries out
    (engine/store/cancels.py), reported under `requested`. `ids=None`: every one of `signal` (of `key`)."""
    if ids is not None:
        statuses_of(conn, signal, ids)
    else:
        queries.require_signal(conn, signal)
    actor = actor or default_actor()
    now = lease_clock_ms(conn)
    note = reason or f"cancelled by {actor}"
    done = end_dead(conn, _cancel_where(signal, ids, key, now), code=CANCELLED, note=note, now=now)
    cancels.drop(conn, done)
    requested = _running(conn, signal, ids, key, now)
    if requested:
        cancels.request(conn, [(i, signal) for i in requested], at=now, actor=actor, note=note)
        notify_cancel(conn)
    cancels.prune(conn)
    skipped = _skipped(conn, signal, ids, done + requested) if ids is not None else []
    changed = done + requested
    if changed:
        write_audit(
            conn, "cancel", actor, signal, changed[:MAX_AUDIT_IDS], reason, count=len(changed), at=now, source=source
        )
    return Cancelled(cancelled=len(done), ids=done, skipped=skipped, requested=requested)


def cancel_preview(conn: Connection, signal: str, ids: Sequence[str] | None, *, key: str | None) -> CancelPreview:
    """What `cancel` would end now (count, a sample of ids in seq order, what it would skip); changes nothing."""
    if ids is not None:
        statuses_of(conn, signal, ids)
    else:
        queries.require_signal(conn, signal)
    now = lease_clock_ms(conn)
    total, sample = 0, []
    for where in _cancel_where(signal, ids, key, now):
        total += int(conn.execute(select(func.count()).select_from(m).where(where)).scalar() or 0)
        sample += [r[0] for r in conn.execute(select(m.c.id).where(where).order_by(m.c.seq).limit(SAMPLE))]
    running = _running(conn, signal, ids, key, now)
    if ids is not None:
        would = {
            r[0] for where in _cancel_where(signal, ids, key, now) for r in conn.execute(select(m.c.id).where(where))
        }
        skipped = _skipped(conn, signal, ids, list(would) + running)
    else:
        skipped = []
    return CancelPreview(cancelled=0, would_cancel=total, ids=sample[:SAMPLE], skipped=skipped, would_request=running)


def delete_finished(
    conn: Connection,
    signal: str,
    ids: Sequence[str],
    *,
    actor: str | None,
    reason: str | None = None,
    source: str | None = None,
) -> Deleted:
    """Delete the named finished (delivered / dead) messages with their failure and step rows; others skipped."""
    statuses_of(conn, signal, ids)
    now = lease_clock_ms(conn)
    gone: list[str] = []
    seqs: list[int] = []
    for chunk in _chunks(ids):
        for r in conn.execute(
            delete(m)
            .where(m.c.signal == signal, m.c.status.in_(FINISHABLE), m.c.id.in_(chunk))
            .returning(m.c.id, m.c.seq)
        ):
            gone.append(r.id)
            seqs.append(r.seq)
    delete_rows_of(conn, gone, seqs)
    deleted = set(gone)
    ordered = [i for i in ids if i in deleted]
    skipped = _skipped(conn, signal, ids, ordered)
    if ordered:
        write_audit(
            conn, "delete", actor, signal, ordered[:MAX_AUDIT_IDS], reason, count=len(ordered), at=now, source=source
        )
    return Deleted(deleted=len(ordered), ids=ordered, skipped=skipped)


def retry_now(
    conn: Connection,
    signal: str,
    ids: Sequence[str],
    *,
    actor: str | None,
    reason: str | None = None,
    source: str | None = None,
) -> Retried:
    """A named pending message waiting for its run_at (a delay, a back-off) becomes due now; others skipped."""
    statuses_of(conn, signal, ids)
    now = lease_clock_ms(conn)
    rows: list[Row[Any]] = []
    for chunk in _chunks(ids):
        rows += conn.execute(
            update(m)
            .where(m.c.signal == signal, m.c.status == "pending", m.c.run_at > now, m.c.id.in_(chunk))
            .values(run_at=None, updated_at=now)
            .returning(m.c.seq, m.c.id, m.c.queue)
        ).all()
    done = [r.id for r in sorted(rows, key=lambda r: r.seq)]
    if done:
        notify_queues(conn, sorted({r.queue for r in rows}))
        write_audit(conn, "retry", actor, signal, done[:MAX_AUDIT_IDS], reason, count=len(done), at=now, source=source)
    return Retried(retried=len(done), ids=done, skipped=_skipped(conn, signal, ids, done))
