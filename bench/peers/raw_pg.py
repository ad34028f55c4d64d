"""The ceiling on PostgreSQL: a raw asyncpg SKIP LOCKED claim loop (the peer figures' raw asyncpg loop).

`tasks` asyncio tasks, each with its own connection, loop: claim up to `batch` rows in one
autocommit UPDATE … FOR UPDATE SKIP LOCKED … RETURNING, json.loads each payload and await a no-op
handler, then mark the batch delivered in one autocommit UPDATE; stop on an empty claim.
synchronous_commit stays at the server default (on), as for the engine. Same table, partial index
and fill as the anchor.
"""
from __future__ import annotations

import asyncio
import json

import asyncpg

from common import Window, pg_prepare_table, pg_wal, wal_fields

CLAIM_SQL = """
UPDATE messages
   SET status = 'inflight', locked_by = $1, attempts = attempts + 1,
       lease_expires_at = now() + interval '30 seconds'
 WHERE id IN (
        SELECT id FROM messages
         WHERE status = 'pending'
            OR (status = 'inflight' AND lease_expires_at < now())
         ORDER BY id LIMIT $2
         FOR UPDATE SKIP LOCKED)
RETURNING id, signal, key, payload, attempts
"""
ACK_SQL = """
UPDATE messages SET status = 'delivered', locked_by = NULL, lease_expires_at = NULL
 WHERE id = ANY($1::bigint[]) AND locked_by = $2 AND status = 'inflight'
"""
SCHEMA_SQL = """
DROP TABLE IF EXISTS messages;
CREATE TABLE messages (
    id               bigserial PRIMARY KEY,
    signal           text        NOT NULL,
    key              text        NULL,
    status           text        NOT NULL DEFAULT 'pending',
    attempts         int         NOT NULL DEFAULT 0,
    locked_by        text        NULL,
    lease_expires_at timestamptz NULL,
    payload          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX messages_ready_idx ON messages (id) WHERE status IN ('pending', 'inflight');
"""
FILL_SQL = """
INSERT INTO messages (signal, key, status, payload)
SELECT 'bench.noop', NULL, 'pending', jsonb_build_object('n', g, 'body', 'hello world')
  FROM generate_series(1, $1) AS g
"""
VERIFY_SQL = """
SELECT count(*) FILTER (WHERE status = 'delivered') AS delivered, count(*) AS total,
       coalesce(sum(attempts), 0) AS attempts, coalesce(max(attempts), 0) AS max_attempts
  FROM messages
"""


async def _noop(signal, key, payload):
    return None


async def _worker(conn, wid: int, batch: int, counter: list[int]) -> None:
    claim = await conn.prepare(CLAIM_SQL)
    name = f"w{wid}"
    while True:
        rows = await claim.fetch(name, batch)
        if not rows:
            return
        for r in rows:
            await _noop(r["signal"], r["key"], json.loads(r["payload"]))
        await conn.execute(ACK_SQL, [r["id"] for r in rows], name)
        counter[0] += len(rows)


async def run(dsn: str, n: int, tasks: int, batch: int, data_dir: str | None = None) -> dict:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SCHEMA_SQL)
        await conn.execute(FILL_SQL, n)
    finally:
        await conn.close()
    await pg_prepare_table(dsn, "messages")
    conns = [await asyncpg.connect(dsn) for _ in range(tasks)]
    counter = [0]
    wal0 = await pg_wal(dsn)
    try:
        win = Window(data_dir).start()
        await asyncio.gather(*(_worker(c, i, batch, counter) for i, c in enumerate(conns)))
        win.stop()
    finally:
        for c in conns:
            await c.close()
    conn = await asyncpg.connect(dsn)
    try:
        chk = dict(await conn.fetchrow(VERIFY_SQL))
    finally:
        await conn.close()
    ok = chk["delivered"] == n and chk["total"] == n and chk["attempts"] == n and chk["max_attempts"] == 1
    return {"bench": "pg_raw", "tasks": tasks, "batch": batch, "messages": n, **win.fields(n),
            **wal_fields(wal0, await pg_wal(dsn), n), "processed": counter[0], "verified": ok, "check": chk}
