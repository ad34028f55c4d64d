"""The test infrastructure itself: the private PostgreSQL, per-test databases, restarts."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from pgcluster import DatabasePool, PgCluster


def _plain(url: str) -> str:
    """postgresql+asyncpg://... -> postgresql://... for asyncpg.connect."""
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


def _dbname(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?", 1)[0]


async def test_cluster_accepts_connections(pg_cluster: PgCluster):
    conn = await asyncpg.connect(pg_cluster.admin_dsn, timeout=10)
    try:
        assert await conn.fetchval("SELECT 1") == 1
        assert await conn.fetchval("SHOW server_encoding") == "UTF8"
        if not pg_cluster.external:
            assert pg_cluster.admin_dsn == f"postgresql://postgres@127.0.0.1:{pg_cluster.port}/postgres"
            assert await conn.fetchval("SHOW max_connections") == "300"
            assert await conn.fetchval("SHOW listen_addresses") == "127.0.0.1"
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
            assert await conn.fetchval("SHOW fsync") == "on"
    finally:
        await conn.close()


_seen: list[str] = []


@pytest.mark.parametrize("round_", [1, 2])
async def test_pg_url_is_fresh_and_empty(pg_url: str, pg_cluster: PgCluster, round_: int):
    assert pg_url.startswith("postgresql+asyncpg://")
    name = _dbname(pg_url)
    assert name.startswith("oke_t_")
    assert pg_url == pg_cluster.sqlalchemy_url(name)
    assert name not in _seen, "each test gets its own database"
    for earlier in _seen:  # the previous test's database is gone by that name (renamed or dropped)
        assert not pg_cluster.fetch("SELECT 1 FROM pg_database WHERE datname = $1", earlier)
    _seen.append(name)

    conn = await asyncpg.connect(_plain(pg_url), timeout=10)
    try:
        assert await conn.fetchval("SELECT current_database()") == name
        n = await conn.fetchval(
            "SELECT count(*) FROM information_schema.tables"
            " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
        )
        assert n == 0, "a fresh database has no tables"
        assert await conn.fetchval("SELECT array_agg(extname::text) FROM pg_extension") == ["plpgsql"]
        assert await conn.fetchval(
            "SELECT array_agg(nspname::text) FROM pg_namespace"
            " WHERE left(nspname, 3) <> 'pg_' AND nspname <> 'information_schema'") == ["public"]
        # leave something behind: the next round must not see it
        await conn.execute("CREATE TABLE leftover (id int)")
        await conn.execute("CREATE EXTENSION pg_trgm")
        await conn.execute("CREATE SCHEMA elsewhere")
        await conn.execute("CREATE TABLE elsewhere.leftover (id int)")
    finally:
        await conn.close()


async def test_a_database_given_back_is_emptied_and_out_of_reach_of_its_last_test(pg_cluster: PgCluster):
    """The pool (tests/pgcluster.py) reuses databases: a straggler of the test that used one (a
    session still open, or one that connects again by the old name) cannot reach it, and the next
    test finds it empty."""
    pool = DatabasePool(pg_cluster, prefix="oke_pool_")
    used = pool.take()
    pg_cluster.fetch("CREATE TABLE leftover (id int)", database=used)
    straggler = await asyncpg.connect(pg_cluster.dsn(used), timeout=10)
    try:
        pool.give_back(used)
        with pytest.raises((asyncpg.PostgresConnectionError, asyncpg.InterfaceError, ConnectionError)):
            await straggler.fetchval("SELECT 1")  # its session was ended
    finally:
        straggler.terminate()
    with pytest.raises(asyncpg.InvalidCatalogNameError):
        await asyncpg.connect(pg_cluster.dsn(used), timeout=10)  # and the old name leads nowhere
    again = pool.take()
    try:
        assert again != used
        assert pg_cluster.fetch("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", database=again)[0][0] == 0
    finally:
        pg_cluster.drop_database(again)


async def test_db_url_sqlalchemy_roundtrip(db_url: str, request: pytest.FixtureRequest):
    kind = request.node.callspec.params["db_url"]
    prefix = {"sqlite": "sqlite+aiosqlite:///", "postgres": "postgresql+asyncpg://"}[kind]
    assert db_url.startswith(prefix)
    assert ("postgres" in request.node.keywords) == (kind == "postgres")
    eng = create_async_engine(db_url)
    try:
        async with eng.begin() as conn:
            await conn.execute(text("CREATE TABLE t (id integer PRIMARY KEY, v text)"))
            await conn.execute(text("INSERT INTO t VALUES (1, 'x')"))
        async with eng.connect() as conn:
            assert (await conn.execute(text("SELECT v FROM t WHERE id = 1"))).scalar_one() == "x"
    finally:
        await eng.dispose()


def test_sqlite_url_lives_in_tmp_path(sqlite_url: str, tmp_path):
    assert sqlite_url == f"sqlite+aiosqlite:///{tmp_path}/oke.db"
    assert sqlite_url.startswith("sqlite+aiosqlite:////")  # absolute path


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_restart_keeps_data_and_accepts_connections(pg_cluster: PgCluster, pg_url: str, mode: str):
    if pg_cluster.external:
        pytest.skip("restart() is not available on an external OKE_TEST_PG_DSN server")
    conn = await asyncpg.connect(_plain(pg_url), timeout=10)
    await conn.execute("CREATE TABLE kept (id int)")
    await conn.execute("INSERT INTO kept VALUES (42)")  # autocommit: committed before the restart
    port = pg_cluster.port

    pg_cluster.restart(mode=mode)  # "immediate" is a crash: recovery replays the WAL

    with pytest.raises((asyncpg.PostgresError, OSError, asyncpg.InterfaceError)):
        await conn.fetchval("SELECT 1")  # the old session is gone
    await conn.close(timeout=1)

    assert pg_cluster.port == port
    conn = await asyncpg.connect(_plain(pg_url), timeout=10)
    try:
        assert await conn.fetchval("SELECT id FROM kept") == 42
    finally:
        await conn.close()


@pytest.mark.postgres
def test_own_cluster_start_stop_removes_everything():
    """A second, independent cluster: stop() leaves neither a process nor a directory."""
    import os

    pg = PgCluster(use_env=False)
    try:
        pg.start()
    except Exception as e:  # same policy as the pg_cluster fixture
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"PostgreSQL unavailable: {e}")
        pytest.skip(f"PostgreSQL unavailable: {e}")
    try:
        assert [r[0] for r in pg.fetch("SELECT 1")] == [1]
        with open(os.path.join(pg.data_dir, "postmaster.pid")) as f:
            pid = int(f.readline())
        base = pg.base_dir
    finally:
        pg.stop()
    assert not os.path.exists(base)
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        assert state == "Z", "postmaster still running after stop()"  # exited, awaiting its reaper
    except FileNotFoundError:
        pass
    pg.stop()  # idempotent
