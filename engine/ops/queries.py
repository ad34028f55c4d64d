"""Read-only operator queries (synchronous SQLAlchemy Core over one connection)."""
from __future__ import annotations

import json
from collections import defaultdict

from sqlalchemy import Connection, select

from ..store import schema
from .records import DeadLetter, Failure

m = schema.messages
f = schema.failures


def failures_of(conn: Connection, message_ids: list[str]) -> dict[str, list[Failure]]:
    """Failure history per message, oldest first (replay markers included, code "replayed")."""
    out: dict[str, list[Failure]] = defaultdict(list)
    for start in range(0, len(message_ids), 500):
        chunk = message_ids[start:start + 500]
        rows = conn.execute(select(f.c.message_id, f.c.code, f.c.message, f.c.at, f.c.attempt)
                            .where(f.c.message_id.in_(chunk)).order_by(f.c.id))
        for r in rows:
            out[r.message_id].append(Failure(code=r.code, message=r.message, at=r.at, attempt=r.attempt))
    return out


def dead_letters(conn: Connection, signal: str, limit: int | None = None) -> list[DeadLetter]:
    query = (select(m.c.id, m.c.signal, m.c.key, m.c.payload, m.c.attempts, m.c.created_at,
                    m.c.parent_run_id)
             .where(m.c.signal == signal, m.c.status == "dead").order_by(m.c.seq.desc()))
    if limit is not None:
        query = query.limit(limit)
    rows = conn.execute(query).all()
    history = failures_of(conn, [r.id for r in rows])
    return [DeadLetter(id=r.id, signal=r.signal, key=r.key, payload=json.loads(r.payload),
                       attempts=r.attempts, failures=history.get(r.id, []), created_at=r.created_at,
                       parent_run_id=r.parent_run_id) for r in rows]
