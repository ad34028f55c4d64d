"""The settle, both dialects side by side: record each outcome fenced by (seq, locked_by, attempts),
its failure record and its run, so a worker that lost its lease cannot overwrite the new holder.

SQLite acks a batch of successes with one `seq IN (...)` per attempt number under a savepoint,
falling back to a `json_each` join that returns what it acked; failures and runs follow, one
statement each. PostgreSQL acks successes and records their runs in one statement (data-modifying
CTEs), each failure with its failure record in another, and the failed runs in a third.
A failure's statement returns the status it left the message in (history counts it by that).
"""

from __future__ import annotations

import functools

# -- SQLite ----------------------------------------------------------------------------------------
# Successes from ACK_BATCH_FROM of them: one `seq IN (...)` statement per attempt number, under a
# savepoint, with no RETURNING. When every outcome matched its row (the rule) that is all; when one
# did not (its lease was lost), the savepoint is rolled back and SQLITE_ACK_BATCH, which returns the rows
# it acked, does the batch instead. It is cheaper a message than SQLITE_ACK_BATCH alone (its
# json_each join and RETURNING) and, from ACK_BATCH_FROM outcomes on, than acking one by one.
ACK_BATCH_FROM = 4
ACK_ROWS_PER_STATEMENT = 64


@functools.lru_cache(maxsize=ACK_ROWS_PER_STATEMENT)
def sqlite_ack_in_statement(rows: int) -> str:
    seqs = ", ".join(["?"] * rows)
    return (
        "UPDATE oke_messages SET status = 'delivered', locked_by = NULL, lease_expires_at = NULL, "
        f"updated_at = ?, finished_at = ? WHERE seq IN ({seqs}) AND attempts = ? AND locked_by = ? "
        "AND status = 'inflight'"
    )


SQLITE_ACK_BATCH = """
UPDATE oke_messages SET status = 'delivered', locked_by = NULL, lease_expires_at = NULL,
       updated_at = :now, finished_at = :now
  FROM (SELECT value ->> 0 AS seq, value ->> 1 AS attempts FROM json_each(:fence)) AS f
 WHERE oke_messages.seq = f.seq AND oke_messages.attempts = f.attempts
   AND oke_messages.locked_by = :worker AND oke_messages.status = 'inflight'
RETURNING oke_messages.seq, oke_messages.attempts
"""

SQLITE_ACK = """
UPDATE oke_messages SET status = 'delivered', locked_by = NULL, lease_expires_at = NULL,
       updated_at = :now, finished_at = :now
 WHERE seq = :seq AND locked_by = :worker AND attempts = :attempts AND status = 'inflight'
"""

# A failure left pending is due again at once (run_at NULL), or, under a back-off, :retry_in ms on.
SQLITE_FAIL = """
UPDATE oke_messages
   SET status = CASE WHEN attempts <= retries THEN 'pending'
                     WHEN dead_letter THEN 'dead' ELSE 'delivered' END,
       finished_at = CASE WHEN attempts <= retries THEN NULL ELSE :now END,
       run_at = CASE WHEN attempts <= retries THEN :now + :retry_in ELSE run_at END,
       locked_by = NULL, lease_expires_at = NULL, updated_at = :now,
       traceparent = COALESCE(:carried, traceparent)
 WHERE seq = :seq AND locked_by = :worker AND attempts = :attempts AND status = 'inflight'
RETURNING status
"""

SQLITE_FAILURE_ROW = """
INSERT INTO oke_failures (message_id, attempt, code, message, at, run_id, kind, traceback)
VALUES (:message_id, :attempt, :code, :message, :at, :run_id, 'failure', :traceback)
"""

SQLITE_RUN_COLUMNS = (
    "run_id, flow, trigger, signal, message_id, parent_run_id, status, attempt, worker_id, started_at, ended_at, error"
)
RUN_ROWS_PER_STATEMENT = 64  # 12 parameters a row: far inside SQLite's 32,766


@functools.lru_cache(maxsize=RUN_ROWS_PER_STATEMENT)
def sqlite_runs_statement(rows: int) -> str:
    """A multi-row insert of `rows` runs: much cheaper than executemany of one row at a time."""
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * rows)
    return f"INSERT INTO oke_runs ({SQLITE_RUN_COLUMNS}) VALUES {values} ON CONFLICT (run_id) DO NOTHING"


# -- PostgreSQL ------------------------------------------------------------------------------------
# Successes and their runs in one statement (data-modifying CTEs commit together): a run is
# `succeeded` when its attempt was acked, `lease_lost` when the fence refused it.
# At most POSTGRES_ACK_ROWS_PER_STATEMENT a statement. The planner judges `status = 'inflight' AND
# locked_by = $11` by statistics taken when nearly nothing was inflight (after a burst of emits,
# say), so it expects one row there. With a large array it then scans the table once and compares
# each inflight row with every array element, quadratic (docs/design/claim-ahead.md). Below a few
# hundred rows it probes the seq index, whatever the statistics.
POSTGRES_ACK_ROWS_PER_STATEMENT = 64
POSTGRES_ACK_WITH_RUNS = """
WITH d AS (
  SELECT * FROM unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::text[], $6::text[],
                       $7::text[], $8::bigint[], $9::bigint[])
    AS d(seq, attempts, run_id, flow, signal, message_id, parent_run_id, started_at, ended_at)),
acked AS (
  UPDATE oke_messages AS u
     SET status = 'delivered', locked_by = NULL, lease_expires_at = NULL, updated_at = $10, finished_at = $10
    FROM d
   WHERE u.seq = d.seq AND u.attempts = d.attempts AND u.locked_by = $11 AND u.status = 'inflight'
  RETURNING u.seq, u.attempts),
runs AS (
  INSERT INTO oke_runs (run_id, flow, trigger, signal, message_id, parent_run_id, status, attempt,
                        worker_id, started_at, ended_at, error)
  SELECT d.run_id, d.flow, d.signal, d.signal, d.message_id, d.parent_run_id,
         CASE WHEN a.seq IS NULL THEN 'lease_lost' ELSE 'succeeded' END, d.attempts, $11,
         d.started_at, d.ended_at, NULL
    FROM d LEFT JOIN acked AS a ON a.seq = d.seq AND a.attempts = d.attempts
  ON CONFLICT (run_id) DO NOTHING)
SELECT seq, attempts FROM acked
"""

# $9: the back-off in ms (NULL: due again at once), from PostgreSQL's clock like the claim's;
# $10: after a traced failure, the traceparent column's new value (NULL: unchanged); $11: the
# handler's traceback.
POSTGRES_FAIL = """
WITH u AS (
  UPDATE oke_messages
     SET status = CASE WHEN attempts <= retries THEN 'pending'
                       WHEN dead_letter THEN 'dead' ELSE 'delivered' END,
         finished_at = CASE WHEN attempts <= retries THEN NULL ELSE $3::bigint END,
         run_at = CASE WHEN attempts <= retries
                       THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $9::bigint
                       ELSE run_at END,
         locked_by = NULL, lease_expires_at = NULL, updated_at = $3::bigint,
         traceparent = COALESCE($10::text, traceparent)
   WHERE seq = $1::bigint AND attempts = $2::int AND locked_by = $4::text AND status = 'inflight'
  RETURNING id, attempts, status),
f AS (
  INSERT INTO oke_failures (message_id, attempt, code, message, at, run_id, kind, traceback)
  SELECT id, attempts, $5::text, $6::text, $7::bigint, $8::text, 'failure', $11::text FROM u)
SELECT status FROM u
"""

POSTGRES_RUNS = """
INSERT INTO oke_runs (run_id, flow, trigger, signal, message_id, parent_run_id, status, attempt,
                      worker_id, started_at, ended_at, error)
SELECT r.run_id, r.flow, r.signal, r.signal, r.message_id, r.parent_run_id, r.status, r.attempt,
       $10, r.started_at, r.ended_at, r.error
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[],
              $8::bigint[], $9::bigint[], $11::text[])
       AS r(run_id, flow, signal, message_id, parent_run_id, status, attempt, started_at, ended_at, error)
ON CONFLICT (run_id) DO NOTHING
"""
