"""Durable step results: one row per (message, step name)."""

from __future__ import annotations

from sqlalchemy import Connection, select
from sqlalchemy.dialects import postgresql, sqlite

from ..ids import now_ms
from . import schema


def load(conn: Connection, message_id: str, name: str) -> str | None:
    row = conn.execute(
        select(schema.steps.c.result).where(schema.steps.c.message_id == message_id, schema.steps.c.name == name)
    ).first()
    return None if row is None else row[0]


def save(conn: Connection, message_id: str, name: str, result: str, run_id: str) -> str:
    """Record a finished step and return the recorded result: when a twin holder (a stale lease)
    finished the same step first, its result stands and is returned instead."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    conn.execute(
        dialect.insert(schema.steps)
        .values(message_id=message_id, name=name, result=result, run_id=run_id, at=now_ms())
        .on_conflict_do_nothing(index_elements=["message_id", "name"])
    )
    recorded = load(conn, message_id, name)
    return result if recorded is None else recorded
