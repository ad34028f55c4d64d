"""The engine under test: one once signal with a no-op async flow, emit, instrument, verify."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from typing import Any, Callable

import engine
from engine import flow, oke, on, signal

SIGNAL = "bench.noop"
FLOW = "bench.noop"
LEASE_MS = 30_000


async def noop(payload: Any, fx: Any) -> None:
    return None


def declare(handler: Callable = noop):
    """Fresh declarations for this run (engine.reset() forgets the previous run's); the signal's
    options come from OKE_BENCH_SIGNAL_OPTIONS (JSON) when set, e.g. a limit whose cost bench/ab.py
    measures."""
    engine.reset()
    sig = signal.once(SIGNAL, **json.loads(os.environ.get("OKE_BENCH_SIGNAL_OPTIONS") or "{}"))
    on(sig, flow(FLOW, do=handler))
    return sig


def make_app(url: str, name: str = "bench"):
    return oke(name, database_url=url, lease_ms=LEASE_MS)


@contextlib.contextmanager
def without_history_and_heartbeats() -> Iterator[None]:
    """The engine with its per-minute history tally and its worker heartbeats switched off, in this
    process only: the side-by-side row that prices what recording them costs (issue 15)."""
    from engine.heartbeat import WorkerHeartbeat
    from engine.store.history import HistoryTally

    async def enter(self):
        return self

    async def leave(self, *_exc) -> None:
        return None

    saved = (HistoryTally.emitted, HistoryTally.settled, WorkerHeartbeat.__aenter__, WorkerHeartbeat.__aexit__)
    HistoryTally.emitted = lambda self, rows: None
    HistoryTally.settled = lambda self, outcomes, held, failed_to: None
    WorkerHeartbeat.__aenter__, WorkerHeartbeat.__aexit__ = enter, leave
    try:
        yield
    finally:
        HistoryTally.emitted, HistoryTally.settled, WorkerHeartbeat.__aenter__, WorkerHeartbeat.__aexit__ = saved


DELAY_MAX_MS = 50  # the delayed mix: every other message waits 1–50 ms (`delay`)


def emit_options(i: int, delayed: bool) -> dict:
    """The emit options of message i: in the delayed mix, odd messages get a delay of 1–50 ms."""
    return {"delay": f"{i % DELAY_MAX_MS + 1}ms"} if delayed and i % 2 else {}


async def emit_all(app, sig, n: int, parallel: int, delayed: bool = False) -> float:
    """Emit n messages through app.emit with up to `parallel` emits in flight; returns emits/s.
    `delayed`: half of them with a delay of at most DELAY_MAX_MS, all due before this returns."""
    from common import payload

    t0 = time.perf_counter()
    if parallel <= 1:
        for i in range(n):
            await app.emit(sig, payload(i), **emit_options(i, delayed))
    else:
        it = iter(range(n))

        async def lane():
            for i in it:
                await app.emit(sig, payload(i), **emit_options(i, delayed))

        await asyncio.gather(*(lane() for _ in range(parallel)))
    rate = round(n / (time.perf_counter() - t0), 1)
    if delayed:
        await asyncio.sleep(DELAY_MAX_MS / 1000 + 0.01)  # the drain finds every message due
    return rate


class StoreProbe:
    """Counts claim and settle calls on an open app's store (wraps the bound methods; a joined
    settle_and_claim, SQLite's claim cycle, counts as one of each)."""

    def __init__(self, store) -> None:
        self.claims = self.claimed = self.empty_claims = 0
        self.settles = self.settled = 0
        self.claim_s = self.settle_s = 0.0
        claim, settle, settle_and_claim = store.claim, store.settle, store.settle_and_claim

        async def counted_claim(*args, **kwargs):
            t = time.perf_counter()
            rows = await claim(*args, **kwargs)
            self.claim_s += time.perf_counter() - t
            self.claims += 1
            self.claimed += len(rows)
            self.empty_claims += not rows
            return rows

        async def counted_settle(worker_id, outcomes):
            t = time.perf_counter()
            held = await settle(worker_id, outcomes)
            self.settle_s += time.perf_counter() - t
            self.settles += 1
            self.settled += len(outcomes)
            return held

        async def counted_settle_and_claim(worker_id, outcomes, *args, **kwargs):
            t = time.perf_counter()
            held, rows = await settle_and_claim(worker_id, outcomes, *args, **kwargs)
            spent = time.perf_counter() - t
            self.claim_s += spent
            self.claims += 1
            self.claimed += len(rows)
            self.empty_claims += not rows
            if outcomes:
                self.settles += 1
                self.settled += len(outcomes)
            return held, rows

        store.claim, store.settle = counted_claim, counted_settle
        if store.settles_with_claims:
            store.settle_and_claim = counted_settle_and_claim

    def stats(self) -> dict:
        full = self.claims - self.empty_claims
        return {"claims": self.claims, "empty_claims": self.empty_claims, "claimed": self.claimed,
                "mean_claim_batch": round(self.claimed / full, 2) if full else 0.0,
                "settles": self.settles, "settled": self.settled,
                "mean_settle_batch": round(self.settled / self.settles, 2) if self.settles else 0.0,
                "claim_wait_s": round(self.claim_s, 3), "settle_wait_s": round(self.settle_s, 3)}


VERIFY_SQL = ("SELECT count(*) FILTER (WHERE status = 'delivered'), count(*), coalesce(sum(attempts), 0), "
              "coalesce(max(attempts), 0), (SELECT count(*) FROM oke_runs WHERE status = 'succeeded') "
              "FROM oke_messages")


def _check(row, n: int) -> tuple[dict, bool]:
    d, total, attempts, max_attempts, runs = (int(x or 0) for x in row)
    chk = {"delivered": d, "total": total, "attempts": attempts, "max_attempts": max_attempts,
           "runs_succeeded": runs}
    return chk, d == n and total == n and attempts == n and max_attempts == 1 and runs == n


async def verify_pg(dsn: str, n: int) -> tuple[dict, bool]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(VERIFY_SQL)
    finally:
        await conn.close()
    return _check(tuple(row), n)


def verify_sqlite(path: str, n: int) -> tuple[dict, bool]:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(VERIFY_SQL).fetchone()  # SQLite ≥ 3.30 has FILTER
    finally:
        conn.close()
    return _check(row, n)
