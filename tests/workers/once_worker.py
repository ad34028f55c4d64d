"""A worker process for the once concurrency tests.

    python tests/workers/once_worker.py MODE --url URL --dir DIR --worker-id ID [--lease-ms N]
                                        [--concurrency N] [--hold] [--clock-skew-ms N] [--heartbeat-s S]

It declares the signal and flow of MODE, boots `oke(...)` on URL, writes DIR/ready-<ID>, (with
--hold waits for DIR/go,) and runs `app.run(concurrency=N)` until DIR/stop exists. Handlers record what they do as lines appended
with O_APPEND (one os.write per line, so lines from several processes never interleave):

    bulk    signal "bulk":   DIR/handled-<ID>   "<msg_id> <attempt> <ID>"
    fifo    signal "fifo":   DIR/events (shared) "S|E|F <key> <n> <attempt> <ID> <epoch_ms>";
            a handler fails its first attempt when n % 5 == 0
    crash   signal "victim": DIR/events (shared) "start <msg_id> <attempt> <ID> <epoch_ms>";
            attempt 1 then hangs (the test SIGKILLs the process) unless the payload says
            {"hang": false}; later attempts return
    lease   signal "lease":  DIR/events (shared) "S|E <msg_id> <attempt> <ID> <epoch_ms> <locked_by>
            <attempts> <lease_expires_at>" (the last three read from the row at handler start, "-" on E);
            attempt 1 of a message whose n % 10 == 0 sleeps past the lease
    slow    signal "slow":   DIR/events (shared) "start|cancelled|finally|end <msg_id> <attempt> <ID> <epoch_ms>";
            sleeps payload["sleep"] seconds; with payload["swallow"] it swallows a cancel and returns
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import flow, oke, on, signal  # noqa: E402
from workers.db import fetch  # noqa: E402


def appender(path: Path):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(*fields: object) -> None:
        os.write(fd, (" ".join(str(f) for f in fields) + "\n").encode())

    return write


def now_ms() -> int:
    return int(time.time() * 1000)


def declare(mode: str, out: Path, me: str, lease_ms: int, url: str) -> None:
    if mode == "bulk":
        log = appender(out / f"handled-{me}")
        bulk = signal.once("bulk")

        @on(bulk)
        @flow("workers.bulk")
        async def handle_bulk(payload, fx):
            log(fx.message_id, fx.attempt, me)

    elif mode == "fifo":
        log = appender(out / "events")
        fifo = signal.once("fifo", retries=3)

        @on(fifo)
        @flow("workers.fifo")
        async def handle_fifo(payload, fx):
            key, n = payload["key"], payload["n"]
            log("S", key, n, fx.attempt, me, now_ms())
            await asyncio.sleep(random.random() * 0.004)
            if n % 5 == 0 and fx.attempt == 1:
                log("F", key, n, fx.attempt, me, now_ms())
                raise RuntimeError("first attempt fails")
            log("E", key, n, fx.attempt, me, now_ms())

    elif mode == "crash":
        log = appender(out / "events")
        victim = signal.once("victim", retries=3)

        @on(victim)
        @flow("workers.victim")
        async def handle_victim(payload, fx):
            log("start", fx.message_id, fx.attempt, me, now_ms())
            if fx.attempt == 1 and payload.get("hang", True):
                await asyncio.sleep(3600)  # the test SIGKILLs us here

    elif mode == "lease":
        log = appender(out / "events")
        leased = signal.once("lease", retries=3)

        @on(leased)
        @flow("workers.lease")
        async def handle_lease(payload, fx):
            started = now_ms()
            # what the store says about this message while we hold it
            [(holder, attempts, lease)] = await fetch(
                url, "SELECT locked_by, attempts, lease_expires_at FROM oke_messages WHERE id = $1",
                fx.message_id)
            log("S", fx.message_id, fx.attempt, me, started, holder, attempts, lease)
            if payload % 10 == 0 and fx.attempt == 1:
                # outlive the lease by far: it is reclaimed while this attempt still runs, even when the
                # reclaiming claim comes seconds late on a loaded machine
                await asyncio.sleep(lease_ms / 1000 * 6)
            else:
                await asyncio.sleep(random.random() * 0.01)
            log("E", fx.message_id, fx.attempt, me, now_ms(), "-", "-", "-")

    elif mode == "slow":
        log = appender(out / "events")
        slow = signal.once("slow", retries=3)

        @on(slow)
        @flow("workers.slow")
        async def handle_slow(payload, fx):
            log("start", fx.message_id, fx.attempt, me, now_ms())
            try:
                await asyncio.sleep(payload["sleep"])
            except asyncio.CancelledError:
                log("cancelled", fx.message_id, fx.attempt, me, now_ms())
                if not payload.get("swallow"):
                    raise
            finally:
                log("finally", fx.message_id, fx.attempt, me, now_ms())
            log("end", fx.message_id, fx.attempt, me, now_ms())
    elif mode == "limits":
        declare_limited(out, me)

    else:
        raise SystemExit(f"unknown mode {mode!r}")


# the flow limits the "limits" mode declares (tests/test_flow_limits.py checks against them)
LIMITED_CONCURRENCY = 3
LIMITED_RATE = "6/1s"
FAN_CONCURRENCY = 2


def declare_limited(out: Path, me: str) -> None:
    """Signals under flow limits; each handler logs to DIR/events "S|E <queue> <msg_id> <attempt>
    <ID> <epoch_ms>" and takes a little while (payload {"ms": N}, else 30 ms)."""
    log = appender(out / "events")
    capped = signal.once("lim.conc", concurrency=LIMITED_CONCURRENCY)
    paced = signal.once("lim.rate", rate=LIMITED_RATE)
    fan = signal.broadcast("lim.fan", concurrency=FAN_CONCURRENCY)

    def handler(queue: str):
        async def handle(payload, fx):
            log("S", queue, fx.message_id, fx.attempt, me, now_ms())
            await asyncio.sleep(payload.get("ms", 30) / 1000 * (0.5 + random.random()))
            log("E", queue, fx.message_id, fx.attempt, me, now_ms())

        return handle

    on(capped)(flow("workers.conc", do=handler("lim.conc")))
    on(paced)(flow("workers.rate", do=handler("lim.rate")))
    on(fan)(flow("workers.fan.a", do=handler("lim.fan/a")))
    on(fan)(flow("workers.fan.b", do=handler("lim.fan/b")))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("--url", required=True)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--lease-ms", type=int, default=30_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--hold", action="store_true", help="after boot, wait for DIR/go before running")
    parser.add_argument("--clock-skew-ms", type=int, default=0,
                        help="run as on a machine whose wall clock is this far ahead")
    parser.add_argument("--heartbeat-s", type=float, default=5.0, help="the worker heartbeat interval")
    parser.add_argument("--sqlite-writer", default="process", help="where a SQLite store writes")
    args = parser.parse_args()
    if args.clock_skew_ms:
        real_time = time.time
        time.time = lambda: real_time() + args.clock_skew_ms / 1000

    declare(args.mode, args.dir, args.worker_id, args.lease_ms, args.url)
    app = oke(f"worker-{args.mode}", database_url=args.url, lease_ms=args.lease_ms,
              worker_id=args.worker_id, worker_heartbeat_s=args.heartbeat_s, sqlite_writer=args.sqlite_writer)
    stop_file = args.dir / "stop"

    async def watch_stop() -> None:
        while not stop_file.exists():
            await asyncio.sleep(0.05)
        await app.stop()

    async with app:
        (args.dir / f"ready-{args.worker_id}").write_text(str(os.getpid()))
        while args.hold and not (args.dir / "go").exists():
            await asyncio.sleep(0.01)
        watcher = asyncio.create_task(watch_stop())
        await app.run(concurrency=args.concurrency)
        watcher.cancel()


if __name__ == "__main__":
    asyncio.run(main())
