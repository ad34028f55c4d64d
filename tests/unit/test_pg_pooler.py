"""Behind a pooler, without a database: what the URL's knob says, listen_url's checks at oke(), how a
pooler's refusal is told from an outage and described, and the poll that stands in for LISTEN.
The same paths against a real PgBouncer are in tests/test_pgbouncer.py."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from engine import StoreUnavailable, oke
from engine.store import make_store
from engine.store.outage import is_outage
from engine.store.postgres.pooler import (
    PoolerMisconfigured,
    asyncpg_dsn,
    check_listen_url,
    misconfigured,
    pooler_refusal,
    transaction_pooled,
)
from engine.store.wake import Poller, Waker, tape_topic

PG = "postgresql+asyncpg://app:secret@db:6432/shop"


@pytest.mark.parametrize(
    "query, pooled",
    [
        ("", False),
        ("?prepared_statement_cache_size=0", True),
        ("?prepared_statement_cache_size=100", False),
        ("?sslmode=require&prepared_statement_cache_size=0", True),
    ],
)
def test_the_url_knob_says_a_transaction_pooler_is_in_front(query, pooled):
    assert transaction_pooled(PG + query) is pooled


@pytest.mark.parametrize(
    "query, says",
    [
        ("?prepared_statement_cache_size=off", "a count of statements"),
        ("?prepared_statement_cache_size=-1", "a count of statements"),
        ("?statement_cache_size=0", "asyncpg's name"),
    ],
)
def test_a_knob_that_is_not_a_count_is_a_clear_error(query, says):
    with pytest.raises(ValueError, match=says):
        transaction_pooled(PG + query)
    with pytest.raises(StoreUnavailable, match=says):
        make_store(PG + query)


def test_asyncpg_gets_the_url_without_sqlalchemys_knob():
    # asyncpg would send an unknown query argument to the server as a setting, and PgBouncer refuses it
    dsn = asyncpg_dsn(PG + "?sslmode=require&prepared_statement_cache_size=0")
    assert dsn == "postgresql://app:secret@db:6432/shop?sslmode=require"


@pytest.mark.parametrize(
    "listen_url, says",
    [
        ("sqlite+aiosqlite:///x.db", "got a 'sqlite+aiosqlite' URL"),
        ("http://db:5432/shop", "got a 'http' URL"),
        ("", "got str ''"),
        (5432, "got int 5432"),
        ("db:5432", "not a URL"),
    ],
)
def test_a_listen_url_that_is_not_postgresql_is_a_value_error_at_oke(listen_url, says):
    with pytest.raises(ValueError, match=r"oke\(listen_url=\.\.\.\)") as caught:
        oke("pooled", database_url=PG, listen_url=listen_url)
    assert says in str(caught.value)


def test_a_listen_url_beside_sqlite_is_a_value_error_and_never_shows_a_password():
    with pytest.raises(ValueError, match="only for a PostgreSQL store") as caught:
        oke("pooled", database_url="sqlite+aiosqlite:///x.db", listen_url="postgresql://u:hunter2@db/shop")
    assert "hunter2" not in str(caught.value)
    assert check_listen_url("postgresql://u@db:5432/shop", PG) == "postgresql://u@db:5432/shop"
    assert oke("pooled", database_url=PG, listen_url="postgresql://u@db:5432/shop").listen_url is not None


def test_a_startup_parameter_refused_names_pgbouncer_and_its_setting():
    refused = asyncpg.ProtocolViolationError("unsupported startup parameter: search_path")
    assert pooler_refusal(RuntimeError("connect failed")) is None
    wrapped = RuntimeError("connect failed")
    wrapped.__cause__ = refused
    refusal = pooler_refusal(wrapped)
    assert refusal == "unsupported startup parameter: search_path"
    message = str(misconfigured("db:6432/shop", refusal))
    assert "PgBouncer" in message and "ignore_startup_parameters" in message and "db:6432/shop" in message


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.InvalidSQLStatementNameError('prepared statement "__asyncpg_stmt_1__" does not exist'),
        asyncpg.DuplicatePreparedStatementError('prepared statement "__asyncpg_stmt_1__" already exists'),
    ],
)
def test_a_lost_or_doubled_prepared_statement_is_a_pooler_error_and_no_outage(error):
    refusal = pooler_refusal(error)
    assert refusal is not None and "__asyncpg_stmt_1__" in refusal
    err = misconfigured("db:6432/shop", refusal)
    assert isinstance(err, StoreUnavailable) and not is_outage(err)  # retrying cannot fix it
    assert "PgBouncer" in str(err) and "?prepared_statement_cache_size=0" in str(err) and "listen_url" in str(err)
    assert "cannot reach" not in str(err)
    assert pooler_refusal(asyncpg.UniqueViolationError("duplicate key")) is None
    assert is_outage(StoreUnavailable("cannot reach PostgreSQL")) and not is_outage(PoolerMisconfigured("x"))


async def test_the_poller_wakes_the_stores_waiters_and_tapes_every_tick():
    poller = Poller("test://pooled", every_s=0.2)
    work, tape, other = Waker("test://pooled"), Waker("test://pooled", tape_topic("ticks")), Waker("test://other")
    try:
        poller.ensure_started()
        started = time.monotonic()
        await work.wait(5)
        await tape.wait(5)
        assert time.monotonic() - started < 3
        await other.wait(0.5)
        assert not other.event.is_set()
    finally:
        await poller.close()
        for waker in (work, tape, other):
            waker.close()
    assert poller.task is None
    await asyncio.sleep(0)
