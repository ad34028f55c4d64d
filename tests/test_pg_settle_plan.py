"""The PostgreSQL ack stays a probe of the primary key per outcome, however stale the statistics.

After a burst of emits, ANALYZE sees every message pending, so the planner expects no row to be
`inflight` for this worker. Given a large array of outcomes it then scanned the whole table and
compared every inflight row with every outcome (a settle of 1,000 took 0.8 s at 20,000 messages,
and a slow settle let the next one grow larger still). The store acks at most
POSTGRES_ACK_ROWS_PER_STATEMENT outcomes a statement, a size the planner probes the key for."""
from __future__ import annotations

import asyncpg

from burstkit import emit_many
from engine import flow, oke, on, signal
from engine.ids import now_ms
from engine.store.postgres import store as postgres
from engine.store.sql.settle import POSTGRES_ACK_ROWS_PER_STATEMENT, POSTGRES_ACK_WITH_RUNS


def _ack_args(claimed, worker: str) -> list:
    now = now_ms()
    return [[c.seq for c in claimed], [c.attempts for c in claimed], [f"run_{c.seq}" for c in claimed],
            ["w"] * len(claimed), [c.signal for c in claimed], [c.id for c in claimed],
            [None] * len(claimed), [now] * len(claimed), [now] * len(claimed), now, worker]


async def _plan(dsn: str, claimed, worker: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:  # an unnamed statement: planned for these very arrays, as each settle's custom plan is
        return "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + POSTGRES_ACK_WITH_RUNS,
                                                         *_ack_args(claimed, worker)))
    finally:
        await conn.close()


async def test_the_ack_probes_the_key_even_when_the_statistics_saw_nothing_inflight(pg_url):
    jobs = signal.once("plan.jobs")
    on(jobs, flow("w", do=lambda p, fx: None))
    async with oke("p", database_url=pg_url) as app:
        await emit_many(app, jobs, list(range(20_000)))
        dsn = postgres.asyncpg_dsn(pg_url)
        conn = await asyncpg.connect(dsn)
        await conn.execute("ANALYZE oke_messages")  # every message pending
        await conn.close()
        claimed = []
        while len(claimed) < 1000:
            claimed += await app.store.claim(["plan.jobs"], "w1", 60_000, 64)
        plan = await _plan(dsn, claimed[:POSTGRES_ACK_ROWS_PER_STATEMENT], "w1")
        assert "Index Scan using oke_messages_pkey on oke_messages u" in plan, plan
        assert "Seq Scan on oke_messages" not in plan, plan
        # the statement the store used to send, for contrast: every outcome of the settle at once
        assert "Seq Scan on oke_messages u" in await _plan(dsn, claimed, "w1")
