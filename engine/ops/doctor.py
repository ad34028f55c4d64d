"""`okconsole doctor`: what is wrong with a store, each finding with the command that deals with it.

Each check is one function of a read connection returning a `DoctorCheck`; `checks` runs them all
in one read transaction. Statuses: "ok", "warn" (needs a look, work still flows or recovers by
itself), "fail" (messages go where they should not, or this okengine cannot serve the store).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, func, or_, select

from ..errors import OkeError
from ..store import queue_name, registry, schema
from ..store import search_index as search_index_mod
from ..store.base import lease_clock_ms
from . import queries, signal_checks
from .records import DoctorCheck
from .workers import ORPHAN_AFTER_MS, WorkerInfo, workers

DUE_AFTER_MS = 5 * 60_000  # a due message waiting longer than this is reported
SHOWN = 5  # names listed in one detail before "… and N more"
m = schema.messages


def _listed(items: list[str]) -> str:
    more = f" … and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return "; ".join(items[:SHOWN]) + more


def _age(ms: int) -> str:
    """A wait as a person says it: 45 s, 6 min, 2 h 05 min."""
    if ms < 60_000:
        return f"{ms // 1000} s"
    if ms < 3_600_000:
        return f"{ms // 60_000} min"
    return f"{ms // 3_600_000} h {ms % 3_600_000 // 60_000:02d} min"


def schema_version(conn: Connection) -> DoctorCheck:
    found = conn.execute(select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")).scalar()
    mine = schema.SCHEMA_VERSION
    if found is not None and int(found) == mine:
        return DoctorCheck("schema", "ok", f"store schema version {found}, the version this okengine writes")
    return DoctorCheck(
        "schema",
        "fail",
        f"store schema version {found}, this okengine knows {mine}: upgrade okengine (pip install -U okengine) "
        "on every process that opens this store",
    )


def search_index(conn: Connection) -> DoctorCheck:
    """Whether search answers from the text index (store/search_index.py) or scans in windows."""
    marks = search_index_mod.marks(conn)
    if marks is None:
        missing = "pg_trgm (CREATE EXTENSION pg_trgm, as the database's owner)"
        if conn.dialect.name != "postgresql":
            missing = "SQLite's FTS5 with the trigram tokenizer (SQLite 3.34 or later)"
        return DoctorCheck(
            "search_index",
            "warn",
            f"no text index: searches scan each signal in windows, page after page. It needs {missing}; "
            "the next start of an app creates it and fills it in the background",
        )
    behind = (marks.newest_seq - marks.seq) + (marks.newest_failure_id - marks.failure_id)
    if not marks.caught_up:
        return DoctorCheck(
            "search_index",
            "warn",
            f"the text index is {behind} row(s) behind: searches scan in windows until a started app's "
            "background pass catches up (it indexes in batches while the app runs)",
        )
    return DoctorCheck(
        "search_index", "ok", f"searches answer from the text index ({behind} newest row(s) read directly)"
    )


def too_new(error: Exception) -> DoctorCheck:
    """The schema check when the store could not even be opened: its schema is newer than ours."""
    return DoctorCheck("schema", "fail", f"{error}: run pip install -U okengine, then okconsole doctor again")


def orphaned_leases(conn: Connection, orphan_after_ms: int = ORPHAN_AFTER_MS) -> DoctorCheck:
    gone: list[WorkerInfo] = [w for w in workers(conn, orphan_after_ms=orphan_after_ms) if w.orphaned]
    if not gone:
        return DoctorCheck("orphaned leases", "ok", "every lease is held by a worker seen in the last 30 s")
    total = sum(w.orphaned for w in gone)
    holders = [f"{w.worker_id} ({w.state}, {w.orphaned} held)" for w in gone]
    sample = conn.execute(
        select(m.c.id)
        .where(m.c.status == "inflight", m.c.locked_by.in_([w.worker_id for w in gone]))
        .order_by(m.c.seq)
        .limit(1)
    ).scalar()
    return DoctorCheck(
        "orphaned leases",
        "warn",
        f"{total} message(s) held by workers not seen for {_age(orphan_after_ms)}: {_listed(holders)}. "
        f"They run again when their lease expires; see okconsole workers, and okconsole show {sample} "
        "for when; a holder that is still running is stuck (check its host and process).",
    )


def once_with_two_flows(conn: Connection) -> DoctorCheck:
    split = [s for s in queries.stats(conn) if s.kind == "once" and len(s.flows) > 1]
    if not split:
        return DoctorCheck("once signals with two flows", "ok", "each once signal is bound to one flow")
    found = [f"OKE1071: {OkeError.of(1071, signal=s.signal, flows=', '.join(s.flows)).cause}" for s in split]
    first = split[0]
    return DoctorCheck(
        "once signals with two flows",
        "fail",
        f"{_listed(found)} The flows split the messages between them: stop the processes that bind the "
        f"unwanted flow, then okconsole unbind {first.signal} {first.flows[-1]} (or declare the signal as "
        "signal.broadcast if every flow should get each message).",
    )


def inactive_with_copies(conn: Connection) -> DoctorCheck:
    stale = []
    for b in registry.listing(conn):
        if b.active or b.kind != "broadcast":
            continue
        queue = queue_name(b.signal, b.flow, b.kind)
        n = conn.execute(
            select(func.count()).where(m.c.signal == b.signal, m.c.status == "pending", m.c.queue == queue)
        ).scalar_one()
        if n:
            stale.append((b.signal, b.flow, int(n)))
    if not stale:
        return DoctorCheck("inactive bindings", "ok", "no inactive binding holds pending copies")
    signal, flow, _n = stale[0]
    return DoctorCheck(
        "inactive bindings",
        "warn",
        f"{_listed([f'{s} → {f}: {n} pending' for s, f, n in stale])}. No running process binds these flows: "
        f"start one that does, or okconsole unbind {signal} {flow} (its pending copies end dead, replayable).",
    )


def paused_signals(conn: Connection) -> DoctorCheck:
    p = schema.pauses
    rows = conn.execute(select(p.c.signal, p.c.actor, p.c.reason).order_by(p.c.signal)).all()
    if not rows:
        return DoctorCheck("paused signals", "ok", "no signal is paused")
    items = [f"{r.signal} (by {r.actor}{': ' + r.reason if r.reason else ''})" for r in rows]
    return DoctorCheck(
        "paused signals",
        "warn",
        f"{_listed(items)}: their messages are stored but not handled; okconsole resume {rows[0].signal} "
        "when the reason is gone.",
    )


def old_due_messages(conn: Connection, due_after_ms: int = DUE_AFTER_MS) -> DoctorCheck:
    now = lease_clock_ms(conn)
    late = []
    for s in queries.stats(conn):
        if not s.pending or s.kind == "live":
            continue
        due_since = func.coalesce(m.c.run_at, m.c.created_at)
        oldest = conn.execute(
            select(due_since)
            .where(m.c.signal == s.signal, m.c.status == "pending", or_(m.c.run_at.is_(None), m.c.run_at <= now))
            .order_by(m.c.seq)
            .limit(1)
        ).scalar()
        if oldest is not None and now - int(oldest) > due_after_ms:
            late.append((s.signal, now - int(oldest), s.pending))
    if not late:
        return DoctorCheck("due messages", "ok", f"no due message has waited more than {_age(due_after_ms)}")
    items = [f"{name}: oldest due {_age(age)} ago, {n} pending" for name, age, n in late]
    return DoctorCheck(
        "due messages",
        "warn",
        f"{_listed(items)}. Check that a worker runs their flows (okconsole workers), that the signal is not "
        f"paused, and what fails (okconsole failures {late[0][0]}).",
    )


def checks(
    conn: Connection, orphan_after_ms: int = ORPHAN_AFTER_MS, due_after_ms: int = DUE_AFTER_MS
) -> list[DoctorCheck]:
    """Every check, in one read transaction, in the order doctor prints them."""
    steps: list[Callable[[Connection], DoctorCheck]] = [
        schema_version,
        search_index,
        lambda c: orphaned_leases(c, orphan_after_ms),
        once_with_two_flows,
        inactive_with_copies,
        paused_signals,
        lambda c: old_due_messages(c, due_after_ms),
        signal_checks.dead_letters,
        signal_checks.failure_rate,
        signal_checks.blocked_keys,
    ]
    return [step(conn) for step in steps]
