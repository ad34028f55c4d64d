"""Run trees: from any run, up to its root through `parent_run_id`, then down to every descendant.

A run is one attempt of a flow on a message (`oke_runs`, written when the attempt
settles). A message stamps `parent_run_id` with the run that emitted it, and each
run that handles it records the same `parent_run_id`: so the children of a run are
the runs handling what it emitted. A run id that is referenced but has no row
(still running, or its process died before settling) appears with status "unknown".
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Connection, func, select

from ..store import schema
from .records import EmittedMessage, RunNode, UnknownRun

r = schema.runs
m = schema.messages
CHUNK = 500
MAX_NODES = 10_000  # a runaway fan-out stops growing the tree here
MAX_LISTED_MESSAGES = 1000  # per run; `emitted` still counts them all


def _run_rows(conn: Connection, run_ids: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for start in range(0, len(run_ids), CHUNK):
        chunk = run_ids[start : start + CHUNK]
        for row in conn.execute(select(r).where(r.c.run_id.in_(chunk))):
            found[row.run_id] = row
    return found


def _is_referenced(conn: Connection, run_id: str) -> bool:
    if conn.execute(select(m.c.seq).where(m.c.parent_run_id == run_id).limit(1)).first() is not None:
        return True
    return conn.execute(select(r.c.run_id).where(r.c.parent_run_id == run_id).limit(1)).first() is not None


def root_of(conn: Connection, run_id: str) -> str:
    """Walk up `parent_run_id` until a run without a parent, or one with no recorded row."""
    seen = {run_id}
    current = run_id
    while True:
        row = conn.execute(select(r.c.parent_run_id).where(r.c.run_id == current)).first()
        if row is None or row.parent_run_id is None or row.parent_run_id in seen:
            return current
        current = row.parent_run_id
        seen.add(current)


def _emitted(conn: Connection, run_ids: list[str]) -> tuple[dict[str, int], dict[str, list[EmittedMessage]]]:
    """How many messages each run emitted, and the first MAX_LISTED_MESSAGES of each (in emit order)."""
    counts: dict[str, int] = {}
    for start in range(0, len(run_ids), CHUNK):
        chunk = run_ids[start : start + CHUNK]
        for row in conn.execute(
            select(m.c.parent_run_id, func.count()).where(m.c.parent_run_id.in_(chunk)).group_by(m.c.parent_run_id)
        ):
            counts[row[0]] = int(row[1])
    listed: dict[str, list[EmittedMessage]] = defaultdict(list)
    cols = (m.c.parent_run_id, m.c.id, m.c.signal, m.c.status, m.c.key, m.c.created_at)
    small = [rid for rid, n in counts.items() if n <= MAX_LISTED_MESSAGES]
    big = [rid for rid, n in counts.items() if n > MAX_LISTED_MESSAGES]
    for start in range(0, len(small), CHUNK):
        chunk = small[start : start + CHUNK]
        for row in conn.execute(select(*cols).where(m.c.parent_run_id.in_(chunk)).order_by(m.c.seq)):
            listed[row.parent_run_id].append(_emitted_message(row))
    for rid in big:
        for row in conn.execute(
            select(*cols).where(m.c.parent_run_id == rid).order_by(m.c.seq).limit(MAX_LISTED_MESSAGES)
        ):
            listed[rid].append(_emitted_message(row))
    return counts, listed


def _emitted_message(row: Any) -> EmittedMessage:
    return EmittedMessage(id=row.id, signal=row.signal, status=row.status, key=row.key, created_at=row.created_at)


def _node(run_id: str, row: Any, emitted: int, messages: list[EmittedMessage], children: list[RunNode]) -> RunNode:
    if row is None:
        return RunNode(
            run_id=run_id,
            flow=None,
            status="unknown",
            parent_run_id=None,
            started_at=None,
            ended_at=None,
            message_id=None,
            signal=None,
            attempt=None,
            error=None,
            emitted=emitted,
            messages=messages,
            children=children,
        )
    return RunNode(
        run_id=run_id,
        flow=row.flow,
        status=row.status,
        parent_run_id=row.parent_run_id,
        started_at=row.started_at,
        ended_at=row.ended_at,
        message_id=row.message_id,
        signal=row.signal,
        attempt=row.attempt,
        error=row.error,
        emitted=emitted,
        messages=messages,
        children=children,
    )


def _order(row: Any, run_id: str) -> tuple[int, str]:
    return (row.started_at if row is not None else 0, run_id)


def tree(conn: Connection, run_id: str) -> RunNode:
    """The whole tree `run_id` belongs to, from its root down."""
    root = root_of(conn, run_id)
    rows: dict[str, Any] = _run_rows(conn, [root])
    children: dict[str, list[str]] = defaultdict(list)
    order = [root]
    level = [root]
    seen = {root}
    while level and len(order) < MAX_NODES:
        found = []
        for start in range(0, len(level), CHUNK):
            chunk = level[start : start + CHUNK]
            for row in conn.execute(select(r).where(r.c.parent_run_id.in_(chunk)).order_by(r.c.started_at, r.c.run_id)):
                if row.run_id in seen or len(order) >= MAX_NODES:
                    continue
                seen.add(row.run_id)
                rows[row.run_id] = row
                children[row.parent_run_id].append(row.run_id)
                order.append(row.run_id)
                found.append(row.run_id)
        level = found
    counts, listed = _emitted(conn, order)
    built: dict[str, RunNode] = {}
    for rid in reversed(order):  # children before parents: build bottom-up without recursion
        kids = sorted(children.get(rid, []), key=lambda k: _order(rows.get(k), k))
        built[rid] = _node(rid, rows.get(rid), counts.get(rid, 0), listed.get(rid, []), [built[k] for k in kids])
    return built[root]


def trace(conn: Connection, run_id: str) -> RunNode:
    """The run tree from the root, or UnknownRun when nothing ran or was emitted under `run_id`."""
    exists = conn.execute(select(r.c.run_id).where(r.c.run_id == run_id)).first() is not None
    if not exists and not _is_referenced(conn, run_id):
        raise UnknownRun(run_id)
    return tree(conn, run_id)


def runs_of_message(conn: Connection, message_id: str) -> list[RunNode]:
    """The attempts that handled a message, oldest first, each with what it emitted (no subtrees)."""
    rows = conn.execute(select(r).where(r.c.message_id == message_id).order_by(r.c.started_at, r.c.run_id)).all()
    counts, listed = _emitted(conn, [row.run_id for row in rows])
    return [_node(row.run_id, row, counts.get(row.run_id, 0), listed.get(row.run_id, []), []) for row in rows]
