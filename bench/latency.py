"""Emit → handler-start latency on PostgreSQL, idle worker in another process.

The worker process (engine: engine_worker.py serve, app.run(concurrency=8); raw: peers/raw_latency.py)
prints "H <n> <time.time()>" at handler entry. The producer here waits a random 0–100 ms (the
worker is idle by then), records t_emit = time.time(), emits one message (engine: app.emit from
an app in this process; raw: INSERT + pg_notify), then waits for the worker's line. latency =
t_handler - t_emit: the emit's commit, the wake-up, the claim's commit and the payload decode.
Both clocks are this machine's CLOCK_REALTIME. 5 warm-up messages are not counted.
"""
from __future__ import annotations

import asyncio
import random
import statistics
import sys
import time
import uuid

from common import BENCH_DIR, payload, pct, speed_probe_ms
from engine_app import declare, make_app, verify_pg
from peers import raw_latency

WARMUP = 5
WORKER_CONCURRENCY = 8


async def start_worker(args: list[str]):
    proc = await asyncio.create_subprocess_exec(sys.executable, *args, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE)
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    if line.strip() != b"READY":
        raise RuntimeError(f"latency worker did not start: {line!r}")
    await asyncio.sleep(0.5)
    return proc


async def emit_and_hear(proc, emit, i: int) -> tuple[float, float]:
    """Emit message i and wait for the worker's handler line: (latency ms, emit call ms)."""
    t_emit = time.time()
    await emit(payload(i))
    t_emitted = time.time()
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()
    if len(line) != 3 or line[0] != "H" or int(line[1]) != i:
        raise RuntimeError(f"unexpected worker line {line!r} for message {i}")
    return (float(line[2]) - t_emit) * 1e3, (t_emitted - t_emit) * 1e3


async def _measure(proc, emit, n: int, seed: int) -> tuple[list[float], list[float], float]:
    """The latencies, the emit calls, and the CPU speed probe around them (common.speed_probe_ms)."""
    probe0 = speed_probe_ms()
    rnd = random.Random(seed)
    lat, call = [], []
    for i in range(-WARMUP, n):
        await asyncio.sleep(rnd.uniform(0.0, 0.100))
        latency, emit_call = await emit_and_hear(proc, emit, i)
        if i >= 0:
            lat.append(latency)
            call.append(emit_call)
    return lat, call, (probe0 + speed_probe_ms()) / 2


async def stop_worker(proc) -> None:
    if proc.returncode is None:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()


def _summary(bench: str, lat: list[float], call: list[float], probe: float, n: int) -> dict:
    return {"bench": bench, "messages": n, "speed_probe_ms": round(probe, 3), "p50_ms": round(pct(lat, 0.5), 3),
            "p90_ms": round(pct(lat, 0.9), 3), "p99_ms": round(pct(lat, 0.99), 3),
            "max_ms": round(max(lat), 3), "min_ms": round(min(lat), 3),
            "mean_ms": round(statistics.mean(lat), 3), "emit_call_p50_ms": round(pct(call, 0.5), 3),
            "emit_call_p99_ms": round(pct(call, 0.99), 3)}


async def engine_latency(cluster, n: int, seed: int) -> dict:
    db = f"bench_l_{uuid.uuid4().hex[:10]}"
    url = cluster.create_database(db)
    proc = None
    try:
        sig = declare()
        async with make_app(url, name="bench-producer") as app:
            proc = await start_worker([str(BENCH_DIR / "engine_worker.py"), "serve", url, str(WORKER_CONCURRENCY)])
            lat, call, probe = await _measure(proc, lambda v: app.emit(sig, v), n, seed)
            await stop_worker(proc)
        chk, ok = await verify_pg(cluster.dsn(db), n + WARMUP)
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        cluster.drop_database(db)
    return {**_summary("latency_engine", lat, call, probe, n), "worker_concurrency": WORKER_CONCURRENCY,
            "verified": ok, "check": chk}


async def raw_latency_run(cluster, dsn: str, n: int, seed: int) -> dict:
    await raw_latency.setup(dsn)
    emitter = await raw_latency.Emitter().open(dsn)
    proc = None
    try:
        proc = await start_worker([str(BENCH_DIR / "peers" / "raw_latency.py"), "worker", dsn])
        lat, call, probe = await _measure(proc, emitter.emit, n, seed)
        await stop_worker(proc)
        chk, ok = await emitter.verify(n + WARMUP)
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        await emitter.close()
    return {**_summary("latency_raw_notify", lat, call, probe, n), "verified": ok, "check": chk}
