"""PgQueuer doing the same work, the way its own `tools/benchmark.py --strategy drain` runs it.

Its schema (`Queries.install()`, what `pgq install` runs) in its own database on the same server.
Per run: clear its queue and log, enqueue N jobs with empty payloads through `Queries.enqueue`
(batches of 1,000, untimed), VACUUM ANALYZE + CHECKPOINT, then time D consumers — one `PgQueuer`
on its own asyncpg connection each, `run(batch_size=B, mode=drain)` — until every one has
drained. A consumer runs up to B fetched jobs at once, so D × B is its number of jobs in flight:
(5, 10) is PgQueuer's own benchmark; (1, 8) and (4, 8) hold as many as okengine's 8 and 32 handlers.
Check: the no-op entrypoint ran N times and the queue is empty.
"""

from __future__ import annotations

import asyncio
import logging
from importlib.metadata import version

import asyncpg
from common import Window, pg_prepare_table, pg_wal, wal_fields
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

VERSION = version("pgqueuer")
ENQUEUE_CHUNK = 1_000
logging.getLogger("pgqueuer").setLevel(logging.WARNING)


async def install(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        if not await queries.schema_is_installed():
            await queries.install()
    finally:
        await conn.close()


async def _fill(dsn: str, n: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.clear_queue()
        await queries.clear_queue_log()
        for start in range(0, n, ENQUEUE_CHUNK):
            size = min(ENQUEUE_CHUNK, n - start)
            await queries.enqueue(["noop"] * size, [b""] * size, [0] * size)
    finally:
        await conn.close()


async def run(dsn: str, n: int, consumers: int, batch: int, data_dir: str | None = None) -> dict:
    await _fill(dsn, n)
    await pg_prepare_table(dsn, "pgqueuer")
    ran = 0
    conns = [await asyncpg.connect(dsn) for _ in range(consumers)]
    try:
        pgqs = [PgQueuer(AsyncpgDriver(c)) for c in conns]
        for pgq in pgqs:

            @pgq.entrypoint("noop")
            async def noop(job: Job) -> None:
                nonlocal ran
                ran += 1

        wal0 = await pg_wal(dsn)
        win = Window(data_dir).start()
        await asyncio.gather(*(p.run(batch_size=batch, mode=QueueExecutionMode.drain) for p in pgqs))
        win.stop()
    finally:
        for c in conns:
            await c.close()
    wal = wal_fields(wal0, await pg_wal(dsn), n)
    check = await asyncpg.connect(dsn)
    try:
        left = await check.fetchval("SELECT count(*) FROM pgqueuer")
    finally:
        await check.close()
    chk = {"ran": ran, "left_in_queue": int(left)}
    return {"bench": "pgqueuer", "consumers": consumers, "batch": batch, "in_flight": consumers * batch,
            "messages": n, **win.fields(n), **wal, "verified": ran == n and left == 0, "check": chk,
            "pgqueuer": VERSION}
