"""Shared by the SSE benchmark's processes: /proc accounting, histograms, control lines."""
from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Awaitable, Callable

SIGNAL_NAME = "order-status"
LIVE_PATH = f"/_oke/live/{SIGNAL_NAME}"
BARE_PATH = "/sse"
HIST_STEP_MS = 0.1            # latency histogram resolution below 1 s
HIST_COARSE_MS = 10.0         # ... and from 1 s on
HIST_FINE = 10_000            # buckets below 1 s
HIST_MAX_MS = 600_000.0       # anything slower lands in the last bucket
TICK = os.sysconf("SC_CLK_TCK")


def payload(n: int) -> dict[str, Any]:
    """An order-status event; `t` (emit wall time) comes first so readers find it cheaply."""
    return {"t": time.time(), "n": n, "orderId": f"o{n % 997}", "status": "paid"}


# ------------------------------------------------------------------------------- /proc
def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> float:
    """utime + stime of one process (all its threads), seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    return total - idle, total


# ------------------------------------------------------------------------------- children
def die_with_parent() -> None:
    """Linux: get SIGTERM when the process that started us dies (no stray benchmark processes)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() == 1:
        os._exit(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def say(**fields: Any) -> None:
    """One JSON control line to the orchestrator."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def stdin_commands(loop: Any, handle: Callable[[dict[str, Any]], None]) -> None:
    """Read JSON command lines from stdin in a thread; hand each to `handle` on the loop.

    EOF (the orchestrator is gone) counts as {"cmd": "quit"}.
    """
    def run() -> None:
        for line in sys.stdin:
            line = line.strip()
            if line:
                loop.call_soon_threadsafe(handle, json.loads(line))
        loop.call_soon_threadsafe(handle, {"cmd": "quit"})

    threading.Thread(target=run, name="stdin-commands", daemon=True).start()


# ------------------------------------------------------------------------------- latency
def _bucket_ms(b: int) -> float:
    """The middle of bucket b, in ms."""
    if b < HIST_FINE:
        return (b + 0.5) * HIST_STEP_MS
    return HIST_FINE * HIST_STEP_MS + (b - HIST_FINE + 0.5) * HIST_COARSE_MS


class Histogram:
    """Latency histogram: 0.1 ms buckets below 1 s, 10 ms buckets to 600 s; mergeable as JSON."""

    def __init__(self) -> None:
        self.size = HIST_FINE + int((HIST_MAX_MS - HIST_FINE * HIST_STEP_MS) / HIST_COARSE_MS) + 1
        self.counts = [0] * self.size
        self.n = 0

    def add_ms(self, ms: float) -> None:
        if ms < 1000.0:
            b = int(ms * 10.0) if ms > 0 else 0
        else:
            b = HIST_FINE + int((ms - 1000.0) / HIST_COARSE_MS)
            if b >= self.size:
                b = self.size - 1
        self.counts[b] += 1
        self.n += 1

    def dump(self) -> dict[str, int]:
        return {str(i): c for i, c in enumerate(self.counts) if c}

    @staticmethod
    def merge(dumps: list[dict[str, int]]) -> dict[int, int]:
        out: dict[int, int] = {}
        for d in dumps:
            for k, c in d.items():
                out[int(k)] = out.get(int(k), 0) + c
        return out

    @staticmethod
    def percentile(merged: dict[int, int], q: float, missing: int = 0) -> float:
        """The q-quantile; `missing` samples (never arrived) rank above every bucket: +inf."""
        total = sum(merged.values()) + missing
        if not total:
            return float("nan")
        rank = q * (total - 1)
        seen = 0
        for b in sorted(merged):
            seen += merged[b]
            if seen > rank:
                return _bucket_ms(b)
        return float("inf")


# ------------------------------------------------------------------------------- emitting
async def emit_at_rate(emit: Callable[[int], Awaitable[Any]], rate: float, duration: float) -> dict[str, Any]:
    """Start `emit(i)` on a fixed schedule (rate per second, for duration seconds), open loop.

    `emit(i)` is called at the scheduled moment (so a payload's `t` is taken then) and the awaitable
    it returns runs as its own task, whether or not earlier ones have
    returned (as independent requests would), so a slow store does not quietly lower the offered
    rate; `max_inflight` says how many emits were waiting at once. No emit starts after `duration`:
    when the process is too busy to keep the schedule (a saturated event loop), fewer than
    rate × duration go out, and `emitted` / `start_rate` say so.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    count = int(rate * duration)
    interval = 1.0 / rate
    calls: list[float] = []
    inflight: set[asyncio.Task] = set()
    max_inflight = 0

    errors: list[str] = []

    async def timed(pending: Awaitable[Any], started: float) -> None:
        try:
            await pending
        except Exception as err:  # counted and reported: a failed emit is a result, not a crash
            errors.append(f"{type(err).__name__}: {err}"[:300])
            return
        calls.append((time.perf_counter() - started) * 1000)

    base = loop.time()
    t0 = time.time()
    cpu0 = time.process_time()
    last_start = base
    emitted = 0
    for i in range(count):
        target = base + i * interval
        delay = target - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        last_start = loop.time()
        if last_start - base > duration:
            break
        emitted += 1
        task = loop.create_task(timed(emit(i), time.perf_counter()))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
        max_inflight = max(max_inflight, len(inflight))
    if inflight:
        await asyncio.gather(*list(inflight))
    end = loop.time()
    calls.sort()
    return {"emitted": emitted, "scheduled": count, "t0": t0, "t_end": time.time(), "elapsed_s": end - base,
            "start_rate": emitted / duration,
            "behind_s": max(0.0, last_start - (base + (emitted - 1) * interval)) if emitted == count else
            max(0.0, last_start - base - duration), "max_inflight": max_inflight,
            "emit_ms_p50": calls[len(calls) // 2] if calls else None,
            "emit_ms_p99": calls[int(len(calls) * 0.99)] if calls else None,
            "cpu_s": time.process_time() - cpu0, "emit_errors": len(errors), "emit_error_first": errors[0] if errors else None}
