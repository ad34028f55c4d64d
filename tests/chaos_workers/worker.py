"""A worker process for the chaos run (bench/chaos.py, tests/test_chaos.py).

    python tests/chaos_workers/worker.py --url URL --dir DIR --worker-id ID [--lease-ms N]
                                         [--concurrency N] [--retries N] [--slow-ms N] [--probe-ms N]

It declares `chaos.jobs` (once, `--retries`, dead letters on) bound to the flow `chaos.worker`, and
the live tape `chaos.tape` (optional: nothing needs to listen), boots `oke(...)` on URL with
worker id ID, writes DIR/ready-<ID> and runs until DIR/stop or DIR/stop-<ID> exists (or until it is SIGKILLed,
which is the point). The payload is the plan of a message: `{"n", "key", "fails", "slow", "tape"}`:
attempt a raises `ChaosFailure` (code "chaos") when a <= fails, and sleeps `--slow-ms` (longer
than the lease) when a is in `slow`; when `tape` is true every attempt first appends one event to
the tape.

Each handler call appends lines (one os.write each, O_APPEND) to DIR/events-<ID>:

    S <msg_id> <attempt> <ID> <start_ms> <locked_by> <row_attempts> <lease_expires_at> <run_at> <store_now>
        at handler start; locked_by … run_at are read from the message row (plain SQL) right then,
        with the store's clock (PostgreSQL's clock_timestamp, this machine's for SQLite); "?" when
        the read failed (the database was restarting), "-" for NULL
    T <msg_id> <attempt> <ID> <event_id>        the tape event this attempt appended
    X <msg_id> <attempt> <ID> <end_ms> <code>   fx.emit to the tape raised (an outage): the
                                                 handler fails with that error
    E <msg_id> <attempt> <ID> <end_ms>          the handler returns (success)
    F <msg_id> <attempt> <ID> <end_ms>          the handler raises ChaosFailure

With `--probe-ms N` it also emits one `chaos.probe` message every N ms (a once signal of its own,
consumed by every worker) and appends `P <start_ms> <end_ms> <ok|error class>` to DIR/probe-<ID>:
the network-fault run (bench/netfaults.py) reads whether emits failed during a partition.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine import clock, flow, oke, on, signal  # noqa: E402

JOBS = "chaos.jobs"
PROBE = "chaos.probe"
TAPE = "chaos.tape"
FLOW = "chaos.worker"


class ChaosFailure(Exception):
    code = "chaos"


def now_ms() -> int:
    return int(time.time() * 1000)


class RowReader:
    """Reads (locked_by, attempts, lease_expires_at, run_at) of a message and the store's clock,
    with the database's own driver."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sqlite: sqlite3.Connection | None = None
        self.pool = None

    async def open(self) -> None:
        if self.url.startswith("sqlite"):
            self.sqlite = sqlite3.connect(self.url.split(":///", 1)[1], timeout=30,
                                          check_same_thread=False, isolation_level=None)
        else:
            import asyncpg
            dsn = self.url.replace("postgresql+asyncpg://", "postgresql://", 1)
            self.pool = await asyncpg.create_pool(dsn, min_size=0, max_size=2, timeout=5)

    async def lease(self, msg_id: str) -> tuple[str, ...]:
        sql = "SELECT locked_by, attempts, lease_expires_at, run_at, {clock} FROM oke_messages WHERE id = "
        try:
            if self.sqlite is not None:
                q = sql.format(clock=str(now_ms())) + "?"
                row = self.sqlite.execute(q, (msg_id,)).fetchone()  # WAL: never waits on writers
            else:
                q = sql.format(clock="(extract(epoch FROM clock_timestamp()) * 1000)::bigint") + "$1"
                async with asyncio.timeout(5):
                    row = await self.pool.fetchrow(q, msg_id)
        except Exception:  # the database is restarting: the attempt goes on, its lease unknown
            return ("?",) * 5
        if row is None:
            return ("?",) * 5
        return tuple("-" if v is None else str(v) for v in row)


def declare(out: Path, me: str, retries: int, slow_s: float, reader: RowReader) -> None:
    fd = os.open(out / f"events-{me}", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(*fields: object) -> None:
        os.write(fd, (" ".join(str(f) for f in fields) + "\n").encode())

    jobs = signal.once(JOBS, retries=retries, dead_letter=True)
    tape = signal.live(TAPE, optional=True)

    @on(jobs)
    @flow(FLOW)
    async def handle(plan, fx):
        started = now_ms()
        log("S", fx.message_id, fx.attempt, me, started, *await reader.lease(fx.message_id))
        if fx.attempt in plan["slow"]:
            await asyncio.sleep(slow_s)  # outlive the lease: the message is reclaimed meanwhile
        else:
            await asyncio.sleep(random.random() * 0.005)
        fail = fx.attempt <= plan["fails"]
        if plan.get("tape", True):
            try:
                event_id = await fx.emit(tape, {"m": fx.message_id, "a": fx.attempt, "w": me, "ok": not fail})
            except Exception as err:
                log("X", fx.message_id, fx.attempt, me, now_ms(), type(err).__name__)
                raise
            log("T", fx.message_id, fx.attempt, me, event_id)
        if fail:
            log("F", fx.message_id, fx.attempt, me, now_ms())
            raise ChaosFailure(f"planned failure {fx.attempt}/{plan['fails']}")
        log("E", fx.message_id, fx.attempt, me, now_ms())


# -- flow limits (bench/chaos.py's own section): a concurrency-limited and a rate-limited signal.
CAPPED, CAPPED_CONCURRENCY = "chaos.capped", 2
PACED, PACED_RATE = "chaos.paced", "8/1s"


def declare_limited(out: Path, me: str) -> None:
    """`chaos.capped` (concurrency 2) and `chaos.paced` (8 starts a second), each handler a few
    tens of ms; each logs to DIR/limits-<ID> "L|M <signal> <msg_id> <attempt> <ID> <ms>" at its
    start and its end."""
    fd = os.open(out / f"limits-{me}", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def handler(name: str):
        async def handle(payload, fx):
            os.write(fd, f"L {name} {fx.message_id} {fx.attempt} {me} {now_ms()}\n".encode())
            await asyncio.sleep(0.01 + random.random() * 0.04)
            os.write(fd, f"M {name} {fx.message_id} {fx.attempt} {me} {now_ms()}\n".encode())

        return handle

    on(signal.once(CAPPED, concurrency=CAPPED_CONCURRENCY), flow("chaos.capped.worker", do=handler(CAPPED)))
    on(signal.once(PACED, rate=PACED_RATE), flow("chaos.paced.worker", do=handler(PACED)))


async def probe(app, out: Path, me: str, every_s: float) -> None:
    """Emit a probe every `every_s` and log how each emit ended."""
    fd = os.open(out / f"probe-{me}", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    while True:
        started = now_ms()
        try:
            await app.emit(PROBE, {"w": me, "at": started})
            result = "ok"
        except Exception as err:
            result = type(err).__name__
        os.write(fd, f"P {started} {now_ms()} {result}\n".encode())
        await asyncio.sleep(every_s)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--lease-ms", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--slow-ms", type=int, default=2500)
    parser.add_argument("--probe-ms", type=int, default=0)
    parser.add_argument("--sqlite-writer", default="process", choices=("process", "thread"))
    parser.add_argument("--clock-every", default=None, help='bind flow "chaos.clock" to clock.every(EVERY)')
    args = parser.parse_args()
    # The worker pool's INFO lines (what a clean stop handed back) go to the log the run reads.
    workers_log = logging.getLogger("engine.worker")
    workers_log.setLevel(logging.INFO)
    workers_log.addHandler(logging.StreamHandler())

    reader = RowReader(args.url)
    declare(args.dir, args.worker_id, args.retries, args.slow_ms / 1000, reader)
    declare_limited(args.dir, args.worker_id)
    if args.probe_ms:
        on(signal.once(PROBE), flow("chaos.prober", do=lambda p, fx: None))
    if args.clock_every:  # every worker emits every tick; the store keeps one (bench/chaos.py checks)
        on(clock.every(args.clock_every), flow("chaos.clock", do=lambda tick, fx: None))
    app = oke("chaos-worker", database_url=args.url, lease_ms=args.lease_ms, worker_id=args.worker_id,
              stop_grace_s=5.0, sqlite_writer=args.sqlite_writer)
    stop_files = (args.dir / "stop", args.dir / f"stop-{args.worker_id}")  # every worker's, or this one's

    async def watch_stop() -> None:
        while not any(f.exists() for f in stop_files):
            await asyncio.sleep(0.05)
        await app.stop()

    # Booting may meet the database mid-restart: try again rather than die.
    deadline = time.monotonic() + 60
    while True:
        try:
            await app.start()
            await reader.open()
            break
        except Exception:
            await app.close()
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    try:
        (args.dir / f"ready-{args.worker_id}").write_text(str(os.getpid()))
        watcher = asyncio.create_task(watch_stop())
        prober = asyncio.create_task(probe(app, args.dir, args.worker_id, args.probe_ms / 1000)) \
            if args.probe_ms else None
        await app.run(concurrency=args.concurrency)
        watcher.cancel()
        if prober is not None:
            prober.cancel()
    finally:
        await app.close()


if __name__ == "__main__":
    asyncio.run(main())
