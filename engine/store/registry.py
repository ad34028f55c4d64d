"""The declared signals and flow bindings each app records at boot, and how recent they are.

The console and other processes learn from these rows what exists without
importing the user's code: a signal's kind, options and payload JSON Schema, and
which flows consume it (a broadcast emitter copies a message once per active flow).
A binding is active while it was seen (`last_seen`: boot, then the heartbeat of a
running app) within its `ttl_ms` (the binding_ttl of the app that bound it), and
not retired by an operator's `unbind`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, NamedTuple

from sqlalchemy import Connection, and_, func, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite

from .. import json_schemas
from ..durations import parse_duration_ms
from ..ids import now_ms
from ..signals import Signal
from . import schema

b = schema.bindings
DEFAULT_BINDING_TTL = "7d"
DEFAULT_BINDING_TTL_MS = parse_duration_ms(DEFAULT_BINDING_TTL) or 0
BINDINGS_CACHE_S = 2.0  # an emitter reuses what it read of the bindings for this long
RECENT_MS = 5 * 60_000  # "a process seen in the last 5 minutes"
LAST_SEEN = func.coalesce(b.c.last_seen, b.c.updated_at)  # rows recorded before schema 3 have no last_seen
TTL_MS = func.coalesce(b.c.ttl_ms, DEFAULT_BINDING_TTL_MS)


def _upsert(conn: Connection, table: Any, rows: list[dict[str, Any]], keys: list[str]) -> None:
    if not rows:
        return
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(table).values(rows)
    updates = {c: stmt.excluded[c] for c in rows[0] if c not in keys}
    conn.execute(stmt.on_conflict_do_update(index_elements=keys, set_=updates))


def record(
    conn: Connection,
    app_name: str,
    signals: Iterable[Signal],
    bindings: Iterable[tuple[str, str, str]],
    ttl_ms: int = DEFAULT_BINDING_TTL_MS,
) -> None:
    """Upsert signal declarations and (signal, flow, kind) bindings, seen now.

    Booting with a binding makes it active again even if an operator retired it: the code that
    runs says the flow is wanted (`unbind` is for flows no process runs any more)."""
    now = now_ms()
    signal_rows = [
        {
            "name": s.name,
            "kind": s.kind,
            "retries": s.retries,
            "dead_letter": s.dead_letter,
            "optional": s.optional,
            "retention": json.dumps(s.retention) if s.retention else None,
            "description": s.description,
            "app": app_name,
            "updated_at": now,
            "json_schema": json_schemas.describe(s),
            "concurrency": s.concurrency,
            "rate": s.rate,
        }
        for s in sorted(signals, key=lambda s: s.name)
    ]
    _upsert(conn, schema.signals, signal_rows, ["name"])
    binding_rows = [
        {
            "signal": sig,
            "flow": flow,
            "kind": kind,
            "updated_at": now,
            "last_seen": now,
            "ttl_ms": ttl_ms,
            "retired_at": None,
        }
        for sig, flow, kind in sorted(set(bindings))
    ]
    _upsert(conn, schema.bindings, binding_rows, ["signal", "flow"])


def record_clocks(conn: Connection, app_name: str, clocks: Iterable[tuple[str, str, str, str, bool]]) -> None:
    """Upsert the clock triggers an app declared: (flow, implicit signal, spec, tz, catch_up)."""
    now = now_ms()
    rows = [
        {"flow": flow, "signal": sig, "spec": spec, "tz": tz, "catch_up": catch_up, "app": app_name, "updated_at": now}
        for flow, sig, spec, tz, catch_up in sorted(set(clocks))
    ]
    _upsert(conn, schema.clocks, rows, ["flow"])


def touch(conn: Connection, bindings: Iterable[tuple[str, str]]) -> None:
    """A running app's heartbeat: its bindings were seen now (a retired one stays retired)."""
    pairs = sorted(set(bindings))
    if pairs:
        conn.execute(update(b).where(tuple_(b.c.signal, b.c.flow).in_(pairs)).values(last_seen=now_ms()))


class Recorded(NamedTuple):
    """The flows recorded for one signal, as an emitter needs them."""

    bound: list[str]  # not retired (a once or live emitter's subscribers)
    active: list[str]  # not retired and seen within their TTL (a broadcast's copies)
    retired: set[str]  # retired by `unbind` (no copies, even from a process that still binds them)


def recorded_flows(conn: Connection, signal: str) -> Recorded:
    now = now_ms()
    rows = conn.execute(
        select(b.c.flow, b.c.retired_at, (LAST_SEEN + TTL_MS >= now).label("fresh"))
        .where(b.c.signal == signal)
        .order_by(b.c.flow)
    ).all()
    return Recorded(
        bound=[r.flow for r in rows if r.retired_at is None],
        active=[r.flow for r in rows if r.retired_at is None and r.fresh],
        retired={r.flow for r in rows if r.retired_at is not None},
    )


def bound_flows(conn: Connection, signal: str) -> list[str]:
    """Every flow bound to `signal` and not retired."""
    return recorded_flows(conn, signal).bound


def recent_flows(conn: Connection, seen_within_ms: int = RECENT_MS) -> dict[str, list[str]]:
    """Per signal, the flows (or live exposures) a process ran with in the last `seen_within_ms`."""
    out: dict[str, list[str]] = {}
    rows = conn.execute(
        select(b.c.signal, b.c.flow)
        .where(b.c.retired_at.is_(None), LAST_SEEN >= now_ms() - seen_within_ms)
        .order_by(b.c.signal, b.c.flow)
    )
    for sig, flow in rows:
        out.setdefault(sig, []).append(flow)
    return out


class BindingRecord(NamedTuple):
    signal: str
    kind: str
    flow: str
    last_seen: int
    active: bool
    retired_at: int | None


def listing(conn: Connection) -> list[BindingRecord]:
    """Every recorded binding, retired ones included, by signal and flow."""
    now = now_ms()
    rows = conn.execute(
        select(b.c.signal, b.c.kind, b.c.flow, LAST_SEEN.label("seen"), TTL_MS.label("ttl"), b.c.retired_at).order_by(
            b.c.signal, b.c.flow
        )
    )
    return [
        BindingRecord(
            signal=r.signal,
            kind=r.kind,
            flow=r.flow,
            last_seen=int(r.seen),
            active=r.retired_at is None and int(r.seen) + int(r.ttl) >= now,
            retired_at=r.retired_at,
        )
        for r in rows
    ]


def retire(conn: Connection, signal: str, flow: str, at: int) -> bool:
    """Mark one binding retired (no new copies); False when no such binding is recorded."""
    result = conn.execute(
        update(b)
        .where(and_(b.c.signal == signal, b.c.flow == flow))
        .values(retired_at=func.coalesce(b.c.retired_at, at))
    )
    return result.rowcount == 1


def binding_kind(conn: Connection, signal: str, flow: str) -> str | None:
    """The kind of the recorded (signal, flow) binding, retired or not; None when none is recorded."""
    kind = conn.execute(select(b.c.kind).where(b.c.signal == signal, b.c.flow == flow)).scalar()
    return None if kind is None else str(kind)


def recorded_flow_names(conn: Connection, signal: str) -> list[str]:
    """Every flow ever recorded for `signal` (retired ones included), by name."""
    return [r[0] for r in conn.execute(select(b.c.flow).where(b.c.signal == signal).order_by(b.c.flow))]


def json_schema_of(conn: Connection, signal: str) -> tuple[bool, str | None]:
    """(recorded, JSON Schema text or None) for `signal` as its app recorded it at boot."""
    row = conn.execute(select(schema.signals.c.json_schema).where(schema.signals.c.name == signal)).first()
    return (row is not None, row[0] if row is not None else None)


def known_signals(conn: Connection) -> list[str]:
    """Names of every recorded signal, plus any signal that has messages but no record."""
    names = {r[0] for r in conn.execute(select(schema.signals.c.name))}
    names.update(r[0] for r in conn.execute(select(schema.messages.c.signal).distinct()))
    return sorted(names)
