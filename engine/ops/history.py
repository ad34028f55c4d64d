"""`history`: a signal's counts per minute (store/history.py), gap-free for charts.

Rows run from the later of `since` and the signal's first recorded minute through the current
minute, one per minute, oldest first; a minute in which nothing happened is a row of zeros (so a
chart's x axis is time, not rows), and a signal with no history at all has no rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, func, select

from ..ids import now_ms
from ..store import schema
from ..store.history import COLUMNS, MINUTE_MS, minute_of
from . import queries

h = schema.history


@dataclass(frozen=True)
class HistoryPoint:
    """One minute of one signal (`at`: the minute's start, epoch ms). `pruned` / `pruned_runs`:
    messages and runs retention deleted in that minute."""

    at: int
    emitted: int
    delivered: int
    failed: int
    dead: int
    pruned: int
    pruned_runs: int


def history(conn: Connection, signal: str, since_ms: int, until_ms: int | None = None) -> list[HistoryPoint]:
    """Per minute from `since_ms` to `until_ms` (default now); UnknownSignal when not a signal."""
    queries.require_signal(conn, signal)
    last = minute_of(now_ms() if until_ms is None else until_ms)
    first_stored = conn.execute(select(func.min(h.c.minute)).where(h.c.signal == signal)).scalar()
    if first_stored is None:
        return []
    first = max(minute_of(since_ms), int(first_stored))
    rows = conn.execute(
        select(h.c.minute, *(h.c[name] for name in COLUMNS))
        .where(h.c.signal == signal, h.c.minute >= first, h.c.minute <= last)
        .order_by(h.c.minute)
    ).all()
    stored = {int(row[0]): [int(n) for n in row[1:]] for row in rows}
    zeros = [0] * len(COLUMNS)
    return [HistoryPoint(at, *stored.get(at, zeros)) for at in range(first, last + 1, MINUTE_MS)]
