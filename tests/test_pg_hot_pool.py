"""The PostgreSQL store's hot connections (engine/store/postgres/hot.py): emits, claims and settles take
one and give it back without a reset query or a task. What that must not break: never more than
`size` open, a waiting call served by the next connection given back (or by the place of one
discarded), a connection that comes back in an unknown state never handed out again, and a wait
that gives up as an outage within the statement timeout."""
from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from engine import StoreUnavailable, oke, signal
from engine.store import make_store
from engine.store.postgres.hot import HotConnections
from engine.store.postgres.store import COMMAND_TIMEOUT_S, PostgresStore, asyncpg_dsn


def _hot(pg_url: str, size: int, wait_s: float = 5.0, max_idle_s: float = 300.0) -> tuple[HotConnections, list[int]]:
    """HotConnections on the test database; `opened` counts the connections it opened."""
    opened: list[int] = []

    async def connect() -> asyncpg.Connection:
        opened.append(1)
        return await asyncpg.connect(asyncpg_dsn(pg_url), timeout=5)

    return HotConnections(connect, size, wait_s, max_idle_s), opened


async def _pid(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT pg_backend_pid()")


async def _backend_alive(pg_url: str, pid: int) -> bool:
    conn = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        return bool(await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid))
    finally:
        await conn.close()


async def _until_gone(pg_url: str, pid: int) -> None:
    deadline = time.monotonic() + 5
    while await _backend_alive(pg_url, pid):
        assert time.monotonic() < deadline, f"backend {pid} is still there"
        await asyncio.sleep(0.05)


async def test_many_calls_share_at_most_size_connections_and_reuse_the_last_given_back(pg_url):
    hot, opened = _hot(pg_url, size=3)
    try:
        seen: set[int] = set()

        async def call() -> None:
            async with hot.connection() as conn:
                seen.add(await _pid(conn))
                await conn.execute("SELECT pg_sleep(0.02)")

        await asyncio.gather(*(call() for _ in range(30)))
        assert len(seen) == 3 and len(opened) == 3 and hot.open_count == 3
        async with hot.connection() as conn:
            last = await _pid(conn)
        async with hot.connection() as conn:
            assert await _pid(conn) == last  # the one given back last: its caches are warm
    finally:
        await hot.close()
    assert hot.open_count == 0


async def test_a_connection_idle_too_long_is_closed_instead_of_used(pg_url):
    """A NAT on the way may have dropped an idle connection's flow without a word: one idle longer
    than max_idle_s is closed, not trusted with a statement that would wait out its timeout."""
    hot, opened = _hot(pg_url, size=2, max_idle_s=0.3)
    try:
        async with hot.connection() as conn:
            stale = await _pid(conn)
        await asyncio.sleep(0.4)
        async with hot.connection() as conn:
            assert await _pid(conn) != stale
        await _until_gone(pg_url, stale)
        assert len(opened) == 2 and hot.open_count == 1
    finally:
        await hot.close()


async def test_a_connection_given_back_inside_a_transaction_is_never_handed_out_again(pg_url):
    hot, _ = _hot(pg_url, size=1)
    try:
        async with hot.connection() as conn:
            await conn.execute("CREATE TABLE hot_probe (n int)")
        async with hot.connection() as conn:
            tx = conn.transaction()
            await tx.start()  # unmanaged, never committed
            await conn.execute("INSERT INTO hot_probe VALUES (1)")
            backend = await _pid(conn)
        async with hot.connection() as conn:
            assert await _pid(conn) != backend
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SELECT count(*) FROM hot_probe") == 0
        await _until_gone(pg_url, backend)  # terminated: its transaction and locks went with it
        assert hot.open_count == 1
    finally:
        await hot.close()


async def test_a_refused_statement_keeps_the_connection_and_a_cancelled_one_discards_it(pg_url):
    hot, _ = _hot(pg_url, size=1)
    try:
        with pytest.raises(asyncpg.DivisionByZeroError):
            async with hot.connection() as conn:
                first = await _pid(conn)
                await conn.execute("SELECT 1 / 0")
        with pytest.raises(TimeoutError):
            async with hot.connection() as conn:
                assert await _pid(conn) == first  # the server refused a statement: still fit
                async with asyncio.timeout(0.2):
                    await conn.execute("SELECT pg_sleep(5)")
        async with hot.connection() as conn:
            assert await _pid(conn) != first  # cancelled mid-statement: its state is unknown
            assert await conn.fetchval("SELECT 7") == 7
        await _until_gone(pg_url, first)
    finally:
        await hot.close()


async def test_a_waiting_call_gets_the_place_of_a_discarded_connection(pg_url):
    hot, opened = _hot(pg_url, size=2)
    try:
        held = [await hot.take() for _ in range(2)]
        pids = {await _pid(c) for c in held}
        waiting = asyncio.create_task(hot.take())
        await asyncio.sleep(0.1)
        assert not waiting.done()
        hot.give(held[0], fit=False)  # discarded: the waiter opens a new one in its place
        conn = await asyncio.wait_for(waiting, 5)
        assert await _pid(conn) not in pids and len(opened) == 3 and hot.open_count == 2
        hot.give(conn)
        hot.give(held[1])
    finally:
        await hot.close()


async def test_a_wait_that_gives_up_or_is_cancelled_leaves_no_place_taken(pg_url):
    hot, opened = _hot(pg_url, size=1, wait_s=0.3)
    try:
        held = await hot.take()
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            await hot.take()
        assert 0.25 <= time.monotonic() - began < 2
        cancelled = asyncio.create_task(hot.take())
        await asyncio.sleep(0.05)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        hot.give(held)
        async with hot.connection() as conn:  # at once, on the same connection: nobody kept a place
            assert conn is held
        assert len(opened) == 1 and hot.open_count == 1
    finally:
        await hot.close()


async def test_after_close_a_call_fails_and_a_connection_given_back_is_closed(pg_url):
    hot, _ = _hot(pg_url, size=2)
    idle = await hot.take()
    in_use = await hot.take()
    hot.give(idle)
    idle_pid, in_use_pid = await _pid(idle), await _pid(in_use)
    await hot.close()
    assert idle.is_closed()
    with pytest.raises(asyncpg.InterfaceError, match="closed"):
        await hot.take()
    hot.give(in_use)
    assert in_use.is_closed() and hot.open_count == 0
    await _until_gone(pg_url, idle_pid)
    await _until_gone(pg_url, in_use_pid)


@pytest.mark.long
async def test_an_emit_that_finds_every_connection_held_gives_up_after_the_statement_timeout(pg_url):
    """In a partition every hot connection can be stuck in a claim or settle waiting out its own
    timeout; an emit queued behind them must still end within COMMAND_TIMEOUT_S as StoreUnavailable
    (it once waited for a connection, then for a fresh connect, and stored after the heal)."""
    jobs = signal.once("hot.jobs", optional=True)
    async with oke("p", database_url=pg_url, bindings=[]) as app:
        store = app.store
        assert isinstance(store, PostgresStore) and store.hot is not None
        held = [await store.hot.take() for _ in range(store.hot.size)]
        try:
            began = time.monotonic()
            with pytest.raises(StoreUnavailable, match="did not confirm the write"):
                await app.emit(jobs, {"n": 1})
            waited = time.monotonic() - began
        finally:
            for conn in held:
                store.hot.give(conn)
        assert COMMAND_TIMEOUT_S - 0.5 <= waited < COMMAND_TIMEOUT_S + 5, waited
        async with store.hot.connection() as conn:
            assert await conn.fetchval("SELECT count(*) FROM oke_messages") == 0
        await app.emit(jobs, {"n": 2})  # the connections are back
        async with store.hot.connection() as conn:
            assert await conn.fetchval("SELECT count(*) FROM oke_messages") == 1


async def test_the_store_opens_one_hot_connection_and_closes_them_all(pg_url):
    store = make_store(pg_url)
    assert isinstance(store, PostgresStore)
    await store.open()
    hot = store.hot
    assert hot is not None and hot.open_count == 1
    async with hot.connection() as conn:
        pid = await _pid(conn)
    await store.close()
    assert hot.open_count == 0
    await _until_gone(pg_url, pid)
