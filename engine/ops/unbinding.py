"""`unbind`: retire one recorded binding and end its pending broadcast copies dead.

Runs inside ONE write transaction given by `Store.write`: the binding's retirement, the copies'
status change, their failure records (code "Unbound", replayable like any dead letter), the
history count of the copies ended dead and the audit row commit together. The status change is
guarded (`status = 'pending'`, or `inflight` past its lease), so a copy a worker holds under a
live lease is left to finish.
"""

from __future__ import annotations

from sqlalchemy import Connection, and_

from ..store import queue_name, registry, schema
from ..store.base import lease_clock_ms
from . import controls, queries
from .records import UnknownFlow
from .repair import MAX_AUDIT_IDS, default_actor, write_audit

m = schema.messages
UNBOUND = "Unbound"  # the failure code of a copy ended by `unbind`


def retire(
    conn: Connection, signal: str, flow: str, *, actor: str | None, reason: str | None, source: str | None = None
) -> tuple[str, list[str]]:
    """Retire (signal, flow) and end its copies: the binding's kind and the ids it ended, in seq order."""
    kind = binding_kind(conn, signal, flow)
    now = lease_clock_ms(conn)
    registry.retire(conn, signal, flow, now)
    ids = end_copies(conn, signal, flow, kind, actor=actor, reason=reason, now=now)
    why = _audit_reason(flow, reason)
    write_audit(conn, "unbind", actor, signal, ids[:MAX_AUDIT_IDS], why, count=len(ids), at=now, source=source)
    return kind, ids


def binding_kind(conn: Connection, signal: str, flow: str) -> str:
    """The kind of the recorded (signal, flow) binding; UnknownSignal / UnknownFlow when there is none."""
    queries.require_signal(conn, signal)
    kind = registry.binding_kind(conn, signal, flow)
    if kind is None:
        raise UnknownFlow(signal, flow, registry.recorded_flow_names(conn, signal))
    return kind


def end_copies(
    conn: Connection, signal: str, flow: str, kind: str, *, actor: str | None, reason: str | None, now: int
) -> list[str]:
    """pending (or lease-expired inflight) copies of a broadcast flow → dead, each with a failure
    record. A once signal's messages are shared by its flows: none is ended."""
    if kind != "broadcast":
        return []
    where = and_(m.c.signal == signal, m.c.queue == queue_name(signal, flow, kind), controls.ready_to_end(now))
    note = f'flow "{flow}" was unbound by {actor or default_actor()}' + (f": {reason}" if reason else "")
    return controls.end_dead(conn, [where], code=UNBOUND, note=note, now=now)


def sweep(
    conn: Connection,
    signal: str,
    flow: str,
    kind: str,
    *,
    actor: str | None,
    reason: str | None,
    source: str | None = None,
) -> list[str]:
    """The copies an emitter enqueued from bindings it had read just before the retirement."""
    now = lease_clock_ms(conn)
    ids = end_copies(conn, signal, flow, kind, actor=actor, reason=reason, now=now)
    if ids:
        why = _audit_reason(flow, reason)
        write_audit(conn, "unbind", actor, signal, ids[:MAX_AUDIT_IDS], why, count=len(ids), at=now, source=source)
    return ids


def _audit_reason(flow: str, reason: str | None) -> str:
    return f"flow {flow}: {reason}" if reason else f"flow {flow}"
