"""Flow limits at the claim: a queue's concurrency limit and its rate limit (a sliding window log).

A limited queue ("gated") is never claimed by the plain claim statement (claim.py): the worker
claims it through a gated claim, which counts, inside the claim's own write transaction, what the
limits allow and claims no more than that. On SQLite that transaction holds the store's one write
lock; on PostgreSQL it first takes one transaction-scoped advisory lock per gated queue, in key
order (two claims never wait on each other in a cycle), so the counts it reads next (in a new
snapshot: READ COMMITTED) include every claim committed before it.

- concurrency N: at most N messages of the queue `inflight` under a live lease (by the lease
  clock). Counted on the (signal, status, seq) index: the inflight rows of one signal.
- rate N/W: at most N handler starts in any window of W ms, a start being counted when its claim
  takes the message, by the lease clock. The starts of the last W ms are rows of
  `oke_rate_starts`, one a claim with its count; older ones are deleted by the next claim that
  records a start. A claim sums the window's counts, and reads the starts one by one only when the
  window is nearly full (to say when the next start fits): a generous limit costs a sum.
  docs/design/flow-limits.md says why a sliding window log, and what it guarantees at the edges.

Standard library only: the SQLite writer process runs it.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Sequence
from typing import NamedTuple

# An idle lane held back by a concurrency limit polls this often (a slot frees when a holder in any
# process settles, and nothing announces that); a rate limit says when its next start fits.
CONCURRENCY_POLL_MS = 100


class Gate(NamedTuple):
    """The limits in force on one queue (None: no such limit)."""

    queue: str
    signal: str
    concurrency: int | None
    rate_count: int | None
    rate_window_ms: int | None

    @property
    def lock_key(self) -> int:
        """The queue's advisory lock on PostgreSQL: a signed 64-bit key (claims lock in key order)."""
        return int.from_bytes(hashlib.blake2b(self.queue.encode(), digest_size=8).digest(), "big", signed=True)


class SlidingWindowLog:
    """The starts of one rate-limited queue inside the window ending now, oldest first.

    A start at `t` counts in the window (now - W, now]; a claim at `now` may start as many more as
    keep that count at most N. Any interval of length W then holds at most N starts: take its last
    start s; every other start in it lies after s - W, so it was counted when s was admitted."""

    __slots__ = ("count", "starts", "window_ms")

    def __init__(self, count: int, window_ms: int, starts: Sequence[int]) -> None:
        self.count, self.window_ms = count, window_ms
        self.starts = sorted(starts)

    def _in_window(self, now: int) -> list[int]:
        return self.starts[bisect_right(self.starts, now - self.window_ms) :]

    def room(self, now: int) -> int:
        """How many starts fit at `now`."""
        return max(0, self.count - len(self._in_window(now)))

    def admit(self, now: int, wanted: int) -> int:
        """Record up to `wanted` starts at `now`; how many were admitted."""
        admitted = min(wanted, self.room(now))
        self.starts = self._in_window(now) + [now] * admitted
        return admitted

    def fits_at(self, now: int) -> int:
        """The earliest time from `now` on when one more start fits: `now` if one fits already,
        else when the oldest start that keeps the window full leaves it (W after it)."""
        inside = self._in_window(now)
        if len(inside) < self.count:
            return now
        return inside[len(inside) - self.count] + self.window_ms


class GateRoom(NamedTuple):
    """What the limits of one gate allow now: how many may be claimed, and, when that is less than
    asked, which limit holds the rest back and until when (ms epoch; None: until a slot frees)."""

    allowed: int
    limited_by: str | None  # "concurrency" or "rate"
    until: int | None


def gate_room(
    gate: Gate, now: int, wanted: int, running: int, starts: Sequence[int], started: int | None = None
) -> GateRoom:
    """How many of `wanted` messages `gate` lets a claim take at `now`, `running` being its inflight
    messages under a live lease and `starts` its recorded starts (any age). `started`, when given,
    is the count of starts inside the window, and `starts` is read only when it may not leave room
    (`needs_starts`): the caller passes none when it does."""
    allowed, limited_by, until = wanted, None, None
    if gate.concurrency is not None and gate.concurrency - running < allowed:
        allowed, limited_by = max(0, gate.concurrency - running), "concurrency"
    if started is not None and not needs_starts(gate, started, allowed):
        return GateRoom(allowed, limited_by, until)
    if gate.rate_count is not None and gate.rate_window_ms is not None:
        window = SlidingWindowLog(gate.rate_count, gate.rate_window_ms, starts)
        room = window.room(now)
        if room < allowed:  # after the `room` starts admitted now, the next one fits at `until`
            window.admit(now, room)
            allowed, limited_by, until = room, "rate", window.fits_at(now)
    return GateRoom(allowed, limited_by, until)


def needs_starts(gate: Gate, started: int, wanted: int) -> bool:
    """Whether a claim of `wanted` must read the window's starts one by one: only when the window's
    `started` count leaves less room than that (then it says when the next start fits)."""
    return gate.rate_count is not None and gate.rate_count - started < wanted


def expand(rows: Sequence[tuple[int, int]]) -> list[int]:
    """The start times of `oke_rate_starts` rows, (at, n): `n` starts at `at`."""
    return [at for at, n in rows for _ in range(n)]


def held_back_ms(rooms: Sequence[tuple[GateRoom, bool]], now: int) -> int | None:
    """How long an idle lane may sleep before a gate it was held back by may let more through
    (None: none held anything back). Each pair: a gate's room, and whether messages wait behind it."""
    waits = [
        CONCURRENCY_POLL_MS if room.until is None else max(1, room.until - now)
        for room, waiting in rooms
        if waiting and room.limited_by is not None
    ]
    return min(waits) if waits else None


# -- SQLite (the writer runs these with plain sqlite3 parameters) -----------------------------------
SQLITE_RUNNING = """
SELECT count(*) FROM oke_messages
 WHERE signal = ? AND status = 'inflight' AND queue = ? AND lease_expires_at >= ?
"""
SQLITE_STARTED = "SELECT coalesce(sum(n), 0) FROM oke_rate_starts WHERE queue = ? AND at > ?"
SQLITE_STARTS = "SELECT at, n FROM oke_rate_starts WHERE queue = ? AND at > ?"
SQLITE_DUE_WAITING = """
SELECT 1 FROM oke_messages
 WHERE signal = ? AND status = 'pending' AND queue = ? AND (run_at IS NULL OR run_at <= ?) LIMIT 1
"""
SQLITE_PRUNE_STARTS = "DELETE FROM oke_rate_starts WHERE queue = ? AND at <= ?"
SQLITE_RECORD_START = "INSERT INTO oke_rate_starts (queue, at, n) VALUES (?, ?, ?)"

# -- PostgreSQL ------------------------------------------------------------------------------------
# $1 the gated queues' lock keys, sorted: locked one by one in that order until the commit.
POSTGRES_LOCK_GATES = "SELECT count(pg_advisory_xact_lock(k)) FROM unnest($1::bigint[]) AS k"
# After the locks, in a new snapshot: the lease clock, and per gate ($1 queues, $2 signals, $3
# windows in ms, 0 without a rate) its running count and the count of starts inside its window.
POSTGRES_GATE_STATE = """
WITH clock AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now)
SELECT g.queue, clock.now,
       (SELECT count(*) FROM oke_messages AS m
         WHERE m.signal = g.signal AND m.status = 'inflight' AND m.queue = g.queue
           AND m.lease_expires_at >= clock.now) AS running,
       CASE WHEN g.window_ms > 0 THEN (
         SELECT coalesce(sum(r.n), 0) FROM oke_rate_starts AS r
          WHERE r.queue = g.queue AND r.at > clock.now - g.window_ms)
       END AS started,
       EXISTS (SELECT 1 FROM oke_messages AS p
                WHERE p.signal = g.signal AND p.status = 'pending' AND p.queue = g.queue
                  AND (p.run_at IS NULL OR p.run_at <= clock.now)) AS waiting
  FROM unnest($1::text[], $2::text[], $3::bigint[]) AS g(queue, signal, window_ms), clock
"""
# $1 queue, $2 the window's start: the starts inside it, one by one (a nearly full window only).
POSTGRES_STARTS = "SELECT at, n FROM oke_rate_starts WHERE queue = $1 AND at > $2"
# $1 queue, $2 now, $3 how many starts, $4 the window: record the starts, forget the ones outside it.
POSTGRES_RECORD_STARTS = """
WITH gone AS (DELETE FROM oke_rate_starts WHERE queue = $1 AND at <= $2::bigint - $4::bigint)
INSERT INTO oke_rate_starts (queue, at, n) VALUES ($1, $2, $3::integer)
"""
