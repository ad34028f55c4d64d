"""Paused signals (`oke_pauses`): what the claim leaves out, and the writes of pause and resume.

A pause is a row of its own (not a column of oke_signals), so an app's boot, which upserts its
signals, never clears one. Workers read the paused set now and then (engine/worker/pausing.py),
not per claim: the claim statement stays as it is, on its partial index.
"""

from __future__ import annotations

from sqlalchemy import Connection, delete, select, text

from . import schema

p = schema.pauses


# Plain text, so PostgreSQL's hot connections (postgres/store.py) run the very statement this module does.
PAUSED_SIGNALS_SQL = "SELECT signal FROM oke_pauses"


def paused_signals(conn: Connection) -> frozenset[str]:
    """Every signal paused now."""
    return frozenset(r[0] for r in conn.execute(text(PAUSED_SIGNALS_SQL)))


def is_paused(conn: Connection, signal: str) -> bool:
    return conn.execute(select(p.c.signal).where(p.c.signal == signal)).first() is not None


def add(conn: Connection, signal: str, *, at: int, actor: str, reason: str | None) -> bool:
    """Record the pause; False (nothing written) when `signal` was paused already."""
    if is_paused(conn, signal):
        return False
    conn.execute(p.insert().values(signal=signal, paused_at=at, actor=actor, reason=reason))
    return True


def remove(conn: Connection, signal: str) -> bool:
    """Lift the pause; False when `signal` was not paused."""
    return bool(conn.execute(delete(p).where(p.c.signal == signal)).rowcount)
