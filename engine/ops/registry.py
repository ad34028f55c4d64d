"""The declared signals and flow bindings each app records at boot.

The console and other processes learn from these rows what exists without
importing the user's code: a signal's kind and options, and which flows
consume it (a broadcast emitter copies a message once per recorded flow).
"""
from __future__ import annotations

import json
from typing import Any, Iterable

from sqlalchemy import Connection, select
from sqlalchemy.dialects import postgresql, sqlite

from ..ids import now_ms
from ..signals import Signal
from ..store import schema


def _upsert(conn: Connection, table: Any, rows: list[dict[str, Any]], keys: list[str]) -> None:
    if not rows:
        return
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(table).values(rows)
    updates = {c: stmt.excluded[c] for c in rows[0] if c not in keys}
    conn.execute(stmt.on_conflict_do_update(index_elements=keys, set_=updates))


def record(conn: Connection, app_name: str, signals: Iterable[Signal],
           bindings: Iterable[tuple[str, str, str]]) -> None:
    """Upsert signal declarations and (signal, flow, kind) bindings."""
    now = now_ms()
    signal_rows = [{"name": s.name, "kind": s.kind, "retries": s.retries, "dead_letter": s.dead_letter,
                    "optional": s.optional, "retention": json.dumps(s.retention) if s.retention else None,
                    "description": s.description, "app": app_name, "updated_at": now}
                   for s in sorted(signals, key=lambda s: s.name)]
    _upsert(conn, schema.signals, signal_rows, ["name"])
    binding_rows = [{"signal": sig, "flow": flow, "kind": kind, "updated_at": now}
                    for sig, flow, kind in sorted(set(bindings))]
    _upsert(conn, schema.bindings, binding_rows, ["signal", "flow"])


def bound_flows(conn: Connection, signal: str) -> list[str]:
    """Every flow any process has bound to `signal`."""
    rows = conn.execute(select(schema.bindings.c.flow).where(schema.bindings.c.signal == signal)
                        .order_by(schema.bindings.c.flow))
    return [r[0] for r in rows]


def known_signals(conn: Connection) -> list[str]:
    """Names of every recorded signal, plus any signal that has messages but no record."""
    names = {r[0] for r in conn.execute(select(schema.signals.c.name))}
    names.update(r[0] for r in conn.execute(select(schema.messages.c.signal).distinct()))
    return sorted(names)
