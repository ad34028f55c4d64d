"""The server process of the soak run (bench/soak.py, tests/test_soak.py).

    python tests/chaos_workers/soak_server.py --url URL --dir DIR --port P [--max-count N]
                                              [--concurrency N]

Declares `soak.jobs` (once, retries 1) handled by the flow `soak.worker`, and the live tape
`soak.feed` (retention max_count N) exposed publicly at GET /_oke/live/soak.feed; runs
`app.serve()` (HTTP/SSE and the workers) on 127.0.0.1:P, writes DIR/ready (its pid) once it
listens, and stops (streams end with [DONE]) when DIR/stop exists. Each handled message appends
`{"n": n, "a": attempt}` to the tape; a message whose n % 50 == 7 fails its first attempt.
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
    args = parser.parse_args()
    declare(args.max_count)
    app = oke("soak-server", database_url=args.url)
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
    try:
        await app.serve(host="127.0.0.1", port=args.port, concurrency=args.concurrency)
    finally:
        watcher.cancel()
        await app.close()


if __name__ == "__main__":
    asyncio.run(main())
