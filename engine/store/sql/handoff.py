"""Hand-offs (PostgreSQL only): an emit gives its message straight to an idle worker.

A worker pool waiting for work with a free slot offers itself: a row in `oke_idle_workers` (its
queues, its lease, and until when the offer holds, by the lease clock). An emit of one plain
message (no key, delay, priority or dedupe) whose queue an unexpired offer names, and whose signal
is not paused, takes that offer in its own statement: it deletes the offer and inserts the message
already inflight, attempt 1, under that worker's lease, then NOTIFYs `oke_take` with
"<worker id> <seq>" instead of `oke_wake`. The worker reads the message by seq (no commit, no
fsync) and runs it: the claim's round trip with its commit leaves the emit → handler path
(docs/design/idle-handoffs.md).

An offer names the backend of the worker's LISTEN connection, which holds an advisory lock while
it lives, and an emit passes over an offer whose backend is gone: a worker SIGKILLed while idle,
or one whose connection dropped or whose server restarted, is handed nothing (its take notice
would be lost, and the message would wait out a lease). What remains is a connection the server
still thinks alive while the worker is cut off (a silent partition): messages emitted in the
offer's last seconds then wait out their lease and are reclaimed, as the ones that worker claimed
before the cut.

The table is UNLOGGED: offers are renewed every few seconds and worth nothing after a crash or on
a promoted standby (it comes back empty; idle workers offer again at their next poll). SQLite has
no other process to hand to that a claim would not wake as fast; it keeps no offers.
"""

from __future__ import annotations

from .claim import CLAIMED_COLUMNS
from .enqueue import COPY_COLUMNS

TAKE_CHANNEL = "oke_take"

IDLE_WORKERS_DDL = """
CREATE UNLOGGED TABLE IF NOT EXISTS oke_idle_workers (
    worker_id text PRIMARY KEY,
    queues text[] NOT NULL,
    lease_ms bigint NOT NULL,
    until bigint NOT NULL,
    listener_pid integer NOT NULL
)
"""

_CLOCK = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

# Every LISTEN connection holds the session advisory lock (LISTENER_LOCK_CLASS, its backend pid)
# while it lives: an emit tells a live listener from a gone one by failing to take that lock
# shared (a lock-table probe; reading pg_stat_activity instead cost an emit 0.15 ms).
LISTENER_LOCK_CLASS = 0x6F6B65  # "oke"
HOLD_LISTENER_LOCK = f"SELECT pg_advisory_lock({LISTENER_LOCK_CLASS}, pg_backend_pid())"

# $1 worker, $2 queues, $3 lease ms, $4 how long the offer holds (ms), $5 the backend pid of the
# worker's LISTEN connection: an emit hands nothing to an offer whose listener is gone (a worker
# killed, its connection lost, the server restarted), since nobody would hear the take notice.
OFFER = f"""
INSERT INTO oke_idle_workers (worker_id, queues, lease_ms, until, listener_pid)
VALUES ($1, $2::text[], $3, {_CLOCK} + $4::bigint, $5)
ON CONFLICT (worker_id) DO UPDATE
   SET queues = excluded.queues, lease_ms = excluded.lease_ms, until = excluded.until,
       listener_pid = excluded.listener_pid
"""

# $1 worker: at a stop, no emit hands it anything more.
WITHDRAW = "DELETE FROM oke_idle_workers WHERE worker_id = $1"

# $1 seq, $2 worker: the message handed over, as a claim returns it (still held: nobody took it over).
# The handed message as a claim returns it, and the ms its lease has left by the lease clock: the
# emit began the lease before its commit and the take notice, which may arrive late on a slow link.
HANDED = f"""
SELECT {", ".join(CLAIMED_COLUMNS)}, lease_expires_at - {_CLOCK}
  FROM oke_messages WHERE seq = $1 AND locked_by = $2 AND status = 'inflight'
"""

# The emit of one plain message ($1 … $11 as enqueue.POSTGRES_INSERT_ONE's): taken by an idle
# worker when one offers its queue, else pending and announced on oke_wake as before.
_EMIT_ONE = """
WITH clock AS (SELECT {clock} AS now),
taker AS (
  DELETE FROM oke_idle_workers AS w
   WHERE w.worker_id = (
           SELECT i.worker_id FROM oke_idle_workers AS i, clock
            WHERE $3 = ANY(i.queues) AND i.until > clock.now
              AND NOT EXISTS (SELECT 1 FROM oke_pauses AS p WHERE p.signal = $2)
              AND NOT pg_try_advisory_xact_lock_shared({listener_lock}, i.listener_pid)
            LIMIT 1 FOR UPDATE OF i SKIP LOCKED)
  RETURNING w.worker_id, w.lease_ms),
ins AS (
  INSERT INTO oke_messages ({columns}, locked_by, lease_expires_at)
  SELECT $1, $2, $3, $4, $5, $6, CASE WHEN t.worker_id IS NULL THEN 'pending' ELSE 'inflight' END,
         CASE WHEN t.worker_id IS NULL THEN 0 ELSE 1 END, $7, $8, $9, $9, $10, 0, $11,
         t.worker_id, clock.now + t.lease_ms
    FROM clock LEFT JOIN taker AS t ON true
  RETURNING seq, queue, locked_by)
SELECT CASE WHEN locked_by IS NULL THEN pg_notify('oke_wake', queue)
            ELSE pg_notify('{take}', locked_by || ' ' || seq) END
  FROM ins
"""
EMIT_ONE = _EMIT_ONE.format(
    clock=_CLOCK, columns=", ".join(COPY_COLUMNS), take=TAKE_CHANNEL, listener_lock=LISTENER_LOCK_CLASS
)


def take_notice(payload: str) -> tuple[str, int] | None:
    """The worker and seq an `oke_take` payload names (None for anything else)."""
    worker_id, _, seq = payload.rpartition(" ")
    if not worker_id or not seq.isdigit():
        return None
    return worker_id, int(seq)
