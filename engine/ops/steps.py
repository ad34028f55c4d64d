"""Durable step results: one row per (message, step name)."""
from __future__ import annotations

from sqlalchemy import Connection, select

from ..ids import now_ms
from ..store import schema


def load(conn: Connection, message_id: str, name: str) -> str | None:
    row = conn.execute(select(schema.steps.c.result).where(schema.steps.c.message_id == message_id,
                                                           schema.steps.c.name == name)).first()
    return None if row is None else row[0]


def save(conn: Connection, message_id: str, name: str, result: str, run_id: str) -> None:
    """Record a finished step; a concurrent twin that finished first keeps its result."""
    if load(conn, message_id, name) is None:
        conn.execute(schema.steps.insert().values(message_id=message_id, name=name, result=result,
                                                  run_id=run_id, at=now_ms()))
