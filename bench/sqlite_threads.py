"""Where a SQLite drain's CPU goes, by thread: the event loop against the writer.

    python bench/sqlite_threads.py [--messages 60000] [--handlers 32] [--runs 3] [--engine DIR]
                                   [--writer process|thread]

Fills a fresh SQLite store with `emit_many` (not timed), checkpoints it, then times
`app.drain(concurrency=C)` with a no-op handler and reads each thread's user and system CPU from
/proc/self/task before and after, and the writer process's threads' from /proc/PID/task. A profiler's samples of the loop thread include its waits for
the GIL, so they cannot tell the two threads' work apart; the kernel's per-thread counters can.
`--engine DIR` measures the `engine/` package under DIR instead of this checkout's; `--writer`
passes `sqlite_writer` (engines before the writer process have only the thread).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from prockit import children  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=60_000)
    p.add_argument("--handlers", type=int, default=32)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--engine", default=str(ROOT), help="a directory holding the engine/ package")
    p.add_argument("--writer", choices=("process", "thread"), help="oke(sqlite_writer=...); default: the engine's")
    return p.parse_args()


def thread_cpu() -> dict[str, tuple[float, float]]:
    """Thread id -> (user, system) CPU seconds, this process's and its children's (the writer
    process); the main thread is named `loop`."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[str, tuple[float, float]] = {}
    for pid, label in [(os.getpid(), "thread"), *[(c, "writer process thread") for c in children()]]:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue  # ended meanwhile
            name = "loop" if int(tid) == os.getpid() else f"{label} {tid}"
            found[name] = (int(fields[11]) / tick, int(fields[12]) / tick)
    return found


async def one_drain(messages: int, handlers: int, options: dict[str, str]) -> str:
    from engine import flow, oke, on, reset, signal

    reset()
    jobs = signal.once("bench.jobs")

    @on(jobs)
    @flow("bench.work")
    async def work(payload: object, fx: object) -> None:
        return None

    path = os.path.join(tempfile.mkdtemp(), "drain.db")
    async with oke("threads", database_url=f"sqlite+aiosqlite:///{path}", **options) as app:
        for start in range(0, messages, 10_000):
            chunk = range(start, min(messages, start + 10_000))
            await app.emit_many(jobs, [{"n": n, "body": "hello world"} for n in chunk])
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        before, began = thread_cpu(), time.perf_counter()
        await app.drain(concurrency=handlers)
        elapsed, after = time.perf_counter() - began, thread_cpu()
    per_msg = {name: [(a - b) * 1e6 / messages for a, b in zip(cpu, before.get(name, (0.0, 0.0)), strict=True)]
               for name, cpu in after.items()}
    busy = "  ".join(f"{name} {user:.1f} + {system:.1f} sys" for name, (user, system) in per_msg.items()
                     if user + system > 0.5)
    return f"{messages / elapsed:8,.0f} msgs/s   µs/msg: {busy}"


def main() -> None:
    a = parse_args()
    sys.path.insert(0, a.engine)
    import engine

    print(f"engine from {Path(engine.__file__).parent}, {a.messages:,} messages, {a.handlers} handlers")
    for _ in range(a.runs):
        print(asyncio.run(one_drain(a.messages, a.handlers, {"sqlite_writer": a.writer} if a.writer else {})), flush=True)


if __name__ == "__main__":
    main()
