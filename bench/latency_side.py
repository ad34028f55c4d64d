"""One side of bench/latency_ab.py: a producer and its idle worker process, driven over stdin.

    latency_side.py ENGINE_ROOT URL engine|raw

Boots the worker (engine: engine_worker.py serve, 8 handlers; raw: peers/raw_latency.py) and prints
READY. Then, for each stdin line `E <n>`, emits message n (engine: app.emit; raw: INSERT +
pg_notify), waits for the worker's handler line and prints `L <n> <latency ms> <emit call ms>`
(latency.py's measure, one message at a time). An empty line or EOF stops both.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import common

os.environ[common.ENGINE_ENV] = sys.argv[1]  # this process and its worker run that engine/
common.pin_engine()

from common import BENCH_DIR, payload  # noqa: E402


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
    worker = await asyncio.create_subprocess_exec(
        sys.executable, *worker_args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    if (await asyncio.wait_for(worker.stdout.readline(), 60)).strip() != b"READY":
        raise RuntimeError(f"the {kind} latency worker did not start")
    await asyncio.sleep(0.5)
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    try:
        while (line := await loop.run_in_executor(None, sys.stdin.readline)).strip():
            n = int(line.split()[1])
            t_emit = time.time()
            await emit(payload(n))
            t_emitted = time.time()
            heard = (await asyncio.wait_for(worker.stdout.readline(), 30)).decode().split()
            if len(heard) != 3 or heard[0] != "H" or int(heard[1]) != n:
                raise RuntimeError(f"unexpected worker line {heard!r} for message {n}")
            print(f"L {n} {(float(heard[2]) - t_emit) * 1e3:.4f} {(t_emitted - t_emit) * 1e3:.4f}", flush=True)
    finally:
        worker.stdin.close()
        await worker.wait()
        await close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[2], sys.argv[3]))
