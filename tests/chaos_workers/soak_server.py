"""The server process of the soak run (bench/soak.py, tests/test_soak.py).

    python tests/chaos_workers/soak_server.py --url URL --dir DIR --port P [--max-count N]
                                              [--concurrency N] [--keep-runs D] [--keep-delivered D]

Declares `soak.jobs` (once, retries 1) handled by the flow `soak.worker`, and the live tape
`soak.feed` (retention max_count N) exposed publicly at GET /_oke/live/soak.feed; runs
`app.serve()` (HTTP/SSE and the workers) on 127.0.0.1:P, writes DIR/ready (its pid) once it
listens, and stops (streams end with [DONE]) when DIR/stop exists. Each handled message appends
`{"n": n, "a": attempt}` to the tape; a message whose n % 50 == 7 fails its first attempt.
With --tracemalloc FILE it traces allocations and appends to FILE, every 60 s, the 30 call sites
whose live memory grew most since the first minute (to find what a growing RSS is made of).
With --keep-runs / --keep-delivered / --keep-dead the app's retention deletes old finished work, and
at stop DIR/retention.json says how long its batches held the writer (ms: count, max, p99; and
the whole write as the loop saw it).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine import flow, http, oke, on, signal  # noqa: E402


class SoakFailure(Exception):
    code = "soak"


def declare(max_count: int) -> None:
    jobs = signal.once("soak.jobs", retries=1, dead_letter=True)
    feed = signal.live("soak.feed", retention={"max_count": max_count})
    on(http.live(feed).public())

    @on(jobs)
    @flow("soak.worker")
    async def handle(payload, fx):
        await fx.emit(feed, {"n": payload["n"], "a": fx.attempt})
        if payload["n"] % 50 == 7 and fx.attempt == 1:
            raise SoakFailure("first attempt of every 50th message fails")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-count", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tracemalloc", type=Path, default=None)
    for option in ("--keep-runs", "--keep-delivered", "--keep-dead"):
        parser.add_argument(option, default=None)
    args = parser.parse_args()
    if args.tracemalloc:
        import tracemalloc
        tracemalloc.start(12)
    declare(args.max_count)
    app = oke("soak-server", database_url=args.url, keep_runs=args.keep_runs, keep_delivered=args.keep_delivered,
              keep_dead=args.keep_dead)
    stop_file = args.dir / "stop"

    async def watch() -> None:
        while True:
            try:
                with socket.create_connection(("127.0.0.1", args.port), timeout=1):
                    break
            except OSError:
                await asyncio.sleep(0.05)
        (args.dir / "ready").write_text(str(os.getpid()))
        while not stop_file.exists():
            await asyncio.sleep(0.1)
        await app.stop()

    watcher = asyncio.create_task(watch())
    tracer = asyncio.create_task(trace_memory(args.tracemalloc)) if args.tracemalloc else None
    try:
        await app.serve(host="127.0.0.1", port=args.port, concurrency=args.concurrency)
    finally:
        watcher.cancel()
        if tracer is not None:
            tracer.cancel()
        retention = app.background.retention if app.background is not None else None
        await app.close()
        if retention is not None:
            write_hold_times(args.dir / "retention.json", list(retention.hold_ms), list(retention.write_ms))


def write_hold_times(path: Path, held_ms: list[float], write_ms: list[float]) -> None:
    """How long the retention batches held the writer (their statements, on its thread) and how
    long each write took as the loop saw it: what bench/soak.py reports and checks."""
    import json

    def max_p99(values: list[float]) -> tuple[float, float]:
        ordered = sorted(values) or [0.0]
        return ordered[-1], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    (hold_max, hold_p99), (write_max, write_p99) = max_p99(held_ms), max_p99(write_ms)
    path.write_text(json.dumps({"batches": len(held_ms), "max_ms": hold_max, "p99_ms": hold_p99,
                                "write_max_ms": write_max, "write_p99_ms": write_p99}))


async def trace_memory(path: Path) -> None:
    import gc
    import linecache
    import time
    import tracemalloc
    # the tracer's own allocations (snapshots, line cache) are not what we are looking for
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__, all_frames=True),
              tracemalloc.Filter(False, linecache.__file__, all_frames=True)]
    await asyncio.sleep(60)
    gc.collect()
    first = tracemalloc.take_snapshot().filter_traces(ignore)
    started = time.monotonic()
    while True:
        await asyncio.sleep(60)
        gc.collect()
        snap = tracemalloc.take_snapshot().filter_traces(ignore)
        lines = [f"=== {time.monotonic() - started:.0f} s after the first minute: traced "
                 f"{sum(st.size for st in snap.statistics('filename')) / 1e6:.1f} MB, objects {len(gc.get_objects())}"]
        for st in snap.compare_to(first, "traceback")[:30]:
            lines.append(f"{st.size_diff / 1024:+9.1f} KiB {st.count_diff:+7d} blocks")
            lines += [f"      {line}" for line in st.traceback.format()[-12:]]
        del snap
        with open(path, "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
