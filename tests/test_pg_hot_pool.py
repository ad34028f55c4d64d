"""The PostgreSQL hot pool returns connections without asyncpg's reset query (one round trip and
four statements less per claim, settle and enqueue). What that must not break: a connection handed
back inside an open transaction is rolled back, and the next user starts clean."""
from __future__ import annotations

from engine.store import make_store
from engine.store.postgres import PostgresStore, _acquire

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
