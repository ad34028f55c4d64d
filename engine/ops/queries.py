"""Read-only operator queries (synchronous SQLAlchemy Core over one connection).

Each function runs inside one read transaction given by `Store.read`, so what it
returns is one consistent snapshot. The statements lean on the indexes of
`engine.store.schema`: counts and lists by `(signal, status, seq)`, keyed lists by
`(signal, key, seq)`, failure histories by `(message_id, id)`, key heads by the
partial ready-key index.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from sqlalchemy import Connection, and_, func, null, or_, select, text

from ..ids import now_ms
from ..live import tape as live
from ..store import pauses, registry, schema, search_index
from ..store.base import lease_clock_ms
from ..store.counts import status_counts
from . import listing
from . import trace as trace_mod
from .indexed_search import IndexedSearch
from .records import (
    STATUSES,
    AuditEntry,
    Blocker,
    DeadLetter,
    Failure,
    FailureGroup,
    Lease,
    MessageDetail,
    MessagePage,
    MessageRow,
    SignalInfo,
    SignalStats,
    UnknownMessage,
    UnknownSignal,
    waits_until,
)
from .workers import ORPHAN_AFTER_MS, lease_orphaned

m = schema.messages
f = schema.failures
s = schema.signals
a = schema.audit
CHUNK = 500


# -- signals ------------------------------------------------------------------------------------
def known_signals(conn: Connection) -> list[str]:
    return registry.known_signals(conn)


def signal_exists(conn: Connection, name: str) -> bool:
    """Recorded by some app, or has at least one message (cheap: two index probes)."""
    if conn.execute(select(s.c.name).where(s.c.name == name)).first() is not None:
        return True
    return conn.execute(select(m.c.seq).where(m.c.signal == name).limit(1)).first() is not None


def require_signal(conn: Connection, name: str) -> None:
    """Raise UnknownSignal (listing the known ones) unless `name` is known to the store."""
    if not signal_exists(conn, name):
        raise UnknownSignal(name, known_signals(conn))


def signal_kind(conn: Connection, name: str) -> str:
    """The recorded kind of `name`, else the kind its messages' queues tell ("unknown" with none)."""
    kind = conn.execute(select(s.c.kind).where(s.c.name == name)).scalar()
    return str(kind) if kind is not None else _inferred_kind(conn, name)


def _inferred_kind(conn: Connection, name: str) -> str:
    """The kind of a signal nobody recorded, from one of its messages' queue."""
    row = conn.execute(select(m.c.queue).where(m.c.signal == name).limit(1)).first()
    if row is None:
        return "unknown"
    return "broadcast" if "\x1f" in row.queue else "once"


def signal_info(conn: Connection, name: str) -> SignalInfo | None:
    row = conn.execute(select(s).where(s.c.name == name)).first()
    flows = registry.bound_flows(conn, name)
    if row is not None:
        return SignalInfo(
            name=row.name,
            kind=row.kind,
            retries=row.retries,
            dead_letter=bool(row.dead_letter),
            optional=bool(row.optional),
            retention=json.loads(row.retention) if row.retention else None,
            description=row.description,
            app=row.app,
            flows=flows,
            recorded=True,
        )
    kind = _inferred_kind(conn, name)
    if kind == "unknown":
        return None
    return SignalInfo(
        name=name,
        kind=kind,
        retries=None,
        dead_letter=None,
        optional=None,
        retention=None,
        description=None,
        app=None,
        flows=flows,
        recorded=False,
    )


def stats(conn: Connection) -> list[SignalStats]:
    """Counts per signal and status from the trigger-kept counters: O(signals), not O(messages)."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(STATUSES, 0))
    for (signal, status), n in status_counts(conn).items():
        if status in STATUSES:
            counts[signal][status] = n
    declared = {row.name: row for row in conn.execute(select(s.c.name, s.c.kind, s.c.description))}
    flows = registry.recent_flows(conn)
    paused = pauses.paused_signals(conn)
    now = now_ms()
    clock = lease_clock_ms(conn)  # what "due" is judged by, as the claim does
    out = []
    for name in sorted(set(counts) | set(declared)):
        c = counts[name]
        lag, scheduled = None, 0
        if c["pending"]:
            lag, scheduled = _lag_and_scheduled(conn, name, now, clock)
        row = declared.get(name)
        kind = row.kind if row is not None else _inferred_kind(conn, name)
        tape = _tape_figures(conn, name, now) if kind == "live" else {}
        out.append(
            SignalStats(
                signal=name,
                kind=kind,
                description=row.description if row is not None else None,
                pending=c["pending"],
                inflight=c["inflight"],
                delivered=c["delivered"],
                dead=c["dead"],
                lag_ms=lag,
                flows=flows.get(name, []),
                paused=name in paused,
                scheduled=scheduled,
                **tape,
            )
        )
    return out


TAPE_RATE_MS = 60_000  # events_per_s is measured over the last minute
ev = schema.tape_events


def _tape_figures(conn: Connection, signal: str, now: int) -> dict[str, Any]:
    """A live signal's `kept`, `head` and `events_per_s`: from the tape's row and one walk of the
    (signal, created_at) index to the first event of the last minute (the events after it are
    head - its seq; no count over the tape). When retention already dropped part of that minute,
    the rate is taken over the span the retained events cover."""
    tape = live.state(conn, signal)
    if tape is None or tape.first_seq is None:
        return {"kept": 0, "head": tape.event_id(tape.head) if tape and tape.head else None, "events_per_s": 0.0}
    since = now - TAPE_RATE_MS
    first = conn.execute(
        select(ev.c.seq, ev.c.created_at)
        .where(ev.c.signal == signal, ev.c.created_at >= since)
        .order_by(ev.c.created_at, ev.c.seq)
        .limit(1)
    ).first()
    rate = 0.0
    if first is not None:
        span_ms = TAPE_RATE_MS
        if first.seq == tape.first_seq and tape.pruned_through > 0:
            span_ms = max(now - int(first.created_at), 1000)  # retention cut into the minute
        rate = (tape.head - int(first.seq) + 1) / (span_ms / 1000)
    return {"kept": tape.head - tape.first_seq + 1, "head": tape.event_id(tape.head), "events_per_s": rate}


def _lag_and_scheduled(conn: Connection, signal: str, now: int, clock: int) -> tuple[int | None, int]:
    """The age of the oldest pending message that is due (None: none is), and how many pending
    messages are not due yet (a delay, an `at`, a back-off)."""
    pending = and_(m.c.signal == signal, m.c.status == "pending")
    due = or_(m.c.run_at.is_(None), m.c.run_at <= clock)
    oldest = conn.execute(select(m.c.created_at).where(pending, due).order_by(m.c.seq).limit(1)).scalar()
    scheduled = conn.execute(_scheduled_count(conn.dialect.name), {"signal": signal, "clock": clock}).scalar_one()
    return (max(0, now - oldest) if oldest is not None else None), int(scheduled)


def _scheduled_count(dialect: str) -> Any:
    """Pending messages of :signal not due by :clock, read from the index of scheduled rows
    (schema.SCHEDULED): O(messages with a due time), not O(pending), and nothing when no emit
    delays. SQLite (never ANALYZEd here) would walk (signal, status) over every pending row
    instead, so it is told the index."""
    hint = " INDEXED BY oke_messages_scheduled" if dialect == "sqlite" else ""
    return text(
        f"SELECT count(*) FROM oke_messages{hint} WHERE {schema.SCHEDULED} AND signal = :signal AND run_at > :clock"
    )


# -- messages -----------------------------------------------------------------------------------
def check_status(status: str | None, allowed: tuple[str, ...] = STATUSES) -> None:
    if status is not None and status not in allowed:
        raise ValueError(f'unknown status "{status}" (one of: {", ".join(allowed)})')


def message_page(
    conn: Connection,
    signal: str,
    status: str | None = None,
    key: str | None = None,
    limit: int = 50,
    before_seq: int | None = None,
    *,
    search: str | None = None,
    sort: str | None = None,
    descending: bool = True,
    cursor: str | None = None,
) -> MessagePage:
    """Messages of `signal`, at most `limit`: newest first, or by `sort` (a MessageRow column or
    "seq"), kept to those matching `search` when given (engine/ops/listing.py). The next page is
    `cursor=page.next_cursor` (or, newest first, `before_seq=page.next_before_seq`)."""
    check_status(status)
    if limit < 1:
        raise ValueError(f"limit must be ≥ 1, got {limit}")
    sort = sort or "seq"
    listing.check_sort(sort)
    start = listing.decode_cursor(cursor) if cursor is not None else None
    require_signal(conn, signal)
    if before_seq is not None and start is None:
        if sort != "seq" or not descending:
            raise ValueError("before_seq pages the newest-first list: pass cursor= for other orders")
        start = listing.Position("seq", None, before_seq)
    filters = []
    if status is not None:
        filters.append(m.c.status == status)
    if key is not None:
        filters.append(m.c.key == key)
    # A filter the order's index does not serve keeps an unknown share of what a page walks: bound
    # the walk (a key's messages are few, and the key index finds them directly).
    windowed = key is None and (bool(search) or (status is not None and sort not in ("seq", "status")))
    found = None
    if windowed and search:  # the index's candidates are rechecked row by row (listing.search_filter)
        exact = [*filters, listing.search_filter(search, per_row=True)]
        found = _from_index(conn, signal, search, exact, sort, descending, limit, start)
    if search:
        filters.append(listing.search_filter(search))
    if found is not None:
        (rows, nxt), cut = found, False
    else:
        rows, nxt, cut = listing.Walk(conn, signal, filters, sort, descending, windowed).page(limit, start)
    items = [_message_row(r) for r in rows]
    newest_first = sort == "seq" and descending
    return MessagePage(
        items=items,
        next_before_seq=nxt.seq if (nxt is not None and newest_first) else None,
        clock_ms=lease_clock_ms(conn),
        next_cursor=nxt.encode() if nxt is not None else None,
        cut=cut,
    )


def _from_index(
    conn: Connection,
    signal: str,
    needle: str,
    filters: list[Any],
    sort: str,
    descending: bool,
    limit: int,
    start: listing.Position | None,
) -> tuple[list[Any], listing.Position | None] | None:
    """A searched page from the text index, when the store has one that has caught up and the
    needle is long enough for it; None: the windowed walk answers (engine/ops/indexed_search.py)."""
    if not search_index.usable_needle(needle):
        return None
    marks = search_index.marks(conn)
    if marks is None or not marks.caught_up:
        return None
    search = IndexedSearch(conn, signal, needle, filters, marks)
    if sort == "seq":
        return search.seq_page(limit, descending, start)
    return search.sorted_page(limit, sort, descending, start)


def _message_row(r: Any) -> MessageRow:
    return MessageRow(
        id=r.id,
        status=r.status,
        key=r.key,
        attempts=r.attempts,
        locked_by=r.locked_by,
        lease_expires_at=r.lease_expires_at,
        created_at=r.created_at,
        parent_run_id=r.parent_run_id,
        run_at=r.run_at,
        priority=r.priority,
        dedupe=r.dedupe,
    )


def failures_of(conn: Connection, message_ids: list[str], tracebacks: bool = False) -> dict[str, list[Failure]]:
    """Failure history per message, oldest first (replay markers included, code "replayed"), with
    each attempt's traceback when `tracebacks` (one message's history: `show`)."""
    out: dict[str, list[Failure]] = defaultdict(list)
    columns = [f.c.message_id, f.c.code, f.c.message, f.c.at, f.c.attempt]
    for start in range(0, len(message_ids), CHUNK):
        chunk = message_ids[start : start + CHUNK]
        rows = conn.execute(
            select(*columns, f.c.traceback if tracebacks else null().label("traceback"))
            .where(f.c.message_id.in_(chunk))
            .order_by(f.c.id)
        )
        for r in rows:
            out[r.message_id].append(
                Failure(code=r.code, message=r.message, at=r.at, attempt=r.attempt, traceback=r.traceback)
            )
    return out


def dead_letters(conn: Connection, signal: str, limit: int | None = None) -> list[DeadLetter]:
    query = (
        select(m.c.id, m.c.signal, m.c.key, m.c.payload, m.c.attempts, m.c.created_at, m.c.parent_run_id)
        .where(m.c.signal == signal, m.c.status == "dead")
        .order_by(m.c.seq.desc())
    )
    if limit is not None:
        query = query.limit(limit)
    rows = conn.execute(query).all()
    history = failures_of(conn, [r.id for r in rows])
    return [
        DeadLetter(
            id=r.id,
            signal=r.signal,
            key=r.key,
            payload=json.loads(r.payload),
            attempts=r.attempts,
            failures=history.get(r.id, []),
            created_at=r.created_at,
            parent_run_id=r.parent_run_id,
        )
        for r in rows
    ]


def _blocker(conn: Connection, row: Any) -> Blocker | None:
    """The oldest unfinished message of the same queue and key ahead of `row`, if any."""
    if row.key is not None and row.status in ("pending", "inflight"):
        head = conn.execute(
            select(m.c.id, m.c.status, m.c.attempts, m.c.locked_by, m.c.lease_expires_at, m.c.created_at)
            .where(
                m.c.status.in_(("pending", "inflight")),
                m.c.key.is_not(None),
                m.c.queue == row.queue,
                m.c.key == row.key,
                m.c.seq < row.seq,
            )
            .order_by(m.c.seq)
            .limit(1)
        ).first()
        if head is not None:
            return Blocker(
                id=head.id,
                status=head.status,
                attempts=head.attempts,
                locked_by=head.locked_by,
                lease_expires_at=head.lease_expires_at,
                created_at=head.created_at,
            )
    return None


def show(conn: Connection, message_id: str, orphan_after_ms: int = ORPHAN_AFTER_MS) -> MessageDetail:
    row = conn.execute(select(m).where(m.c.id == message_id)).first()
    if row is None:
        raise UnknownMessage([message_id], None)
    now = lease_clock_ms(conn)
    lease = Lease(
        locked_by=row.locked_by,
        lease_expires_at=row.lease_expires_at,
        reclaimable=(row.status == "inflight" and row.lease_expires_at is not None and row.lease_expires_at < now),
        orphaned=lease_orphaned(conn, row.status, row.locked_by, orphan_after_ms),
    )
    blocker = _blocker(conn, row)
    runs = trace_mod.runs_of_message(conn, message_id)
    if row.parent_run_id is not None:
        roots = [trace_mod.tree(conn, row.parent_run_id)]
    else:
        roots = [trace_mod.tree(conn, r.run_id) for r in runs]
    return MessageDetail(
        id=row.id,
        signal=row.signal,
        flow=row.flow,
        key=row.key,
        status=row.status,
        payload=json.loads(row.payload),
        attempts=row.attempts,
        retries=row.retries,
        replays=row.replays,
        created_at=row.created_at,
        updated_at=row.updated_at,
        finished_at=row.finished_at,
        parent_run_id=row.parent_run_id,
        failures=failures_of(conn, [row.id], tracebacks=True).get(row.id, []),
        lease=lease,
        blocked_by=blocker,
        runs=runs,
        trace=roots,
        run_at=row.run_at,
        priority=row.priority,
        dedupe=row.dedupe,
        due_at=waits_until(row.status, row.run_at, now),
    )


def failures(conn: Connection, signal: str) -> list[FailureGroup]:
    """Dead and failing messages grouped by their latest failure (code, message), newest first.

    A message counts once, under the latest row of its failure history, when that row is a
    failure (not a replay marker) and the message is not delivered: dead letters, and messages
    waiting for or running a retry. So the counts match what `replay --code` would select.
    """
    require_signal(conn, signal)
    f2 = f.alias("f2")
    latest = select(func.max(f2.c.id)).where(f2.c.message_id == m.c.id).scalar_subquery()
    rows = conn.execute(
        select(f.c.code, f.c.message, func.count().label("n"), func.max(f.c.at).label("last_at"))
        .select_from(f.join(m, m.c.id == f.c.message_id))
        .where(
            m.c.signal == signal,
            m.c.status.in_(("pending", "inflight", "dead")),
            f.c.kind == "failure",
            f.c.id == latest,
        )
        .group_by(f.c.code, f.c.message)
        .order_by(func.max(f.c.at).desc(), f.c.code, f.c.message)
    ).all()
    return [FailureGroup(code=r.code, message=r.message, count=int(r.n), last_at=int(r.last_at)) for r in rows]


def audit(conn: Connection, limit: int = 100, action: str | None = None) -> list[AuditEntry]:
    query = select(a).order_by(a.c.id.desc()).limit(limit)
    if action is not None:
        query = query.where(a.c.action == action)
    return [
        AuditEntry(
            at=r.at,
            actor=r.actor,
            action=r.action,
            signal=r.signal,
            count=r._mapping["count"],
            ids=json.loads(r.ids),
            reason=r.reason,
            source=r.source,
        )
        for r in conn.execute(query)
    ]
