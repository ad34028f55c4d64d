#!/usr/bin/env python3
"""How fast `app.emit_many` stores messages, against the fastest raw write into the same table
and PgQueuer's batch enqueue.

    python bench/enqueue_bench.py                     # 100,000 messages on SQLite and PostgreSQL
    python bench/enqueue_bench.py --messages 2000 --only sqlite

Each store gets a fresh database. Per repetition: `emit_many` of N payloads (validated, encoded,
one transaction in chunks), then the baseline writing the same N rows into oke_messages in one
transaction: on SQLite a stdlib `executemany` of the insert, on PostgreSQL asyncpg's COPY; on
PostgreSQL also PgQueuer's `Queries.enqueue` of the same N payloads (its batch enqueue: one
statement of arrays). Prints messages/s for each and emit_many's share of the baseline's speed (the
ratio). PostgreSQL is a private throw-away cluster (tests/pgcluster.py), stopped at the end.
`python bench/once_bench.py` runs the same measurements as its section 4 (`rows`).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import common  # noqa: F401  (puts tests/ on sys.path)
from common import PAYLOAD_BODY, pin_engine

from pgcluster import PgCluster  # noqa: E402

COLUMNS = ("id", "signal", "queue", "flow", "key", "payload", "status", "attempts", "retries", "dead_letter",
           "created_at", "updated_at", "parent_run_id", "replays")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000, help="messages per run (default 100,000)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per store (the median is shown)")
    ap.add_argument("--only", default="sqlite,pg", help="comma list: sqlite, pg (default both)")
    return ap.parse_args()


def raw_rows(n: int) -> list[tuple]:
    """The rows an emit_many of n payloads writes, built outside the engine."""
    now = int(time.time() * 1000)
    return [(f"raw_{uuid.uuid4().hex}", "bench.enqueue", "bench.enqueue", "w.bench", None,
             f'{{"n":{i},"body":"{PAYLOAD_BODY}"}}', "pending", 0, 3, True, now, now, None, 0) for i in range(n)]


async def engine_run(url: str, n: int) -> float:
    """Seconds for one emit_many of n payloads (the app is booted before the clock starts)."""
    from engine import oke, signal

    bench = signal.once("bench.enqueue", optional=True)
    async with oke("enqueue-bench", database_url=url) as app:
        started = time.perf_counter()
        ids = await app.emit_many(bench, ({"n": i, "body": PAYLOAD_BODY} for i in range(n)))
        took = time.perf_counter() - started
    assert len(ids) == n
    return took


def sqlite_raw(path: str) -> Callable[[int], Awaitable[float]]:
    async def run(n: int) -> float:
        rows = [(*r[:9], int(r[9]), *r[10:]) for r in raw_rows(n)]
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous = FULL")
            started = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(f"INSERT INTO oke_messages ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                             rows)
            conn.execute("COMMIT")
            return time.perf_counter() - started
        finally:
            conn.close()

    return run


def pg_raw(dsn: str) -> Callable[[int], Awaitable[float]]:
    async def run(n: int) -> float:
        import asyncpg

        rows = raw_rows(n)
        conn = await asyncpg.connect(dsn)
        try:
            started = time.perf_counter()
            async with conn.transaction():
                await conn.copy_records_to_table("oke_messages", records=rows, columns=COLUMNS)
            return time.perf_counter() - started
        finally:
            await conn.close()

    return run


async def clear(url: str, is_sqlite: bool, target: str) -> None:
    if is_sqlite:
        conn = sqlite3.connect(target)
        conn.execute("DELETE FROM oke_messages")
        conn.commit()
        conn.close()
        return
    import asyncpg

    conn = await asyncpg.connect(target)
    await conn.execute("TRUNCATE oke_messages")
    await conn.close()


def pgqueuer_run(dsn: str) -> Callable[[int], Awaitable[float]]:
    """PgQueuer's batch enqueue of the same payloads, into its own table (schema installed once)."""

    async def run(n: int) -> float:
        import asyncpg
        from peers import pgqueuer_peer
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        await pgqueuer_peer.install(dsn)
        payloads = [f'{{"n":{i},"body":"{PAYLOAD_BODY}"}}'.encode() for i in range(n)]
        conn = await asyncpg.connect(dsn)
        try:
            queries = Queries(AsyncpgDriver(conn))
            await queries.clear_queue()
            started = time.perf_counter()
            await queries.enqueue(["noop"] * n, payloads, [0] * n)
            took = time.perf_counter() - started
            await queries.clear_queue()
            return took
        finally:
            await conn.close()

    return run


def rows(store: str, url: str, target: str, n: int) -> list[tuple[str, Callable[[], Awaitable[dict]]]]:
    """(label, one timed run) of each contender on one store, for a caller that repeats and records them."""
    is_sqlite = store == "sqlite"

    def timed(bench: str, write: Callable[[int], Awaitable[float]]) -> Callable[[], Awaitable[dict]]:
        async def one() -> dict:
            took = await write(n)
            await clear(url, is_sqlite, target)
            return {"bench": bench, "store": store, "messages": n, "msgs_per_s": round(n / took, 1)}

        return one

    out = [(f"okengine {store} emit_many", timed("enqueue_engine", lambda k: engine_run(url, k))),
           (f"raw {'sqlite3 executemany' if is_sqlite else 'asyncpg COPY'}",
            timed("enqueue_raw", sqlite_raw(target) if is_sqlite else pg_raw(target)))]
    if not is_sqlite:
        out.append(("pgqueuer batch enqueue", timed("enqueue_pgqueuer", pgqueuer_run(target))))
    return out


async def measure(store: str, url: str, target: str, a) -> None:
    runs = rows(store, url, target, a.messages)
    speeds: dict[str, list[float]] = {label: [] for label, _ in runs}
    for _ in range(a.reps):
        for label, one in runs:
            speeds[label].append((await one())["msgs_per_s"])
    med = {label: statistics.median(v) for label, v in speeds.items()}
    engine_speed = med[runs[0][0]]
    for label, speed in med.items():
        share = "" if label == runs[0][0] else f"   emit_many / this {engine_speed / speed:.2f}"
        print(f"{store:>7}  {label:<30} {speed:>10,.0f} msgs/s{share}", flush=True)


async def main() -> None:
    a = parse_args()
    only = {s.strip() for s in a.only.split(",") if s.strip()}
    pin_engine()
    print(f"{a.messages:,} messages, median of {a.reps}", flush=True)
    if "sqlite" in only:
        with tempfile.TemporaryDirectory(prefix="oke-enqueue-") as tmp:
            path = str(Path(tmp) / "bench.db")
            await measure("sqlite", f"sqlite+aiosqlite:///{path}", path, a)
    if "pg" in only:
        cluster = PgCluster(use_env=False)
        cluster.start()
        try:
            url = cluster.create_database("oke_enqueue_bench")
            dsn = cluster.dsn("oke_enqueue_bench")
            await measure("pg", url, dsn, a)
        finally:
            cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
