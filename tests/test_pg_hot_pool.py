"""The PostgreSQL hot pool returns connections without asyncpg's reset query (one round trip and
four statements less per claim, settle and enqueue). What that must not break: a connection handed
back inside an open transaction is rolled back, and the next user starts clean."""
from __future__ import annotations

import time

import pytest

from engine import StoreUnavailable, oke, signal
from engine.store import make_store
from engine.store.postgres import COMMAND_TIMEOUT_S, PostgresStore, _acquire

async def test_a_connection_released_inside_a_transaction_is_rolled_back(pg_url):
    store = make_store(pg_url)
    assert isinstance(store, PostgresStore)
    await store.open()
    try:
        assert store.pool is not None
        async with _acquire(store.pool) as conn:
            await conn.execute("CREATE TABLE hot_probe (n int)")
        async with _acquire(store.pool) as conn:
            tx = conn.transaction()
            await tx.start()  # unmanaged, never committed: the release must roll it back
            await conn.execute("INSERT INTO hot_probe VALUES (1)")
            backend = await conn.fetchval("SELECT pg_backend_pid()")
        async with _acquire(store.pool) as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") == backend  # the same connection
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SELECT count(*) FROM hot_probe") == 0
            assert await conn.fetchval("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
                                       "AND locktype = 'relation' AND relation = 'hot_probe'::regclass") == 0
    finally:
        await store.close()


async def test_an_emit_that_finds_every_connection_held_gives_up_after_the_statement_timeout(pg_url):
    """In a partition every pooled connection can be stuck in a claim or settle waiting out its own
    timeout; an emit queued behind them must still end within COMMAND_TIMEOUT_S as StoreUnavailable
    (it once waited for a connection, then for a fresh connect, and stored after the heal)."""
    jobs = signal.once("hot.jobs", optional=True)
    async with oke("p", database_url=pg_url, bindings=[]) as app:
        store = app.store
        assert isinstance(store, PostgresStore) and store.pool is not None
        held = [await store.pool.acquire() for _ in range(store.pool_size)]
        try:
            began = time.monotonic()
            with pytest.raises(StoreUnavailable, match="did not confirm the write"):
                await app.emit(jobs, {"n": 1})
            waited = time.monotonic() - began
        finally:
            for conn in held:
                await store.pool.release(conn)
        assert COMMAND_TIMEOUT_S - 0.5 <= waited < COMMAND_TIMEOUT_S + 5, waited
        assert await store.pool.fetchval("SELECT count(*) FROM oke_messages") == 0
        await app.emit(jobs, {"n": 2})  # the pool has its connections back
        assert await store.pool.fetchval("SELECT count(*) FROM oke_messages") == 1
