"""Requests to stop a running handler (`oke_cancels`): what an operator's cancel writes for a
message under a live lease, and what its holder writes when it has stopped the handler.

The request is a row of its own, keyed by message: the claim and the settle never read it (their
statements stay as they are); each worker reads the whole (nearly always empty) table now and then
while it holds messages (engine/worker/cancelling.py). The holder's confirmation ends the message
dead with a failure record {code "Cancelled", message: the request's note, attempt}, fenced like a
settle, and deletes the row in the same transaction. A row whose message ended otherwise (its
handler returned first) is void: `prune` deletes it at the next cancel, `drop` at a replay.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, and_, delete, exists, select, text, update

from . import history, schema
from .base import Outcome, lease_clock_ms

c = schema.cancels
m = schema.messages
CANCELLED = "Cancelled"  # the failure code of a cancelled message, pending or running

# Plain text: the one read every worker makes while it holds messages.
REQUESTS_SQL = "SELECT message_id, reason FROM oke_cancels"


def requested(conn: Connection) -> dict[str, str]:
    """Every standing request: message id → the note its attempt is to end with."""
    return {r[0]: r[1] or "" for r in conn.execute(text(REQUESTS_SQL))}


def request(conn: Connection, rows: Sequence[tuple[str, str]], *, at: int, actor: str, note: str) -> None:
    """Ask the holders of `rows` ((message id, signal) each) to stop; a message asked already keeps
    its first request (its note and time)."""
    if not rows:
        return
    ids = [message_id for message_id, _signal in rows]
    asked = set(conn.execute(select(c.c.message_id).where(c.c.message_id.in_(ids))).scalars())
    fresh = [
        {"message_id": message_id, "signal": signal, "requested_at": at, "actor": actor, "reason": note}
        for message_id, signal in rows
        if message_id not in asked
    ]
    if fresh:
        conn.execute(c.insert(), fresh)


def drop(conn: Connection, ids: Sequence[str]) -> None:
    """Forget the requests for `ids` (the message was cancelled, or replayed: a new life)."""
    if ids:
        conn.execute(delete(c).where(c.c.message_id.in_(list(ids))))


def prune(conn: Connection) -> None:
    """Delete the void requests: their message is no longer pending or inflight (its handler
    returned before the request reached it), or no longer exists."""
    live = exists().where(m.c.id == c.c.message_id, m.c.status.in_(("pending", "inflight")))
    conn.execute(delete(c).where(~live))


def confirm(conn: Connection, worker_id: str, outcomes: Sequence[Outcome]) -> list[bool]:
    """The holder stopped these attempts: each message → dead with its Cancelled failure record and
    a failed run, its request deleted. Fenced by (seq, attempts, locked_by, inflight) like a settle:
    an attempt whose lease this worker lost meanwhile changes nothing (its run is `lease_lost`).
    Returns, per outcome, whether it held."""
    now = lease_clock_ms(conn)
    held: list[bool] = []
    for out in outcomes:
        claimed = out.claimed
        ended = conn.execute(
            update(m)
            .where(
                and_(
                    m.c.seq == claimed.seq,
                    m.c.attempts == claimed.attempts,
                    m.c.locked_by == worker_id,
                    m.c.status == "inflight",
                )
            )
            .values(status="dead", finished_at=now, updated_at=now, locked_by=None, lease_expires_at=None)
        ).rowcount
        held.append(ended == 1)
        if ended == 1:
            conn.execute(
                schema.failures.insert().values(
                    message_id=claimed.id,
                    attempt=claimed.attempts,
                    code=CANCELLED,
                    message=out.message or "",
                    at=out.ended_at,
                    run_id=out.run_id,
                    kind="failure",
                    traceback=out.traceback,
                )
            )
            conn.execute(delete(c).where(c.c.message_id == claimed.id))
            history.record(conn, claimed.signal, now, dead=1)
        conn.execute(
            schema.runs.insert().values(
                run_id=out.run_id,
                flow=out.flow,
                trigger=claimed.signal,
                signal=claimed.signal,
                message_id=claimed.id,
                parent_run_id=claimed.parent_run_id,
                status="failed" if ended == 1 else "lease_lost",
                attempt=claimed.attempts,
                worker_id=worker_id,
                started_at=out.started_at,
                ended_at=out.ended_at,
                error=f"{CANCELLED}: {out.message or ''}",
            )
        )
    return held
