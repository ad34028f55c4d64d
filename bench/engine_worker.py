"""A worker process of the engine, driven over stdin/stdout by engine_runs.py and latency.py.

    python bench/engine_worker.py drain URL CONCURRENCY
        boots, prints READY, waits for a GO line, runs app.drain(concurrency), prints DONE {json}
    python bench/engine_worker.py serve URL CONCURRENCY
        boots, runs app.run(concurrency) and prints "H <n> <time.time()>" at every handler entry;
        prints READY once the loop runs; stops (app.stop()) when stdin closes
"""
from __future__ import annotations

import asyncio
import json
import sys
import time

import common

common.pin_engine()  # the same copy of engine/ as the parent (env OKE_BENCH_ENGINE_DIR)

from engine_app import StoreProbe, declare, make_app  # noqa: E402


async def _stdin_line() -> str:
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


async def drain(url: str, concurrency: int) -> None:
    declare()
    async with make_app(url) as app:
        probe = StoreProbe(app.store)
        print("READY", flush=True)
        if (await _stdin_line()).strip() != "GO":
            return
        t0, cpu0 = time.time(), common.tree_cpu_s()
        await app.drain(concurrency=concurrency)
        t1, cpu = time.time(), common.tree_cpu_s() - cpu0
        print("DONE " + json.dumps({"t_start": t0, "t_end": t1, "cpu_s": round(cpu, 3), **probe.stats()}),
              flush=True)


async def serve(url: str, concurrency: int) -> None:
    out = sys.stdout

    async def handler(payload, fx):
        t = time.time()
        out.write(f"H {payload['n']} {t!r}\n")
        out.flush()

    declare(handler)
    async with make_app(url) as app:
        runner = asyncio.create_task(app.run(concurrency=concurrency))
        await asyncio.sleep(0.2)
        print("READY", flush=True)
        await _stdin_line()          # EOF: the parent is done
        await app.stop()
        await runner


def main() -> None:
    mode, url, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3])
    asyncio.run({"drain": drain, "serve": serve}[mode](url, concurrency))


if __name__ == "__main__":
    main()
