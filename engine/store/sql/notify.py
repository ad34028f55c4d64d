"""The wake-up statements, both dialects side by side (the interface is engine/store/wake.py).

PostgreSQL tells other processes through NOTIFY, sent when the transaction commits: `oke_wake`
names a queue whose messages became eligible, `oke_tape` a live tape that grew. SQLite has no
such statement: other processes see a commit by watching the WAL file change (`wake.WalWatch`).
The enqueue's own NOTIFY is part of its insert (engine/store/sql/enqueue.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, text

WORK_CHANNEL = "oke_wake"
TAPE_CHANNEL = "oke_tape"
PAUSE_CHANNEL = "oke_pause"  # a pause or resume committed: workers re-read the paused set
CANCEL_CHANNEL = "oke_cancel"  # a request to stop a running handler committed: its holder reads it

# -- PostgreSQL (asyncpg, the settle): $1 the queues made eligible again.
POSTGRES_WAKE_QUEUES = "SELECT pg_notify('oke_wake', q) FROM unnest($1::text[]) AS q"
# -- PostgreSQL (SQLAlchemy, operator writes such as replay): one queue.
POSTGRES_WAKE_QUEUE = "SELECT pg_notify('oke_wake', :q)"
# -- PostgreSQL (SQLAlchemy, pause and resume): the signal whose pause changed.
POSTGRES_PAUSE_CHANGED = "SELECT pg_notify('oke_pause', :s)"
# -- PostgreSQL (SQLAlchemy, cancel): no payload, the workers read the requests.
POSTGRES_CANCEL_REQUESTED = "SELECT pg_notify('oke_cancel', '')"
# -- PostgreSQL (SQLAlchemy, a tape append): channel and "<head> <signal>".
POSTGRES_WAKE_TAPE = "SELECT pg_notify(:c, :p)"


def notify_queues(conn: Connection, queues: Sequence[str]) -> None:
    """On PostgreSQL, wake workers in other processes (LISTEN oke_wake) when this commits."""
    if conn.dialect.name != "postgresql":
        return
    for queue in queues:
        conn.execute(text(POSTGRES_WAKE_QUEUE), {"q": queue})


def notify_pause(conn: Connection, signal: str) -> None:
    """On PostgreSQL, tell every process's workers that `signal`'s pause changed, when this commits."""
    if conn.dialect.name == "postgresql":
        conn.execute(text(POSTGRES_PAUSE_CHANGED), {"s": signal})


def notify_cancel(conn: Connection) -> None:
    """On PostgreSQL, tell every process's workers that a handler is asked to stop, when this commits."""
    if conn.dialect.name == "postgresql":
        conn.execute(text(POSTGRES_CANCEL_REQUESTED))


def notify_tape(conn: Connection, signal: str, head: int) -> None:
    """On PostgreSQL, wake the readers of `signal`'s tape in other processes when this commits."""
    if conn.dialect.name == "postgresql":
        conn.execute(text(POSTGRES_WAKE_TAPE), {"c": TAPE_CHANNEL, "p": f"{head} {signal}"})


def tape_of_notice(payload: str) -> str:
    """The tape a `notify_tape` payload names."""
    _head, _, signal = payload.partition(" ")
    return signal
