"""Engine throughput runs: PostgreSQL (one process, C handlers; or P processes), SQLite.

Each run gets a fresh database (PostgreSQL) or file (SQLite), emits N messages through the public
`app.emit` (untimed), gives the table every contender's treatment (PostgreSQL: VACUUM ANALYZE +
CHECKPOINT; SQLite: wal_checkpoint(TRUNCATE)), then times `app.drain(concurrency=C)` — claim,
decode, no-op async handler, settle — until nothing is eligible. Afterwards it checks
delivered == N, sum(attempts) == N, max(attempts) == 1, and N succeeded rows in oke_runs.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import sys
import time
import uuid

from common import BENCH_DIR, Window, pg_prepare_table, pg_wal, proc_io_written, wal_fields
from engine_app import StoreProbe, declare, emit_all, make_app, verify_pg, verify_sqlite, without_history_and_heartbeats

EMIT_PARALLEL = 32  # app.emit calls in flight while filling the store (not timed)


def _bench_name(store: str, delayed: bool, bare: bool) -> str:
    return f"{store}_engine" + ("_delayed" if delayed else "") + ("_bare" if bare else "")


async def pg_single(cluster, n: int, concurrency: int, delayed: bool = False, bare: bool = False) -> dict:
    """`delayed`: the 50 % delayed mix (engine_app.emit_options), recorded as bench pg_engine_delayed;
    `bare`: without history or worker heartbeats (engine_app.without_history_and_heartbeats), as
    pg_engine_bare."""
    with without_history_and_heartbeats() if bare else contextlib.nullcontext():
        return await _pg_single(cluster, n, concurrency, delayed, bare)


async def _pg_single(cluster, n: int, concurrency: int, delayed: bool, bare: bool) -> dict:
    db = f"bench_e_{uuid.uuid4().hex[:10]}"
    url = cluster.create_database(db)
    dsn = cluster.dsn(db)
    try:
        sig = declare()
        async with make_app(url) as app:
            emit_rate = await emit_all(app, sig, n, EMIT_PARALLEL, delayed)
            await pg_prepare_table(dsn, "oke_messages")
            probe = StoreProbe(app.store)
            wal0 = await pg_wal(dsn)
            win = Window(cluster.data_dir).start()
            await app.drain(concurrency=concurrency)
            win.stop()
        wal = wal_fields(wal0, await pg_wal(dsn), n)
        chk, ok = await verify_pg(dsn, n)
    finally:
        cluster.drop_database(db)
    return {"bench": _bench_name("pg", delayed, bare), "processes": 1, "concurrency": concurrency,
            "messages": n,
            **win.fields(n), **wal, "emit_per_s": emit_rate, **probe.stats(), "verified": ok, "check": chk}


async def _spawn(*args: str):
    return await asyncio.create_subprocess_exec(
        sys.executable, str(BENCH_DIR / "engine_worker.py"), *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)


async def _expect(proc, prefix: str, timeout: float) -> str:
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout)).decode()
        if not line:
            raise RuntimeError(f"engine worker exited (code {await proc.wait()}) before {prefix}")
        if line.startswith(prefix):
            return line[len(prefix):].strip()


async def pg_multi(cluster, n: int, processes: int, concurrency: int) -> dict:
    """P worker processes, each app.drain(concurrency); released together by a GO line on stdin;
    the run ends when the last one's drain returns (their wall clocks agree: one machine)."""
    db = f"bench_m_{uuid.uuid4().hex[:10]}"
    url = cluster.create_database(db)
    dsn = cluster.dsn(db)
    procs = []
    try:
        sig = declare()
        async with make_app(url) as app:
            emit_rate = await emit_all(app, sig, n, EMIT_PARALLEL)
        await pg_prepare_table(dsn, "oke_messages")
        procs = [await _spawn("drain", url, str(concurrency)) for _ in range(processes)]
        for p in procs:
            await _expect(p, "READY", 60)
        wal0 = await pg_wal(dsn)
        win = Window(cluster.data_dir).start()
        t0 = time.time()
        for p in procs:
            p.stdin.write(b"GO\n")
        for p in procs:
            await p.stdin.drain()
        done = [json.loads(await _expect(p, "DONE", 600)) for p in procs]
        win.stop(probe=False)
        wal = wal_fields(wal0, await pg_wal(dsn), n)
        for p in procs:
            p.stdin.close()
            await p.wait()
        win.probe_end()  # once the workers are gone
        wall = max(d["t_end"] for d in done) - t0
        chk, ok = await verify_pg(dsn, n)
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
        cluster.drop_database(db)
    claimed = sum(d["claimed"] for d in done)
    full = sum(d["claims"] - d["empty_claims"] for d in done)
    return {"bench": "pg_engine", "processes": processes, "concurrency": concurrency, "messages": n,
            **win.fields(n, wall=wall, client_cpu=sum(d["cpu_s"] for d in done)), **wal, "emit_per_s": emit_rate,
            "mean_claim_batch": round(claimed / full, 2) if full else 0.0,
            "per_process": [{"claimed": d["claimed"], "start_lag_ms": round((d["t_start"] - t0) * 1e3, 2),
                             "wall_s": round(d["t_end"] - t0, 4), "mean_claim_batch": d["mean_claim_batch"],
                             "mean_settle_batch": d["mean_settle_batch"]} for d in done],
            "verified": ok, "check": chk}


def _checkpoint(path: str) -> list:
    conn = sqlite3.connect(path)
    try:
        return list(conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone())
    finally:
        conn.close()


async def sqlite_single(workdir: str, n: int, concurrency: int, delayed: bool = False, bare: bool = False) -> dict:
    """`delayed` and `bare` as for pg_single (bench sqlite_engine_delayed, sqlite_engine_bare)."""
    with without_history_and_heartbeats() if bare else contextlib.nullcontext():
        return await _sqlite_single(workdir, n, concurrency, delayed, bare)


async def _sqlite_single(workdir: str, n: int, concurrency: int, delayed: bool, bare: bool) -> dict:
    path = os.path.join(workdir, f"engine-{uuid.uuid4().hex[:8]}.db")
    try:
        sig = declare()
        async with make_app(f"sqlite+aiosqlite:///{path}") as app:
            emit_rate = await emit_all(app, sig, n, EMIT_PARALLEL, delayed)
            ckpt = _checkpoint(path)
            probe = StoreProbe(app.store)
            io0, win = proc_io_written(), Window().start()
            await app.drain(concurrency=concurrency)
            win.stop()
            written = proc_io_written() - io0
        chk, ok = verify_sqlite(path, n)
    finally:
        for suf in ("", "-wal", "-shm"):
            try:
                os.remove(path + suf)
            except FileNotFoundError:
                pass
    return {"bench": _bench_name("sqlite", delayed, bare), "concurrency": concurrency, "messages": n, **win.fields(n),
            "written_bytes_per_msg": round(written / n), "emit_per_s": emit_rate, "checkpoint": ckpt,
            **probe.stats(),
            "verified": ok, "check": chk}
