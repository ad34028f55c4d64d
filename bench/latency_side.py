"""One side of bench/latency_ab.py: a producer and its idle worker process, driven over stdin.

    latency_side.py ENGINE_ROOT URL engine|raw

Boots the worker (engine: engine_worker.py serve, 8 handlers; raw: peers/raw_latency.py) and prints
READY. Then, for each stdin line `E <n>`, emits message n (engine: app.emit; raw: INSERT +
pg_notify), waits for the worker's handler line and prints `L <n> <latency ms> <emit call ms>`
(latency.py's `emit_and_hear`). An empty line or EOF stops both.
"""

from __future__ import annotations

import asyncio
import os
import sys

import common

os.environ[common.ENGINE_ENV] = sys.argv[1]  # this process and its worker run that engine/
common.pin_engine()

from common import BENCH_DIR  # noqa: E402
from latency import emit_and_hear, start_worker, stop_worker  # noqa: E402


async def _producer(url: str, kind: str):
    if kind == "raw":
        from peers import raw_latency

        await raw_latency.setup(url)
        emitter = await raw_latency.Emitter().open(url)
        return emitter.emit, emitter.close, [str(BENCH_DIR / "peers" / "raw_latency.py"), "worker", url]
    from engine_app import declare, make_app

    sig = declare()
    app = make_app(url, name="latency-producer")
    await app.__aenter__()

    async def close() -> None:
        await app.__aexit__(None, None, None)

    return (lambda v: app.emit(sig, v)), close, [str(BENCH_DIR / "engine_worker.py"), "serve", url, "8"]


async def main(url: str, kind: str) -> None:
    emit, close, worker_args = await _producer(url, kind)
    worker = await start_worker(worker_args)
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    try:
        while (line := await loop.run_in_executor(None, sys.stdin.readline)).strip():
            n = int(line.split()[1])
            latency, emit_call = await emit_and_hear(worker, emit, n)
            print(f"L {n} {latency:.4f} {emit_call:.4f}", flush=True)
    finally:
        await stop_worker(worker)
        await close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[2], sys.argv[3]))
