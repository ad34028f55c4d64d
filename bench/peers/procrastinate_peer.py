"""procrastinate 3.x doing the same work (the worker part of the peer figures' own script).

PsycopgConnector (psycopg 3 + pool; procrastinate 3 has no asyncpg connector), its schema applied
into its own database on the same server. Per run: TRUNCATE its tables, defer N no-op jobs with
`batch_defer_async` (1,000 per call, untimed), VACUUM ANALYZE + CHECKPOINT, then time
`run_worker_async(concurrency=C, wait=False)` (listen_notify on, delete_jobs never), which
returns once the queue is empty. Pool min=max=C+4 connections so C job workers are never starved.
Check: every job `succeeded`, sum(attempts) == N (finish_job counts one attempt per run).
"""
from __future__ import annotations

import logging

import procrastinate
import psycopg

from common import Window, pg_prepare_table, pg_wal, wal_fields

TABLES = "procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers, procrastinate_workers"
VERSION = procrastinate.__version__
logging.getLogger("procrastinate").setLevel(logging.WARNING)


def _make_app(dsn: str, pool: int) -> tuple[procrastinate.App, object]:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=pool,
                                                                      max_size=pool))

    @app.task(name="noop", queue="bench")
    async def noop(i: int) -> None:
        return None

    return app, noop


async def apply_schema(dsn: str) -> None:
    app, _ = _make_app(dsn, 1)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


def _check(dsn: str) -> dict:
    with psycopg.connect(dsn, autocommit=True) as c:
        counts = dict(c.execute("SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY 1").fetchall())
        attempts = c.execute("SELECT coalesce(sum(attempts), 0), coalesce(max(attempts), 0) "
                             "FROM procrastinate_jobs").fetchone()
    return {"counts": counts, "attempts": int(attempts[0]), "max_attempts": int(attempts[1])}


async def run(dsn: str, n: int, concurrency: int, data_dir: str | None = None) -> dict:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")
    app, noop = _make_app(dsn, concurrency + 4)
    async with app.open_async():
        for s in range(0, n, 1000):
            await noop.batch_defer_async(*({"i": i} for i in range(s, min(n, s + 1000))))
        await pg_prepare_table(dsn, "procrastinate_jobs")
        await app.connector.execute_query_async("SELECT 1")  # the pool is open before the clock
        wal0 = await pg_wal(dsn)
        win = Window(data_dir).start()
        await app.run_worker_async(queues=["bench"], concurrency=concurrency, wait=False,
                                   install_signal_handlers=False, listen_notify=True)
        win.stop()
    wal = wal_fields(wal0, await pg_wal(dsn), n)
    chk = _check(dsn)
    ok = chk["counts"] == {"succeeded": n} and chk["attempts"] == n and chk["max_attempts"] == 1
    return {"bench": "procrastinate", "concurrency": concurrency, "messages": n, **win.fields(n), **wal,
            "verified": ok, "check": chk, "procrastinate": VERSION}
