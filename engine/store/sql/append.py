"""The live tape append's locking, both dialects side by side.

Every append and prune of a tape locks its metadata row (`oke_tapes`) for the transaction, so seq
follows commit order. PostgreSQL locks it with `FOR UPDATE` and creates a missing one with
`ON CONFLICT DO NOTHING` (two processes may race to create it); SQLite's write transaction
(`BEGIN IMMEDIATE`) already holds the whole database, so a plain read and insert do. The rest of
the append (events, head, prune; engine/bus/live.py) and its wake-up (notify.py) are alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Select, select, text

from ...ids import now_ms
from .. import schema

t = schema.tapes

# -- PostgreSQL: create the row unless another transaction just did.
POSTGRES_CREATE_TAPE = (
    "INSERT INTO oke_tapes (signal, epoch, head, pruned_through, pruned_count, created_at) "
    "VALUES (:s, :e, 0, 0, 0, :now) ON CONFLICT (signal) DO NOTHING"
)


def _tape_row(conn: Connection, signal: str) -> Select[Any]:
    query = select(t.c.epoch, t.c.head, t.c.pruned_through, t.c.pruned_count).where(t.c.signal == signal)
    return query.with_for_update() if conn.dialect.name == "postgresql" else query  # SQLite: no row locks


def lock_tape(conn: Connection, signal: str, new_epoch: Callable[[], str]) -> Any:
    """The tape's metadata row, created (with `new_epoch()`) if missing, locked for this transaction."""
    query = _tape_row(conn, signal)
    row = conn.execute(query).first()
    if row is not None:
        return row
    if conn.dialect.name == "postgresql":
        conn.execute(text(POSTGRES_CREATE_TAPE), {"s": signal, "e": new_epoch(), "now": now_ms()})
    else:
        conn.execute(
            t.insert().values(
                signal=signal, epoch=new_epoch(), head=0, pruned_through=0, pruned_count=0, created_at=now_ms()
            )
        )
    return conn.execute(query).first()
