"""Operator writes: replay dead letters, purge finished messages, and the audit log.

Each function here runs inside ONE write transaction given by `Store.write`, so it
commits whole or not at all: the status change, the failure-history markers and
the audit row land together. The status change is always a guarded
`UPDATE … WHERE status = 'dead'` (or `DELETE … WHERE status = …`): under
concurrency the database re-checks the guard on the row it locks, so two replays
of one dead letter requeue it once and the second reports 0.
"""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, delete, func, not_, or_, select, update
from sqlalchemy.sql.elements import ColumnElement

from .. import payloads
from ..ids import now_ms
from ..signals import declared
from ..store import cancels, schema, search_index
from ..store.sql.notify import notify_queues
from . import queries
from .records import REPLAYED, Purged, PurgePreview, ReplayPreview, UnknownMessage

m = schema.messages
f = schema.failures
CHUNK = 1000  # ids per IN list (both drivers cap bind parameters around 32k)
SAMPLE = 20  # ids shown by a dry run
MAX_AUDIT_IDS = 10_000  # a purge audits at most this many ids (its count is always exact)
FINISHABLE = ("delivered", "dead")
PURGE_BATCH = 5000


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Any = _Unchanged()  # replay(payload=UNCHANGED) keeps every payload as it is


def default_actor() -> str:
    """The OS user running this process (the audit's actor unless one is given)."""
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return os.environ.get("USER") or os.environ.get("USERNAME") or "unknown"


def write_audit(
    conn: Connection,
    action: str,
    actor: str | None,
    signal: str | None,
    ids: Sequence[str],
    reason: str | None,
    count: int | None = None,
    at: int | None = None,
    source: str | None = None,
) -> None:
    """One audit row; `source` says where the write came from (`okconsole web`: the browser's address)."""
    conn.execute(
        schema.audit.insert().values(
            at=at if at is not None else now_ms(),
            actor=actor or default_actor(),
            action=action,
            signal=signal,
            count=len(ids) if count is None else count,
            ids=json.dumps(list(ids)),
            reason=reason,
            source=source,
        )
    )


# -- replay ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Selection:
    """Which dead letters of a signal a replay takes. `ids=None` means every one that matches."""

    signal: str
    ids: tuple[str, ...] | None = None
    code: str | None = None
    match: str | None = None
    key: str | None = None
    older_than_ms: int | None = None
    text: str | None = None  # the console's `/` filter (text_condition)

    def conditions(self, now: int) -> list[ColumnElement[bool]]:
        conds: list[ColumnElement[bool]] = [m.c.signal == self.signal, m.c.status == "dead"]
        if self.key is not None:
            conds.append(m.c.key == self.key)
        if self.older_than_ms is not None:
            # age of a dead letter: how long it has been dead (finished_at is set when it died)
            conds.append(func.coalesce(m.c.finished_at, m.c.updated_at) <= now - self.older_than_ms)
        if self.code is not None:
            conds.append(_last_failure(f.c.code) == self.code)
        if self.match is not None:
            conds.append(_last_failure(f.c.message).ilike(f"%{_escape_like(self.match)}%", escape="\\"))
        if self.text is not None:
            conds.append(text_condition(self.text))
        return conds


def text_condition(query: str) -> ColumnElement[bool]:
    """The dead-letters screen's `/` filter as a condition on the store, so a bulk action after it
    takes every match, not only the rows loaded: the text (case-insensitive) in the id, the key,
    or the last failure's code or message; a leading '!' keeps the letters without it."""
    invert = query.startswith("!")
    needle = f"%{_escape_like((query[1:] if invert else query).strip())}%"
    fields = (m.c.id, m.c.key, _last_failure(f.c.code), _last_failure(f.c.message))
    found = or_(*(func.coalesce(column, "").ilike(needle, escape="\\") for column in fields))
    return not_(found) if invert else found


def _last_failure(column: Any) -> Any:
    """`column` of the message's latest failure row (replay markers skipped), correlated to m."""
    return (
        select(column)
        .where(f.c.message_id == m.c.id, f.c.kind == "failure")
        .order_by(f.c.id.desc())
        .limit(1)
        .correlate(m)
        .scalar_subquery()
    )


def _escape_like(text_: str) -> str:
    return text_.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def encode_payload(signal: str, value: Any) -> str:
    """JSON text for a replacement payload, checked by the signal's schema when declared here (OKE1250)."""
    declared_signal = declared(signal)
    if declared_signal is not None:
        return payloads.encode(declared_signal, value)
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as err:
        raise ValueError(f"the replacement payload is not JSON ({err})") from err


def check_ids(conn: Connection, sel: Selection) -> None:
    """Every named id must be a message of the signal (dead or not): else UnknownMessage."""
    queries.require_signal(conn, sel.signal)
    if not sel.ids:
        return
    found: set[str] = set()
    wanted = list(dict.fromkeys(sel.ids))
    for start in range(0, len(wanted), CHUNK):
        chunk = wanted[start : start + CHUNK]
        found.update(r[0] for r in conn.execute(select(m.c.id).where(m.c.signal == sel.signal, m.c.id.in_(chunk))))
    missing = [i for i in wanted if i not in found]
    if missing:
        raise UnknownMessage(missing, sel.signal)


def _id_chunks(sel: Selection) -> list[list[str] | None]:
    if sel.ids is None:
        return [None]
    wanted = list(dict.fromkeys(sel.ids))
    return [wanted[i : i + CHUNK] for i in range(0, len(wanted), CHUNK)]


def preview(conn: Connection, sel: Selection) -> ReplayPreview:
    """What a replay would take now (count, and a sample of ids in seq order); changes nothing."""
    check_ids(conn, sel)
    now = now_ms()
    total = 0
    sample: list[str] = []
    for chunk in _id_chunks(sel):
        conds = sel.conditions(now)
        if chunk is not None:
            conds.append(m.c.id.in_(chunk))
        total += int(conn.execute(select(func.count()).select_from(m).where(and_(*conds))).scalar() or 0)
        if len(sample) < SAMPLE:
            sample += [
                r[0]
                for r in conn.execute(select(m.c.id).where(and_(*conds)).order_by(m.c.seq).limit(SAMPLE - len(sample)))
            ]
    return ReplayPreview(replayed=0, would_replay=total, ids=sample)


def candidate_seqs(conn: Connection, sel: Selection) -> list[int]:
    """The seqs a replay would take now, in emit order (used to pace a rate-limited replay)."""
    check_ids(conn, sel)
    now = now_ms()
    seqs: list[int] = []
    for chunk in _id_chunks(sel):
        conds = sel.conditions(now)
        if chunk is not None:
            conds.append(m.c.id.in_(chunk))
        seqs += [r[0] for r in conn.execute(select(m.c.seq).where(and_(*conds)))]
    return sorted(set(seqs))


@dataclass(frozen=True)
class ReplayBatch:
    ids: list[str]  # replayed, in seq order
    queues: list[str]  # the queues to wake


def replay(
    conn: Connection,
    sel: Selection,
    *,
    actor: str | None,
    reason: str | None,
    payload_text: str | None = None,
    seqs: Sequence[int] | None = None,
    verify: bool = True,
    source: str | None = None,
) -> ReplayBatch:
    """dead → pending for the selected dead letters, in one transaction.

    Same id and seq (so per-key order holds), attempts 0, lease cleared, `replays` + 1,
    a "replayed" marker appended to each failure history, one audit row, and on
    PostgreSQL a NOTIFY per affected queue (sent at commit). `seqs` restricts the
    update to those rows (a chunk of a rate-limited replay); the selection's filters
    and the `status = 'dead'` guard still apply, so a row that changed meanwhile is skipped.
    """
    if verify:
        check_ids(conn, sel)
    actor = actor or default_actor()
    now = now_ms()
    values: dict[str, Any] = {
        "status": "pending",
        "attempts": 0,
        "locked_by": None,
        "lease_expires_at": None,
        "finished_at": None,
        "updated_at": now,
        "replays": m.c.replays + 1,
        # due now, whatever it waited for before; and it holds no dedupe key (another message may
        # hold that key by now, and one key has one pending or inflight holder)
        "run_at": None,
        "dedupe": None,
    }
    if payload_text is not None:
        values["payload"] = payload_text
    done = _requeue(conn, sel, values, now, seqs)
    ids = [d[1] for d in done]
    if not ids:
        return ReplayBatch(ids=[], queues=[])
    for start in range(0, len(ids), CHUNK):  # a replayed message starts a new life: no old request stops it
        cancels.drop(conn, ids[start : start + CHUNK])
    for start in range(0, len(ids), CHUNK):  # nor for a window (`dedupe_for`)
        holds = schema.dedupe_holds
        conn.execute(delete(holds).where(holds.c.msg_id.in_(ids[start : start + CHUNK])))
    replaced = payload_text is not None
    _record_replay(conn, sel.signal, ids, actor=actor, reason=reason, replaced=replaced, now=now, source=source)
    queues = sorted({d[2] for d in done})
    notify_queues(conn, queues)
    return ReplayBatch(ids=ids, queues=queues)


def _requeue(
    conn: Connection, sel: Selection, values: dict[str, Any], now: int, seqs: Sequence[int] | None
) -> list[tuple[int, str, str]]:
    """Apply `values` to the selected dead letters (only `seqs`, when given), in bounded chunks;
    (seq, id, queue) of each row changed, in seq order."""
    if seqs is not None:
        chunks: list[tuple[str, list[Any]]] = [("seq", list(seqs[i : i + CHUNK])) for i in range(0, len(seqs), CHUNK)]
    else:
        chunks = [("id", c) if c is not None else ("all", []) for c in _id_chunks(sel)]
    done: list[tuple[int, str, str]] = []
    for kind, chunk in chunks:
        conds = sel.conditions(now)
        if kind == "seq":
            conds.append(m.c.seq.in_(chunk))
        elif kind == "id":
            conds.append(m.c.id.in_(chunk))
        result = conn.execute(update(m).where(and_(*conds)).values(**values).returning(m.c.seq, m.c.id, m.c.queue))
        done += [(r.seq, r.id, r.queue) for r in result]
    done.sort()
    return done


def _record_replay(
    conn: Connection,
    signal: str,
    ids: list[str],
    *,
    actor: str,
    reason: str | None,
    replaced: bool,
    now: int,
    source: str | None,
) -> None:
    """A "replayed" marker in each message's failure history, and one audit row."""
    note = f"replayed by {actor}"
    if replaced:
        note += " with a replaced payload"
    if reason:
        note += f": {reason}"
    conn.execute(
        f.insert(),
        [
            {
                "message_id": i,
                "attempt": 0,
                "code": REPLAYED,
                "message": note,
                "at": now,
                "run_id": None,
                "kind": REPLAYED,
            }
            for i in ids
        ],
    )
    audit_reason = reason
    if replaced:
        audit_reason = f"{reason} [payload replaced]" if reason else "[payload replaced]"
    write_audit(conn, "replay", actor, signal, ids, audit_reason, at=now, source=source)


# -- purge ----------------------------------------------------------------------------------------
def _purge_conditions(
    signal: str,
    status: str,
    older_than_ms: int | None,
    now: int,
    ids: Sequence[str] | None = None,
    text: str | None = None,
) -> list[Any]:
    if status not in FINISHABLE:
        raise ValueError(f'purge deletes finished messages: status must be "delivered" or "dead", not "{status}"')
    conds: list[Any] = [m.c.signal == signal, m.c.status == status]
    if ids is not None:  # only these (named ones in another state or signal are left alone)
        conds.append(m.c.id.in_(list(ids)))
    if older_than_ms is not None:
        conds.append(func.coalesce(m.c.finished_at, m.c.updated_at) <= now - older_than_ms)
    if text is not None:
        conds.append(text_condition(text))
    return conds


def purge_preview(
    conn: Connection,
    signal: str,
    status: str,
    older_than_ms: int | None,
    ids: Sequence[str] | None = None,
    text: str | None = None,
) -> PurgePreview:
    conds = _purge_conditions(signal, status, older_than_ms, now_ms(), ids, text)
    queries.require_signal(conn, signal)
    total = int(conn.execute(select(func.count()).select_from(m).where(and_(*conds))).scalar() or 0)
    sample = [r[0] for r in conn.execute(select(m.c.id).where(and_(*conds)).order_by(m.c.seq).limit(SAMPLE))]
    return PurgePreview(purged=0, would_purge=total, ids=sample)


def delete_rows_of(conn: Connection, ids: Sequence[str], seqs: Sequence[int]) -> None:
    """The failure and step rows and search index entries of deleted messages go with them (runs
    stay: they are the trace)."""
    search_index.forget(conn, seqs)
    for start in range(0, len(ids), CHUNK):
        chunk = list(ids[start : start + CHUNK])
        conn.execute(delete(f).where(f.c.message_id.in_(chunk)))
        conn.execute(delete(schema.steps).where(schema.steps.c.message_id.in_(chunk)))


def purge(
    conn: Connection,
    signal: str,
    status: str,
    older_than_ms: int | None,
    *,
    actor: str | None,
    reason: str | None,
    ids: Sequence[str] | None = None,
    source: str | None = None,
    text: str | None = None,
) -> Purged:
    """Delete finished messages with their failure rows and step rows, and audit it, in one transaction.

    Runs stay (they are the trace history). The audit row's `ids` holds at most
    MAX_AUDIT_IDS of the deleted ids; its `count` is exact.
    """
    now = now_ms()
    conds = _purge_conditions(signal, status, older_than_ms, now, ids, text)
    queries.require_signal(conn, signal)
    deleted: list[str] = []
    count = 0
    while True:  # bounded batches, all inside this one transaction
        batch = [r[0] for r in conn.execute(select(m.c.id).where(and_(*conds)).order_by(m.c.seq).limit(PURGE_BATCH))]
        if not batch:
            break
        rows = conn.execute(delete(m).where(and_(*conds), m.c.id.in_(batch)).returning(m.c.id, m.c.seq)).all()
        gone = [r.id for r in rows]
        delete_rows_of(conn, gone, [r.seq for r in rows])
        count += len(gone)
        deleted += gone[: MAX_AUDIT_IDS - len(deleted)]
    if count:
        write_audit(conn, "purge", actor, signal, deleted, reason, count=count, at=now, source=source)
    return Purged(purged=count, ids=deleted)
