"""The claim, both dialects side by side: take up to N eligible messages under a lease, higher
priority first, then in seq order.

Eligible: pending and due (no run_at, or run_at reached by the lease clock), or inflight past its
lease; and, for a keyed message, the head of its key among ready rows (per-key FIFO: a head that
is not due yet holds the later messages of its key back). Both scan the partial index
`oke_messages_ready` (schema.py) in its (priority DESC, seq) order: the WHERE repeats its
`status IN ('pending', 'inflight')` so SQLite uses it. SQLite has one writer, so it needs
no row locks; PostgreSQL claims with `FOR UPDATE SKIP LOCKED` and judges leases by its own clock.
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

T = TypeVar("T")

# What a claim returns, in the order of engine.store.base.Claimed's fields (test_once checks a
# claimed record field by field against its row); a hand-off's read (handoff.HANDED) returns the same.
CLAIMED_COLUMNS = tuple("seq id signal queue flow key payload attempts parent_run_id traceparent priority".split())
_RETURNING = ", ".join(CLAIMED_COLUMNS)

# -- SQLite: `:worker`, `:lease_until`, `:now`, `:limit`, and one `:qN` per queue ({queues}).
SQLITE_CLAIM = f"""
UPDATE oke_messages SET status = 'inflight', locked_by = :worker, attempts = attempts + 1,
       lease_expires_at = :lease_until, updated_at = :now
 WHERE seq IN (
   SELECT m.seq FROM oke_messages AS m
    WHERE m.status IN ('pending', 'inflight')
      AND (m.status = 'pending' AND (m.run_at IS NULL OR m.run_at <= :now) OR m.lease_expires_at < :now)
      AND m.queue IN ({{queues}})
      AND (m.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM oke_messages AS o
             WHERE o.status IN ('pending', 'inflight') AND o.key IS NOT NULL
               AND o.queue = m.queue AND o.key = m.key
               AND (o.seq < m.seq
                    OR (o.status = 'inflight' AND o.lease_expires_at >= :now AND o.seq <> m.seq))))
    ORDER BY m.priority DESC, m.seq LIMIT :limit)
RETURNING {_RETURNING}
"""


@functools.lru_cache(maxsize=256)
def sqlite_claim_statement(queues: int) -> str:
    """The SQLite claim over `queues` queues, named :q0 … :q{n-1}."""
    return SQLITE_CLAIM.format(queues=", ".join(f":q{i}" for i in range(queues)))


# Leases are judged by the database's clock, not the claimer's: processes on many machines share
# one database, and a machine whose clock runs ahead must not see a live lease as expired.
# The LIMIT is written into the text (one prepared statement per claim size), not a parameter: with
# `LIMIT $n` the generic plan guesses a tenth of the table is claimed and joins it by a hash over a
# scan of every message, so PostgreSQL keeps planning the claim afresh on each call (custom plans).
# With the size in the text the generic plan is the index scan and is reused
# (docs/design/claim-ahead.md; tests/test_pg_claim_plan.py keeps it so).
POSTGRES_CLAIM = f"""
WITH clock AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now),
picked AS (
  SELECT m.seq FROM oke_messages AS m, clock
   WHERE m.status IN ('pending', 'inflight')
     AND (m.status = 'pending' AND (m.run_at IS NULL OR m.run_at <= clock.now) OR m.lease_expires_at < clock.now)
     AND m.queue = ANY($3::text[])
     AND (m.key IS NULL OR NOT EXISTS (
           SELECT 1 FROM oke_messages AS o
            WHERE o.status IN ('pending', 'inflight') AND o.key IS NOT NULL
              AND o.queue = m.queue AND o.key = m.key
              AND (o.seq < m.seq
                   OR (o.status = 'inflight' AND o.lease_expires_at >= clock.now AND o.seq <> m.seq))))
   ORDER BY m.priority DESC, m.seq LIMIT {{limit}}
   FOR UPDATE OF m SKIP LOCKED)
UPDATE oke_messages AS u
   SET status = 'inflight', locked_by = $1, attempts = u.attempts + 1,
       lease_expires_at = clock.now + $2::bigint, updated_at = clock.now
  FROM picked, clock WHERE u.seq = picked.seq
RETURNING {", ".join(f"u.{column}" for column in CLAIMED_COLUMNS)}
"""


@functools.lru_cache(maxsize=256)
def postgres_claim_statement(limit: int) -> str:
    """The PostgreSQL claim of up to `limit` messages: $1 worker, $2 lease ms, $3 queues."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"claim limit must be an int ≥ 1, got {limit!r}")
    return POSTGRES_CLAIM.format(limit=limit)


# The lease clock: PostgreSQL's own (claims on many machines share it); SQLite uses this machine's.
POSTGRES_LEASE_CLOCK = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"


def claim_order(claimed: list[T]) -> list[T]:
    """A claim's rows in the order they are started: higher priority first, then emit order
    (RETURNING gives them in no order)."""
    return sorted(claimed, key=_start_key)


def _start_key(c: Any) -> tuple[int, int]:
    return (-c.priority, c.seq)


def gated_first_order(claimed: list[Any], gated: set[str]) -> list[Any]:
    """A gated claim's rows in the order they are started: the limited queues' first (they were
    claimed for free slots: behind others they would hold a slot of their limit while they wait,
    and start later than their window counted them), then as `claim_order`."""
    return sorted(claimed, key=lambda c: (c.queue not in gated, *_start_key(c)))
