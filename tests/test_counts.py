"""The per-status message counters (engine/store/counts.py) against the messages themselves.

The overview reads counters kept by triggers instead of counting rows; these tests drive concurrent
workers and emitters on SQLite and PostgreSQL and compare `ops.stats` with a plain `COUNT(*) … GROUP
BY` of the same snapshot, and check that a store made by the previous schema version is upgraded and
counted. Each kind of change one at a time (emit, claim, settle, dead, replay, purge, plain SQL) is
tests/conformance/test_counts.py, on every store shape.
"""
from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from engine import flow, oke, on, signal
from engine.errors import SchemaTooNew, StoreUnavailable
from engine.store import make_store
from engine.store import schema as schema_mod

STATUSES = ("pending", "inflight", "delivered", "dead")


class Boom(Exception):
    code = "E_BOOM"


def _counted_and_true(conn) -> tuple[dict, dict]:
    """(what ops.stats reports, what the messages say), read in one transaction."""
    from engine.ops.queries import stats

    reported = {(r.signal, st): getattr(r, st) for r in stats(conn) for st in STATUSES if getattr(r, st)}
    truth = {(sig, st): int(n) for sig, st, n in conn.execute(
        text("SELECT signal, status, count(*) FROM oke_messages GROUP BY signal, status"))}
    return reported, truth


def _counters_and_truth_in_one_statement(conn) -> tuple[dict, dict]:
    """The counters (with pending deltas) and a COUNT(*) of the messages, in ONE statement: on
    PostgreSQL each statement of a READ COMMITTED transaction sees its own snapshot, so only a
    single statement compares the two at one instant while workers keep committing."""
    rows = conn.execute(text(
        "SELECT 'counted', signal, status, sum(n) FROM (SELECT signal, status, n FROM oke_counts "
        "  UNION ALL SELECT signal, status, n FROM oke_count_deltas) AS c GROUP BY signal, status "
        "UNION ALL SELECT 'true', signal, status, count(*) FROM oke_messages GROUP BY signal, status"))
    found: dict[str, dict] = {"counted": {}, "true": {}}
    for source, sig, st, n in rows:
        if int(n):
            found[source][(sig, st)] = int(n)
    return found["counted"], found["true"]


async def assert_counts_exact(store) -> dict:
    reported, truth = await store.read(_counted_and_true)
    assert reported == truth
    return truth


async def test_counts_stay_exact_under_concurrent_workers_and_emitters(db_url):
    jobs = signal.once("c.load", retries=2)
    seen: set[int] = set()

    @on(jobs)
    @flow("w.load")
    async def handle(payload, fx):
        if payload not in seen:  # first attempt of every fifth message fails
            seen.add(payload)
            if payload % 5 == 0:
                raise Boom("first try")
        await asyncio.sleep(0)

    async with oke("c", database_url=db_url) as app:
        async def emitter(start: int) -> None:
            for n in range(start, start + 150):
                await app.emit(jobs, n, key=f"k{n % 7}" if n % 2 else None)

        workers = asyncio.create_task(app.run(concurrency=16))
        await asyncio.gather(*(emitter(i * 150) for i in range(4)))
        for _ in range(200):  # read while the workers still claim and settle
            reported, truth = await app.store.read(_counters_and_truth_in_one_statement)
            assert reported == truth
            if truth.get(("c.load", "delivered")) == 600:
                break
            await asyncio.sleep(0.05)
        await app.stop()
        await workers
        assert await assert_counts_exact(app.store) == {("c.load", "delivered"): 600}


async def test_postgres_folds_deltas_and_keeps_them_counted(pg_url):
    from engine.store import counts
    from engine.store.postgres import store as postgres

    jobs = signal.once("c.fold", retries=0)

    @on(jobs)
    @flow("w.fold")
    async def handle(payload, fx):
        pass

    async with oke("c", database_url=pg_url) as app:
        for n in range(50):
            await app.emit(jobs, n)
        deltas = await app.store.read(lambda c: c.execute(text("SELECT count(*) FROM oke_count_deltas")).scalar())
        assert deltas >= 1  # statement triggers append; nothing folded them yet within COMPACT_EVERY_S
        await app.drain()
        app.store._compacted_at -= postgres.COMPACT_EVERY_S  # due now: the next settle or emit folds
        await app.emit(jobs, 50)
        await asyncio.wait_for(asyncio.shield(app.store._compacting), 10)
        left = await app.store.read(lambda c: c.execute(text("SELECT count(*) FROM oke_count_deltas")).scalar())
        assert left <= 1  # at most a delta committed after the fold began
        stored = await app.store.read(lambda c: dict(c.execute(text(
            "SELECT status, n FROM oke_counts WHERE signal = 'c.fold'")).all()))
        assert stored.get("delivered") == 50
        assert await assert_counts_exact(app.store) == {("c.fold", "delivered"): 50, ("c.fold", "pending"): 1}
        assert counts.COMPACT_LOCK != postgres.SCHEMA_LOCK


def _downgrade_to_version_1(conn) -> None:
    """The layout version 1 had: no counters, no triggers."""
    if conn.dialect.name == "postgresql":
        for trigger in ("oke_count_insert", "oke_count_update", "oke_count_delete"):
            conn.execute(text(f"DROP TRIGGER IF EXISTS {trigger} ON oke_messages"))
            conn.execute(text(f"DROP FUNCTION IF EXISTS {trigger}()"))
    else:
        for trigger in ("oke_count_insert", "oke_count_update", "oke_count_delete"):
            conn.execute(text(f"DROP TRIGGER IF EXISTS {trigger}"))
    conn.execute(text("DROP TABLE oke_counts"))
    conn.execute(text("DROP TABLE oke_count_deltas"))
    conn.execute(text("UPDATE oke_meta SET value = '1' WHERE key = 'schema_version'"))


async def test_a_version_1_store_is_upgraded_and_its_messages_counted(db_url):
    jobs = signal.once("c.old", retries=0)

    @on(jobs)
    @flow("w.old")
    async def handle(payload, fx):
        if payload % 3 == 0:
            raise Boom("old")

    async with oke("c", database_url=db_url) as app:
        for n in range(30):
            await app.emit(jobs, n)
        await app.drain()
        for n in range(30, 40):
            await app.emit(jobs, n)
        await app.store.write(_downgrade_to_version_1)

    async with oke("c", database_url=db_url) as app:
        version = await app.store.read(lambda c: c.execute(text(
            "SELECT value FROM oke_meta WHERE key = 'schema_version'")).scalar())
        assert int(version) == schema_mod.SCHEMA_VERSION == 11  # 1 -> 2 -> ... -> 11 in one boot
        assert await assert_counts_exact(app.store) == {
            ("c.old", "delivered"): 20, ("c.old", "dead"): 10, ("c.old", "pending"): 10}
        await app.drain()
        assert await assert_counts_exact(app.store) == {("c.old", "delivered"): 26, ("c.old", "dead"): 14}


async def test_a_store_from_a_newer_okengine_is_refused_with_a_clear_error(db_url):
    async with oke("c", database_url=db_url, bindings=[]) as app:
        await app.store.write(lambda c: c.execute(text(
            "UPDATE oke_meta SET value = '99' WHERE key = 'schema_version'")))
    store = make_store(db_url)
    with pytest.raises((SchemaTooNew, StoreUnavailable), match="version 99.*upgrade okengine"):
        await store.open()
    await store.close()


async def test_postgres_analyzes_messages_when_its_statistics_lag_a_burst(pg_url):
    """A fresh store that takes a burst is planned as if empty until ANALYZE: the claim then scans
    and sorts every ready row. The compactor notices (rows changed ≫ rows analyzed) and analyzes."""
    from burstkit import emit_many
    from engine.store.postgres import store as postgres

    jobs = signal.once("c.burst", retries=0)
    async with oke("c", database_url=pg_url, bindings=[]) as app:
        await emit_many(app, jobs, list(range(5000)))

        async def analyzed() -> bool:
            return await app.store.read(lambda c: c.execute(text(
                "SELECT coalesce(last_analyze, last_autoanalyze) IS NOT NULL FROM pg_stat_user_tables "
                "WHERE relname = 'oke_messages'")).scalar())

        async with asyncio.timeout(30):
            while not await analyzed():
                app.store._compacted_at -= postgres.COMPACT_EVERY_S  # due: the next enqueue runs it
                await emit_many(app, jobs, [-1])
                if app.store._compacting is not None:
                    await asyncio.shield(app.store._compacting)
                await asyncio.sleep(0.5)
        plan = await app.store.read(lambda c: "\n".join(r[0] for r in c.execute(
            text("EXPLAIN " + postgres.claim_statement(8).replace("$1", "'w'").replace("$2", "30000")
                 .replace("$3::text[]", "ARRAY['c.burst']")))))
    assert "Index Scan using oke_messages_ready on oke_messages m" in plan, plan
