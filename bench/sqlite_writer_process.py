"""Would a SQLite writer in a process of its own drain faster than one in a thread? (an experiment)

    python bench/sqlite_writer_process.py [--messages 60000] [--rounds 4]

A drain at 32 handlers is a cycle of the writer's transaction (settle the last batch, claim the
next) and the loop's turn (run the batch's handlers). In one process the two serialise on the GIL
(docs/design/sqlite-writer-process.md). This script drains a store filled
by the engine with a cut-down worker: the engine's own settle and claim statements, claims of 128,
two requests in flight so the writer's next transaction can run beside the loop's turn, each
commit fsynced by a syncer thread beside the writer. It runs the writer in a forked process, in a
thread, and in a thread with one request in flight (as the engine ships its one SQLite lane), in
alternating order, and prints the process's ratio to each. It is not the engine's worker
(no history, heartbeats, hooks or failures): it prices only where the writer runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import flow, oke, on, reset, signal  # noqa: E402
from engine.ids import new_id, now_ms  # noqa: E402
from engine.store.sql.claim import sqlite_claim_statement  # noqa: E402
from engine.store.sql.settle import (  # noqa: E402
    ACK_ROWS_PER_STATEMENT,
    RUN_ROWS_PER_STATEMENT,
    sqlite_ack_in_statement,
    sqlite_runs_statement,
)

QUEUE, WORKER, LIMIT = "bench.jobs", "bench-writer", 128


def settle_and_claim(db: sqlite3.Connection, outcomes: list[tuple], limit: int) -> list[tuple]:
    """One writer transaction, as the engine's: ack the batch, record its runs, claim the next."""
    now = now_ms()
    db.execute("BEGIN IMMEDIATE")
    seqs = [o[0] for o in outcomes]
    for start in range(0, len(seqs), ACK_ROWS_PER_STATEMENT):
        chunk = seqs[start : start + ACK_ROWS_PER_STATEMENT]
        db.execute(sqlite_ack_in_statement(len(chunk)), (now, now, *chunk, 1, WORKER))
    for start in range(0, len(outcomes), RUN_ROWS_PER_STATEMENT):
        params: list = []
        for _, message_id, run_id, flow_name, sig, parent, began, ended in outcomes[
            start : start + RUN_ROWS_PER_STATEMENT
        ]:
            params += (run_id, flow_name, sig, sig, message_id, parent, "succeeded", 1, WORKER, began, ended, None)
        db.execute(sqlite_runs_statement(len(params) // 12), params)
    rows = db.execute(
        sqlite_claim_statement(1),
        {"worker": WORKER, "lease_until": now + 30_000, "now": now, "limit": limit, "q0": QUEUE},
    ).fetchall()
    db.execute("COMMIT")
    return rows


def writer(path: str, pipe: Connection) -> None:
    """Serve settle-and-claim requests until None; each result goes back before its fsync."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA busy_timeout = 30000")
    db.execute("PRAGMA synchronous = NORMAL")
    wal_fd: int | None = None
    due = threading.Event()

    def syncer() -> None:
        while True:
            due.wait()
            due.clear()
            os.fdatasync(wal_fd)  # type: ignore[arg-type]

    while (request := pipe.recv()) is not None:
        rows = settle_and_claim(db, *request)
        if wal_fd is None:
            wal_fd = os.open(path + "-wal", os.O_RDONLY)
            threading.Thread(target=syncer, daemon=True).start()
        pipe.send(rows)
        due.set()
    os.fdatasync(wal_fd)  # type: ignore[arg-type]
    pipe.send("closed")


async def handler(payload: object) -> None:
    return None


async def loop_side(pipe: Connection, depth: int) -> tuple[int, float]:
    """Run each claimed batch's no-op handlers while the writer works on the next request."""
    loop = asyncio.get_running_loop()
    results: asyncio.Queue[list[tuple]] = asyncio.Queue()
    loop.add_reader(pipe.fileno(), lambda: results.put_nowait(pipe.recv()))
    for _ in range(depth):
        pipe.send(([], LIMIT))
    in_flight, done, began = depth, 0, time.perf_counter()
    while in_flight:
        rows = await results.get()
        in_flight -= 1
        outcomes = []
        for seq, message_id, sig, _queue, flow_name, _key, payload, _attempts, parent, _trace, _prio in sorted(
            rows, key=lambda r: (-r[10], r[0])
        ):
            started = now_ms()
            run_id = new_id("run_")
            await handler(json.loads(payload))
            outcomes.append((seq, message_id, run_id, flow_name, sig, parent, started, now_ms()))
        done += len(outcomes)
        if rows:
            pipe.send((outcomes, LIMIT))
            in_flight += 1
    elapsed = time.perf_counter() - began
    loop.remove_reader(pipe.fileno())
    return done, elapsed


async def fill(path: str, messages: int) -> None:
    reset()
    jobs = signal.once(QUEUE)
    on(jobs, flow("bench.work", do=lambda payload, fx: None))
    async with oke("writer-process", database_url=f"sqlite+aiosqlite:///{path}") as app:
        for start in range(0, messages, 10_000):
            await app.emit_many(
                jobs, [{"n": n, "body": "hello world"} for n in range(start, min(messages, start + 10_000))]
            )
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


# where the writer runs -> requests in flight: the thread also as the engine ships it (one lane)
VARIANTS = {"process": 2, "thread": 2, "thread, 1 in flight": 1}


def one_drain(messages: int, where: str) -> float:
    path = os.path.join(tempfile.mkdtemp(prefix="oke-writer-"), "drain.db")
    asyncio.run(fill(path, messages))
    ours, theirs = mp.Pipe()
    if where == "process":
        side: threading.Thread | mp.process.BaseProcess = mp.get_context("fork").Process(
            target=writer, args=(path, theirs)
        )
    else:
        side = threading.Thread(target=writer, args=(path, theirs), daemon=True)
    side.start()
    done, elapsed = asyncio.run(loop_side(ours, VARIANTS[where]))
    ours.send(None)
    ours.recv()
    side.join()
    conn = sqlite3.connect(path)
    delivered, attempts = conn.execute(
        "SELECT count(*), sum(attempts) FROM oke_messages WHERE status = 'delivered'"
    ).fetchone()
    runs = conn.execute("SELECT count(*) FROM oke_runs").fetchone()[0]
    conn.close()
    if (done, delivered, attempts, runs) != (messages,) * 4:
        raise SystemExit(
            f"{where}: drained {done}, delivered {delivered}, attempts {attempts}, runs {runs} of {messages}"
        )
    return done / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=60_000)
    p.add_argument("--rounds", type=int, default=4)
    a = p.parse_args()
    ratios: dict[str, list[float]] = {where: [] for where in VARIANTS if where != "process"}
    for n in range(a.rounds):
        order = list(VARIANTS) if n % 2 == 0 else list(VARIANTS)[::-1]  # ABBA
        rate = {where: one_drain(a.messages, where) for where in order}
        for where in ratios:
            ratios[where].append(rate["process"] / rate[where])
        print(f"round {n + 1}: " + ", ".join(f"{w} {r:,.0f} msgs/s" for w, r in rate.items()), flush=True)
    for where, got in ratios.items():
        print(f"process / {where}: median {statistics.median(got):.2f}x ({', '.join(f'{x:.2f}' for x in got)})")


if __name__ == "__main__":
    main()
