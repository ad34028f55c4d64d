"""History: per signal and minute, what happened to messages (emitted, delivered, failed, dead,
pruned), for `okconsole history` and the console's charts.

Counting must not cost the hot path a write per message, so each process counts in memory
(`HistoryTally`: a dict increment per message, after its transaction committed) and the app's
background pass writes what it counted with one upsert per (signal, minute) every few seconds and
at stop (`write_counts`). The upsert adds (`n = n + excluded.n`), so two processes counting into
the same minute add up. Operator writes count in their own transaction (`record`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import Connection, delete
from sqlalchemy.dialects import postgresql, sqlite

from . import schema

if TYPE_CHECKING:
    from .base import Outcome

MINUTE_MS = 60_000
COLUMNS = ("emitted", "delivered", "failed", "dead", "pruned", "pruned_runs")
EMITTED, DELIVERED, FAILED, DEAD, PRUNED, PRUNED_RUNS = range(len(COLUMNS))
# A failed attempt's message status after the settle -> the column it counts in. A last attempt
# of a signal without dead letters ends `delivered` (its status says so) and counts there.
_FAILED_TO = {"pending": FAILED, "dead": DEAD, "delivered": DELIVERED}

Counts = dict[tuple[str, int], list[int]]


def minute_of(at_ms: int) -> int:
    """The start of the minute `at_ms` falls in (epoch ms)."""
    return at_ms - at_ms % MINUTE_MS


class HistoryTally:
    """What this process counted since the last flush, per (signal, minute)."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: Counts = {}

    def add(self, signal: str, at_ms: int, column: int, n: int = 1) -> None:
        key = (signal, at_ms - at_ms % MINUTE_MS)
        row = self._counts.get(key)
        if row is None:
            row = self._counts[key] = [0] * len(COLUMNS)
        row[column] += n

    def emitted(self, rows: Iterable[tuple[str, int]]) -> None:
        """(signal, created_at) of each stored row (a broadcast counts one per copy)."""
        for signal, created_at in rows:
            self.add(signal, created_at, EMITTED)

    def settled(self, outcomes: Sequence[Outcome], held: Sequence[bool], failed_to: dict[tuple[int, int], str]) -> None:
        """Held outcomes of a committed settle: a success is delivered; a failure counts by the
        status it left its message in (`failed_to`, by (seq, attempts)). Lost leases count nothing.
        `add` inlined: this runs for every settled message."""
        counts = self._counts
        for out, still in zip(outcomes, held, strict=True):
            if not still:
                continue
            c = out.claimed
            column = DELIVERED if out.ok else _FAILED_TO.get(failed_to.get((c.seq, c.attempts), ""), FAILED)
            key = (c.signal, out.ended_at - out.ended_at % MINUTE_MS)
            row = counts.get(key)
            if row is None:
                row = counts[key] = [0] * len(COLUMNS)
            row[column] += 1

    def take(self) -> Counts:
        """Everything counted so far, to be written; the tally starts again from zero."""
        counts, self._counts = self._counts, {}
        return counts

    def put_back(self, counts: Counts) -> None:
        """A flush that did not commit: its counts join the next one."""
        for (signal, minute), row in counts.items():
            for column, n in enumerate(row):
                if n:
                    self.add(signal, minute, column, n)


def write_counts(conn: Connection, counts: Counts) -> None:
    """One upsert for every (signal, minute) of `counts`, adding to what is stored (in key order,
    so two processes flushing the same minutes lock them in the same order on PostgreSQL)."""
    if not counts:
        return
    rows = [
        {"signal": signal, "minute": minute, **dict(zip(COLUMNS, row, strict=True))}
        for (signal, minute), row in sorted(counts.items())
    ]
    h = schema.history
    insert = postgresql.insert(h) if conn.dialect.name == "postgresql" else sqlite.insert(h)
    conn.execute(
        insert.on_conflict_do_update(
            index_elements=[h.c.signal, h.c.minute],
            set_={name: h.c[name] + insert.excluded[name] for name in COLUMNS},
        ),
        rows,
    )


def record(conn: Connection, signal: str, at_ms: int, *, dead: int = 0, pruned: int = 0) -> None:
    """Count an operator write (unbind, cancel: `dead`) in the caller's transaction, at once."""
    tally = HistoryTally()
    if dead:
        tally.add(signal, at_ms, DEAD, dead)
    if pruned:
        tally.add(signal, at_ms, PRUNED, pruned)
    write_counts(conn, tally.take())


def prune(conn: Connection, before_ms: int) -> int:
    """Delete the minutes older than `before_ms` (history_ttl); how many rows went."""
    return conn.execute(delete(schema.history).where(schema.history.c.minute < minute_of(before_ms))).rowcount
