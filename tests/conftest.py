"""Shared fixtures: a private PostgreSQL for the session, fresh databases per test, SQLite files.

Fixtures
    pg_cluster  (session)  the running PgCluster (tests/pgcluster.py); OKE_TEST_PG_DSN reuses a server
    pg_url      (function) postgresql+asyncpg://postgres@127.0.0.1:PORT/oke_t_<hex>, an empty database
                           of its own: renamed and emptied afterwards for a later test (DatabasePool)
    sqlite_url  (function) sqlite+aiosqlite:///<tmp_path>/oke.db
    db_url      (function) parametrized ["sqlite", "postgres"]: one of the two above
    pgbouncer_transaction, pgbouncer_session  (session)  a real PgBouncer (tests/pgbouncerkit.py) in front
                           of pg_cluster in that pool mode; never skipped when CI=true
    pooled      (function) parametrized ["transaction", "transaction-polling", "session"]: a fresh
                           database behind PgBouncer, as a Pooled (its URLs and the oke() options to use)
Every test runs between two `engine.reset()` calls. Tests that use PostgreSQL get the `postgres`
marker automatically (`-m "not postgres"` deselects them). PostgreSQL tests never skip when CI=true.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pgbouncerkit import Pooled, PgBouncer  # noqa: E402
from pgcluster import DatabasePool, PgCluster, PgClusterError, fresh_database_name  # noqa: E402
from prockit import worker_procs  # noqa: E402

_PG_FIXTURES = {"pg_cluster", "pg_url", "pgbouncer_transaction", "pgbouncer_session", "pooled"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "postgres: uses the test PostgreSQL server (added automatically)")
    config.addinivalue_line("markers", "long: runs for 10 s or more; the suite starts these first")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        via_db_url = callspec is not None and callspec.params.get("db_url") == "postgres"
        if names & _PG_FIXTURES or via_db_url:
            item.add_marker(pytest.mark.postgres)
    # The files of long tests first: pytest-xdist hands files out in the order of their first test,
    # so these spread over the workers at the start instead of one finishing alone at the end.
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def _start_or_skip(service, what: str) -> None:
    """Start a server the tests need; without it they skip locally and fail in CI."""
    try:
        service.start()
    except (PgClusterError, OSError) as e:
        reason = f"{what} unavailable: {e}"
        if _in_ci():
            pytest.fail(f"{reason} (CI=true: {what} tests must not be skipped)", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_cluster():
    cluster = PgCluster()
    _start_or_skip(cluster, "PostgreSQL")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pg_databases(pg_cluster: PgCluster) -> DatabasePool:
    return DatabasePool(pg_cluster)


@pytest.fixture
def pg_url(pg_cluster: PgCluster, pg_databases: DatabasePool):
    name = pg_databases.take()
    try:
        yield pg_cluster.sqlalchemy_url(name)
    finally:
        pg_databases.give_back(name)


def _pgbouncer(cluster: PgCluster, pool_mode: str):
    bouncer = PgBouncer(cluster, pool_mode=pool_mode)
    _start_or_skip(bouncer, "PgBouncer")
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(scope="session")
def pgbouncer_transaction(pg_cluster: PgCluster):
    yield from _pgbouncer(pg_cluster, "transaction")


@pytest.fixture(scope="session")
def pgbouncer_session(pg_cluster: PgCluster):
    yield from _pgbouncer(pg_cluster, "session")


@pytest.fixture(params=["transaction", "transaction-polling", "session"])
def pooled(request: pytest.FixtureRequest, pg_cluster: PgCluster):
    """A fresh database behind PgBouncer: in transaction mode with a direct listen_url, in transaction
    mode without one (the workers poll), or in session mode (nothing to declare)."""
    mode = request.param
    bouncer = request.getfixturevalue("pgbouncer_session" if mode == "session" else "pgbouncer_transaction")
    name = fresh_database_name()
    direct = pg_cluster.create_database(name)
    try:
        yield Pooled.of(mode, bouncer, name, direct)
    finally:
        pg_cluster.drop_database(name)


@pytest.fixture
def one_retention_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's own retention pass runs at its start, then every 10 s: on a loaded machine it could
    delete the rows a test had just aged before the test's own counted pass. This keeps the next
    one an hour away."""
    monkeypatch.setattr("engine.retention.PASS_EVERY_S", 3600.0)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'oke.db'}"


@pytest.fixture(params=["sqlite", "postgres"], ids=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


def _reset_engine() -> None:
    # The engine is being written alongside the tests: tolerate its absence for now.
    try:
        import engine

        reset = engine.reset
    except (ImportError, AttributeError):
        return
    reset()


@pytest.fixture(autouse=True)
def _engine_reset():
    _reset_engine()
    yield
    _reset_engine()


@pytest.fixture
def procs(tmp_path):
    """Worker processes (tests/prockit.py) a test starts; any still running are killed at its end."""
    yield from worker_procs(tmp_path)
