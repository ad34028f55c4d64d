"""`pause` / `resume` a signal, each one write transaction with its audit row.

The pause itself is a row in `oke_pauses` (engine/store/pauses.py); workers in every process
sharing the store read that set and stop claiming the signal's queues (engine/worker/pausing.py).
On PostgreSQL both writes announce the change at commit (NOTIFY oke_pause), so every worker
re-reads the set before its next claim, and a resume wakes the workers of the signal's queues; on
SQLite the workers re-read the set every 0.5 s, and a paused worker polls as often.
"""

from __future__ import annotations

from sqlalchemy import Connection, select

from ..store import pauses, queue_name, schema
from ..store.base import lease_clock_ms
from ..store.sql.notify import notify_pause, notify_queues
from . import queries
from .records import NotPausable, PauseState
from .repair import default_actor, write_audit

PAUSABLE = ("once", "broadcast", "unknown")  # "unknown": a signal nobody recorded that has no messages yet


def pause(
    conn: Connection, signal: str, *, actor: str | None, reason: str | None, source: str | None = None
) -> PauseState:
    """Pause `signal` (a no-op, unaudited, when it is paused already)."""
    queries.require_signal(conn, signal)
    kind = queries.signal_kind(conn, signal)
    if kind not in PAUSABLE:
        raise NotPausable(signal, kind)
    actor = actor or default_actor()
    now = lease_clock_ms(conn)
    changed = pauses.add(conn, signal, at=now, actor=actor, reason=reason)
    if changed:
        write_audit(conn, "pause", actor, signal, [], reason, at=now, source=source)
        notify_pause(conn, signal)
    return PauseState(signal=signal, paused=True, changed=changed)


def resume(
    conn: Connection, signal: str, *, actor: str | None, reason: str | None, source: str | None = None
) -> PauseState:
    """Lift the pause on `signal` and wake the workers of its queues (a no-op when it was not paused)."""
    queries.require_signal(conn, signal)
    changed = pauses.remove(conn, signal)
    if changed:
        write_audit(conn, "resume", actor, signal, [], reason, at=lease_clock_ms(conn), source=source)
        notify_pause(conn, signal)
        notify_queues(conn, queues_of(conn, signal))
    return PauseState(signal=signal, paused=False, changed=changed)


def queues_of(conn: Connection, signal: str) -> list[str]:
    """The once queue of `signal` and the copy queue of every flow recorded as bound to it."""
    b = schema.bindings
    flows = conn.execute(select(b.c.flow, b.c.kind).where(b.c.signal == signal)).all()
    return sorted({signal} | {queue_name(signal, r.flow, r.kind) for r in flows})
