"""The latency peer: a raw LISTEN/NOTIFY worker (the peer figures' latency script, notify mode).

Run as a child process by latency.py:  python bench/peers/raw_latency.py worker DSN
The worker has a dedicated LISTEN connection setting an asyncio.Event (5 s fallback poll) and a
claim connection: loop { clear; claim 1 (FOR UPDATE SKIP LOCKED); if a row: record time.time() at
handler entry, print "H <n> <t>", ack; else wait for the event }. The producer emits one row per
message with INSERT … RETURNING + pg_notify in one autocommit statement. synchronous_commit on.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time

import asyncpg

SCHEMA = """
DROP TABLE IF EXISTS latency_messages;
CREATE TABLE latency_messages (
    id bigserial PRIMARY KEY, signal text NOT NULL, key text NULL,
    status text NOT NULL DEFAULT 'pending', attempts int NOT NULL DEFAULT 0, locked_by text NULL,
    lease_expires_at timestamptz NULL, payload jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX latency_messages_ready_idx ON latency_messages (id) WHERE status IN ('pending', 'inflight');
"""
CLAIM_SQL = """
UPDATE latency_messages
   SET status = 'inflight', locked_by = $1, attempts = attempts + 1,
       lease_expires_at = now() + interval '30 seconds'
 WHERE id IN (SELECT id FROM latency_messages
               WHERE status = 'pending' OR (status = 'inflight' AND lease_expires_at < now())
               ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, signal, key, payload, attempts
"""
ACK_SQL = """
UPDATE latency_messages SET status = 'delivered', locked_by = NULL, lease_expires_at = NULL
 WHERE id = ANY($1::bigint[]) AND locked_by = $2 AND status = 'inflight'
"""
EMIT_SQL = """
WITH ins AS (INSERT INTO latency_messages (signal, key, payload) VALUES ('bench.noop', NULL, $1::jsonb)
             RETURNING id)
SELECT id, pg_notify('bench_raw_wake', id::text) FROM ins
"""
VERIFY_SQL = ("SELECT count(*) FILTER (WHERE status = 'delivered'), coalesce(sum(attempts), 0), count(*) "
              "FROM latency_messages")


async def setup(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SCHEMA)
    finally:
        await conn.close()


class Emitter:
    """The producer side: one connection, one prepared INSERT + NOTIFY."""

    async def open(self, dsn: str) -> "Emitter":
        self.conn = await asyncpg.connect(dsn)
        self.stmt = await self.conn.prepare(EMIT_SQL)
        return self

    async def emit(self, value: dict) -> None:
        await self.stmt.fetchrow(json.dumps(value))

    async def verify(self, n: int) -> tuple[dict, bool]:
        d, a, total = await self.conn.fetchrow(VERIFY_SQL)
        return {"delivered": d, "attempts": a, "total": total}, d == n and a == n and total == n

    async def close(self) -> None:
        await self.conn.close()


async def worker(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    listen = await asyncpg.connect(dsn)
    event = asyncio.Event()
    await listen.add_listener("bench_raw_wake", lambda *a: event.set())
    claim = await conn.prepare(CLAIM_SQL)
    loop = asyncio.get_running_loop()
    stop = loop.run_in_executor(None, sys.stdin.readline)  # EOF: the parent is done
    out = sys.stdout

    async def handler(value):
        return None

    print("READY", flush=True)
    while not stop.done():
        event.clear()
        rows = await claim.fetch("lat-w")
        for r in rows:
            value = json.loads(r["payload"])
            t = time.time()
            out.write(f"H {value['n']} {t!r}\n")
            out.flush()
            await handler(value)
            await conn.execute(ACK_SQL, [r["id"]], "lat-w")
        if rows:
            continue
        waiter = asyncio.ensure_future(event.wait())
        await asyncio.wait([waiter, stop], timeout=5.0, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
    await conn.close()
    await listen.close()


if __name__ == "__main__" and sys.argv[1] == "worker":
    asyncio.run(worker(sys.argv[2]))
