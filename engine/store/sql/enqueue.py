"""The enqueue, both dialects side by side: store new messages as pending, in one transaction.

SQLite inserts row by row through `executemany` and the store wakes this process's workers;
PostgreSQL inserts every row from arrays in one statement that also NOTIFYs each queue it filled
(sent at commit), after taking the per-key locks when any row has a key.
"""

from __future__ import annotations

# Rows per statement when many are written in one transaction (emit_many, the caller's transaction):
# bounds the arrays (PostgreSQL) and the parameter lists (SQLite) a statement carries.
ENQUEUE_CHUNK = 5_000

# -- SQLite: one row of 12 parameters per message.
SQLITE_INSERT = """
INSERT INTO oke_messages (id, signal, queue, flow, key, payload, status, attempts, retries,
                          dead_letter, created_at, updated_at, parent_run_id, replays, traceparent)
VALUES (?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?, ?, ?, 0, ?)
"""

# -- PostgreSQL: $1 … $11 are the columns as arrays, in emit order.
POSTGRES_INSERT = """
WITH ins AS (
  INSERT INTO oke_messages (id, signal, queue, flow, key, payload, status, attempts, retries,
                            dead_letter, created_at, updated_at, parent_run_id, replays, traceparent)
  SELECT t.id, t.signal, t.queue, t.flow, t.key, t.payload, 'pending', 0, t.retries,
         t.dead_letter, t.created_at, t.created_at, t.parent_run_id, 0, t.traceparent
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[],
                $8::bool[], $9::bigint[], $10::text[], $11::text[]) WITH ORDINALITY
         AS t(id, signal, queue, flow, key, payload, retries, dead_letter, created_at, parent_run_id,
              traceparent, ord)
   ORDER BY t.ord
  RETURNING queue)
SELECT pg_notify('oke_wake', q) FROM (SELECT DISTINCT queue AS q FROM ins) AS d
"""

# Keyed emits take a per-key transaction lock first, so seq order is commit order within a key:
# no reader can ever see a later message of a key before an earlier one.
POSTGRES_KEY_LOCKS = """
SELECT pg_advisory_xact_lock(hashtextextended(k, 0))
  FROM (SELECT DISTINCT k FROM unnest($1::text[]) AS k ORDER BY k) AS keys
"""
