"""The plans of the statements behind each timed engine.ops call (EXPLAIN QUERY PLAN / EXPLAIN ANALYZE).

Runs the same `engine.ops.queries` functions inside one `store.read`, records every statement
they send (a Connection-level `before_cursor_execute` hook), then asks the database for the plan
of each distinct statement with the same parameters. Reads only: nothing here changes the store.
"""
from __future__ import annotations

from typing import Any, Callable

from sqlalchemy import event

from engine.ops import queries
from okconsole.screens.dlq import LIMIT as DLQ_LIMIT

from .timing import DLQ_SIGNAL

CALLS: dict[str, Callable[[Any], Any]] = {
    "ops.stats": queries.stats,
    "ops.dead_letters(200)": lambda conn: queries.dead_letters(conn, DLQ_SIGNAL, DLQ_LIMIT),
    "ops.failures": lambda conn: queries.failures(conn, DLQ_SIGNAL),
    "ops.message_page(50)": lambda conn: queries.message_page(conn, DLQ_SIGNAL, None, None, 50),
}


def _plans(conn: Any, fn: Callable[[Any], Any]) -> list[tuple[str, list[str]]]:
    seen: list[tuple[str, Any]] = []

    def hook(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, executemany: bool) -> None:
        if not executemany and statement.lstrip().upper().startswith("SELECT"):
            if all(statement != s for s, _ in seen):
                seen.append((statement, parameters))

    event.listen(conn, "before_cursor_execute", hook)
    try:
        fn(conn)
    finally:
        event.remove(conn, "before_cursor_execute", hook)
    out = []
    for statement, parameters in seen:
        if conn.dialect.name == "sqlite":
            rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters).all()
            lines = [f"{'  ' * _depth(rows, r)}{r[3]}" for r in rows]
        else:
            rows = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) " + statement, parameters).all()
            lines = [r[0] for r in rows]
        out.append((" ".join(statement.split()), lines))
    return out


def _depth(rows: list[Any], row: Any) -> int:
    parents = {r[0]: r[1] for r in rows}
    depth, parent = 0, row[1]
    while parent in parents:
        depth, parent = depth + 1, parents[parent]
    return depth


async def explain(store: Any, names: list[str] | None = None) -> dict[str, list[tuple[str, list[str]]]]:
    out = {}
    for name, fn in CALLS.items():
        if names is None or name in names:
            out[name] = await store.read(lambda conn, fn=fn: _plans(conn, fn))
    return out


def render(plans: dict[str, list[tuple[str, list[str]]]], width: int = 160) -> str:
    lines = []
    for name, statements in plans.items():
        lines.append(f"  {name}")
        for statement, plan in statements:
            lines.append(f"    SQL  {statement[:width]}{'…' if len(statement) > width else ''}")
            lines.extend(f"         {p}" for p in plan)
    return "\n".join(lines)
