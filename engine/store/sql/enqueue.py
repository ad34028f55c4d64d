"""The enqueue, both dialects side by side: store new messages as pending, in one transaction.

SQLite inserts row by row through `executemany` and the store wakes this process's workers;
PostgreSQL inserts every row from arrays in one statement that also NOTIFYs each queue it filled
(sent at commit), after taking the per-key locks when any row has a key.

Rows with a time or order option (run_at, priority, dedupe) go through the `_TIMED`
statements instead, so an emit without them runs the statement it always ran. Those skip a row
whose dedupe key a pending or inflight message of its queue holds (ON CONFLICT on the partial
unique index `oke_messages_dedupe`, whose predicate the conflict target repeats).
"""

from __future__ import annotations

# A chunk of at least this many plain rows in the store's own transaction is written with COPY
# (then one NOTIFY per queue it filled): asyncpg encodes records for COPY faster than 11 arrays for
# unnest (measured: emit_many of 100,000 on PostgreSQL, bench/enqueue_bench.py).
COPY_FROM_ROWS = 1_000

# Rows per statement when many are written in one transaction (emit_many, the caller's transaction):
# bounds the arrays (PostgreSQL) and the parameter lists (SQLite) a statement carries.
ENQUEUE_CHUNK = 5_000

_COLUMNS = (
    "id, signal, queue, flow, key, payload, status, attempts, retries, dead_letter, created_at, "
    "updated_at, parent_run_id, replays, traceparent"
)
COPY_COLUMNS = tuple(c.strip() for c in _COLUMNS.split(","))  # the same columns, for COPY
_ON_DEDUPE = "ON CONFLICT (queue, dedupe) WHERE dedupe IS NOT NULL AND status IN ('pending', 'inflight') DO NOTHING"

# -- SQLite: one row of 12 parameters per message (15 for the timed one: run_at, priority, dedupe).
SQLITE_INSERT = f"""
INSERT INTO oke_messages ({_COLUMNS})
VALUES (?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?, ?, ?, 0, ?)
"""
SQLITE_INSERT_TIMED = f"""
INSERT INTO oke_messages ({_COLUMNS}, run_at, priority, dedupe)
VALUES (?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?)
{_ON_DEDUPE}
"""

# Which message holds a dedupe key of a queue (both dialects; read after a skipped insert).
HOLDER_OF_DEDUPE = (
    "SELECT id FROM oke_messages WHERE queue = {q} AND dedupe = {d} AND status IN ('pending', 'inflight')"
)
SQLITE_HOLDER = HOLDER_OF_DEDUPE.format(q="?", d="?")
POSTGRES_HOLDER = HOLDER_OF_DEDUPE.format(q="$1", d="$2")

# A key held for a window (oke_dedupe_holds): the holder's id while its message is pending or
# inflight or finished less than window_ms ago (finished_at, or updated_at for a row finished
# without one), or while `until` (set when retention deleted the message) is ahead. Read before
# the insert of an emit with a dedupe key, inside its transaction: on SQLite the writer's lock
# orders the emits, on PostgreSQL the key's advisory lock (POSTGRES_DEDUPE_LOCK) does.
WINDOW_HOLDER = """
SELECT h.msg_id FROM oke_dedupe_holds h
 WHERE h.queue = {q} AND h.dedupe = {d}
   AND (h.until > {now}
        OR EXISTS (SELECT 1 FROM oke_messages m
                    WHERE m.id = h.msg_id
                      AND (m.status IN ('pending', 'inflight')
                           OR COALESCE(m.finished_at, m.updated_at) + h.window_ms > {now})))
"""
SQLITE_WINDOW_HOLDER = WINDOW_HOLDER.format(q="?1", d="?2", now="?3")
POSTGRES_WINDOW_HOLDER = WINDOW_HOLDER.format(q="$1", d="$2", now="$3::bigint")
# The message just stored holds its key for its window (replacing a hold that lapsed).
WINDOW_HOLD = """
INSERT INTO oke_dedupe_holds (queue, dedupe, msg_id, window_ms, until) VALUES ({params}, NULL)
ON CONFLICT (queue, dedupe) DO UPDATE SET msg_id = excluded.msg_id, window_ms = excluded.window_ms, until = NULL
"""
SQLITE_WINDOW_HOLD = WINDOW_HOLD.format(params="?, ?, ?, ?")
POSTGRES_WINDOW_HOLD = WINDOW_HOLD.format(params="$1, $2, $3, $4::bigint")
# Emits of one (queue, dedupe key) take turns on PostgreSQL from the window check to their commit.
POSTGRES_DEDUPE_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended($1::text || chr(31) || $2::text, 39))"

# -- PostgreSQL: $1 … $11 are the columns as arrays, in emit order.
_POSTGRES_ROWS = """
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[],
                $8::bool[], $9::bigint[], $10::text[], $11::text[]{extra_arrays}) WITH ORDINALITY
         AS t(id, signal, queue, flow, key, payload, retries, dead_letter, created_at, parent_run_id,
              traceparent{extra_names}, ord)"""
_POSTGRES_VALUES = (
    "t.id, t.signal, t.queue, t.flow, t.key, t.payload, 'pending', 0, t.retries, "
    "t.dead_letter, t.created_at, t.created_at, t.parent_run_id, 0, t.traceparent"
)

POSTGRES_INSERT = f"""
WITH ins AS (
  INSERT INTO oke_messages ({_COLUMNS})
  SELECT {_POSTGRES_VALUES}
  {_POSTGRES_ROWS.format(extra_arrays="", extra_names="")}
   ORDER BY t.ord
  RETURNING queue)
SELECT pg_notify('oke_wake', q) FROM (SELECT DISTINCT queue AS q FROM ins) AS d
"""

# The common emit, one plain row, is handoff.EMIT_ONE: it may hand the row to an idle worker.

# $12 delay_ms (from PostgreSQL's clock: the one the claim judges run_at by), $13 run_at,
# $14 priority, $15 dedupe. Returns the ids it stored (a row skipped for its dedupe key is not).
POSTGRES_INSERT_TIMED = f"""
WITH clock AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now),
ins AS (
  INSERT INTO oke_messages ({_COLUMNS}, run_at, priority, dedupe)
  SELECT {_POSTGRES_VALUES},
         CASE WHEN t.delay_ms IS NULL THEN t.run_at ELSE clock.now + t.delay_ms END, t.priority, t.dedupe
  {
    _POSTGRES_ROWS.format(
        extra_arrays=", $12::bigint[], $13::bigint[], $14::int[], $15::text[]",
        extra_names=", delay_ms, run_at, priority, dedupe",
    )
}, clock
   ORDER BY t.ord
  {_ON_DEDUPE}
  RETURNING id, queue)
SELECT id, pg_notify('oke_wake', queue) FROM ins
"""

# Keyed emits take a per-key transaction lock first, so seq order is commit order within a key:
# no reader can ever see a later message of a key before an earlier one.
POSTGRES_KEY_LOCKS = """
SELECT pg_advisory_xact_lock(hashtextextended(k, 0))
  FROM (SELECT DISTINCT k FROM unnest($1::text[]) AS k ORDER BY k) AS keys
"""
