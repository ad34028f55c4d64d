"""The PostgreSQL claim keeps one plan: its generic plan (what a prepared statement reuses instead
of planning each call) must be the ordered scan of the ready index, as a custom plan is.

With `LIMIT $n` the generic plan assumed a tenth of the table would be claimed and joined it by a
hash over a scan of every message, so PostgreSQL planned the claim afresh on every call instead;
the claim size is now written into the text."""
from __future__ import annotations

import asyncpg
import pytest

from burstkit import emit_many
from engine import oke, signal
from engine.store.postgres import store as postgres


async def _generic_plan(dsn: str, statement: str, types: str, args: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE claim({types}) AS {statement}")
        return "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN EXECUTE claim({args})"))
    finally:
        await conn.close()


async def test_the_generic_claim_plan_is_the_ordered_index_scan(pg_url):
    jobs = signal.once("plan.jobs")
    async with oke("p", database_url=pg_url, bindings=[]) as app:
        await emit_many(app, jobs, list(range(4000)))
        dsn = postgres.asyncpg_dsn(pg_url)
        conn = await asyncpg.connect(dsn)
        await conn.execute("ANALYZE oke_messages")
        await conn.close()
        plan = await _generic_plan(dsn, postgres.claim_statement(8), "text, bigint, text[]",
                                   "'w', 30000, ARRAY['plan.jobs']")
        assert "Index Scan using oke_messages_ready on oke_messages m" in plan, plan
        assert "Seq Scan" not in plan and "Sort" not in plan, plan
        # the shape it replaced, for contrast: with a parameter LIMIT, a scan of every message
        with_param = postgres.claim_statement(8).replace("LIMIT 8", "LIMIT $4")
        plan = await _generic_plan(dsn, with_param, "text, bigint, text[], int",
                                   "'w', 30000, ARRAY['plan.jobs'], 8")
        assert "Seq Scan on oke_messages u" in plan, plan


async def test_with_delayed_and_prioritised_rows_the_plan_is_still_the_ordered_index_scan(pg_url):
    """The ready index is ordered (priority DESC, seq): the claim's ORDER BY reads it in order, and
    `run_at IS NULL OR run_at <= now` is a filter on the rows it reads, not a second scan."""
    jobs = signal.once("plan.jobs", optional=True)
    async with oke("p", database_url=pg_url, bindings=[]) as app:
        await emit_many(app, jobs, list(range(2000)))
        for n in range(200):
            await app.emit(jobs, n, delay="1h" if n % 2 else None, priority=n % 3)
        dsn = postgres.asyncpg_dsn(pg_url)
        conn = await asyncpg.connect(dsn)
        await conn.execute("ANALYZE oke_messages")
        await conn.close()
        plan = await _generic_plan(dsn, postgres.claim_statement(8), "text, bigint, text[]",
                                   "'w', 30000, ARRAY['plan.jobs']")
        assert "Index Scan using oke_messages_ready on oke_messages m" in plan, plan
        assert "Seq Scan" not in plan and "Sort" not in plan, plan
        assert "run_at" in plan, plan  # the due filter rides on that scan
        claimed = await app.store.claim(["plan.jobs"], "w", 30_000, 8)
    assert [c.priority for c in claimed] == [2] * 8  # the highest first, in seq order
    assert [c.seq for c in claimed] == sorted(c.seq for c in claimed)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_a_claim_size_that_is_not_a_positive_int_is_refused(bad):
    with pytest.raises(ValueError, match="claim limit"):
        postgres.claim_statement(bad)
