"""Behind PgBouncer: a real PgBouncer (tests/pgbouncerkit.py) in front of the test PostgreSQL.

The `pooled` fixture runs a test three ways: transaction mode with `?prepared_statement_cache_size=0`
and a direct `listen_url`, transaction mode without one (idle workers poll), and session mode with
nothing declared. The once path, the live/SSE path, the console's commands and `okconsole serve`
run through each. Then what goes wrong without the URL's knob (a clear error naming PgBouncer and
the fix, never "cannot reach PostgreSQL"), how idle workers are woken (NOTIFY on listen_url, else a
poll every 0.5 s with one warning), and listen_url's own checks.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import httpx
import pytest
from consolekit import run_okconsole, wait_port
from livekit import data_of, free_port, read_frames, serving
from pgbouncerkit import KNOB, PgBouncer, Pooled
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from workers.db import fetch, pg_dsn

import engine
from engine import flow, http, oke, on, signal
from engine.store.postgres.hot import HotConnections
from engine.store.postgres.pooler import PoolerMisconfigured, misconfigured, pooler_refusal
from engine.store.postgres.store import _transaction

TESTS = Path(__file__).resolve().parent
NO_POLL_S = 30.0  # the workers' own fallback poll, made long: only a wake-up can start a handler soon


class Flaky(Exception):
    code = "E_FLAKY"


def _database(url: str) -> str:
    return make_url(url).database or ""


# --------------------------------------------------------------------------- the paths, three ways


async def test_once_path_delivers_every_message_with_its_retries(pooled: Pooled):
    """Single emits (some keyed, one deduped), a batch, a COPY-sized batch; a worker of 4 handlers;
    a retry after a failure and a dead letter after the last retry: every message ends where it
    must and every handler call is counted, none lost, none twice."""
    task = signal.once("pgb.task", retries=2)
    calls: collections.Counter[int] = collections.Counter()

    @on(task)
    @flow("pgb.handle")
    async def handle(payload, fx):
        n = payload["n"]
        calls[n] += 1
        if n < 60:
            await asyncio.sleep(0.005)
        if n == 7 or (n % 5 == 0 and n < 60 and fx.attempt == 1):
            raise Flaky(f"attempt {fx.attempt} of {n}")

    async with oke("pgb", database_url=pooled.url, **pooled.options) as app:
        ids = {n: await app.emit(task, {"n": n}, key=f"k{n % 3}" if n % 4 == 0 else None) for n in range(29)}
        ids[29] = await app.emit(task, {"n": 29}, dedupe="once-only")
        assert await app.emit(task, {"n": 29}, dedupe="once-only") == ids[29]  # held: nothing stored
        ids.update(zip(range(30, 60), await app.emit_many(task, [{"n": n} for n in range(30, 60)]), strict=True))
        ids.update(zip(range(60, 1060), await app.emit_many(task, [{"n": n} for n in range(60, 1060)]), strict=True))
        await app.drain(concurrency=4)

    def expected(n: int) -> tuple[str, int]:
        if n == 7:
            return ("dead", 3)
        return ("delivered", 2) if n % 5 == 0 and n < 60 else ("delivered", 1)

    rows = await fetch(pooled.direct_url, "SELECT id, status, attempts FROM oke_messages")
    assert {r[0]: (r[1], r[2]) for r in rows} == {msg_id: expected(n) for n, msg_id in ids.items()}
    assert calls == collections.Counter({n: expected(n)[1] for n in ids})


async def test_live_events_reach_an_sse_reader(pooled: Pooled):
    status = signal.live("pgb.status")
    on(http.live(status).public())
    app = oke("pgb-live", database_url=pooled.url, **pooled.options)
    async with app, serving(app) as base, httpx.AsyncClient(timeout=20) as client:
        ids = [await app.emit(status, {"n": n}) for n in range(3)]

        async def later() -> None:
            await asyncio.sleep(0.3)
            ids.append(await app.emit(status, {"n": 3}))

        emitter = asyncio.create_task(later())
        response, frames = await read_frames(client, f"{base}/_oke/live/pgb.status", 4, timeout=20)
        await emitter
    assert response.status_code == 200
    assert [f["id"] for f in frames] == ids
    assert data_of(frames) == [{"n": n} for n in range(4)]


def test_console_reads_and_replays_through_pgbouncer(pooled: Pooled):
    async def seed() -> tuple[str, str]:
        task = signal.once("pgb.console", retries=0)

        @on(task)
        @flow("pgb.console-flow")
        async def handle(payload, fx):
            if payload["fail"]:
                raise Flaky("declined")

        async with oke("pgb-console", database_url=pooled.url, **pooled.options) as app:
            delivered = await app.emit(task, {"fail": False})
            dead = await app.emit(task, {"fail": True})
            await app.drain()
        return delivered, dead

    delivered, dead = asyncio.run(seed())
    stats = run_okconsole("--db", pooled.url, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    [row] = [r for r in json.loads(stats.stdout) if r["signal"] == "pgb.console"]
    assert (row["delivered"], row["dead"]) == (1, 1)
    listed = run_okconsole("--db", pooled.url, "messages", "pgb.console", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {(m["id"], m["status"]) for m in json.loads(listed.stdout)} == {(delivered, "delivered"), (dead, "dead")}
    replay = run_okconsole("--db", pooled.url, "replay", "pgb.console", dead, "--yes", "--reason", "pgbouncer")
    assert replay.returncode == 0, replay.stderr
    rows = asyncio.run(fetch(pooled.direct_url, "SELECT status, attempts FROM oke_messages WHERE id = $1", dead))
    assert rows == [("pending", 0)]
    for done in (stats, listed, replay):
        assert "Traceback" not in done.stderr and "cannot reach" not in done.stderr


def test_okconsole_serve_runs_an_app_behind_pgbouncer(pooled: Pooled):
    """The served app's workers take jobs a producer in another process emits (woken by NOTIFY on
    listen_url, by LISTEN through session mode, or by the poll), and their live events come out
    over SSE; the polling one says so on stderr, once."""
    port = free_port()
    env = {
        **os.environ,
        "OKE_DATABASE_URL": pooled.url,
        "OKE_TEST_LISTEN_URL": pooled.listen_url or "",
        "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "okconsole", "serve", "cli_apps.pooled:app", "--port", str(port), "--concurrency", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_port(port, timeout=60)

        async def produce_and_read() -> list[dict]:
            engine.reset()
            jobs = signal.once("pooled.jobs", retries=1)
            signal.live("pooled.status")
            async with oke("producer", database_url=pooled.url, bindings=[], **pooled.options) as producer:
                for n in range(5):
                    await producer.emit(jobs, {"n": n})
            async with httpx.AsyncClient(timeout=30) as client:
                _r, frames = await read_frames(
                    client, f"http://127.0.0.1:{port}/_oke/live/pooled.status", 5, timeout=30
                )
            return data_of(frames)

        events = asyncio.run(produce_and_read())
        assert sorted(e["job"] for e in events) == [0, 1, 2, 3, 4]
    finally:
        server.terminate()
        _out, err = server.communicate(timeout=30)
    assert server.returncode in (0, -15), err
    assert "Traceback" not in err
    assert err.count("poll every 0.5 s") == (1 if pooled.mode == "transaction-polling" else 0), err


async def test_the_idle_transaction_bound_holds_behind_pgbouncer(pooled: Pooled):
    """A cut-off client's transaction is ended by the server after 10 s idle: set at connect where
    the session is ours, else inside each transaction (PgBouncer refuses it as a startup parameter)."""
    async with oke("pgb-idle", database_url=pooled.url, **pooled.options) as app:
        setting = "SHOW idle_in_transaction_session_timeout"
        assert await app.store.read(lambda c: c.execute(text(setting)).scalar()) == "10s"
        assert await app.store.write(lambda c: c.execute(text(setting)).scalar()) == "10s"
        async with app.store.hot.connection() as conn:
            async with _transaction(conn, app.store.set_local):
                assert await conn.fetchval(setting) == "10s"


# --------------------------------------------------------------------------- without the knob


async def test_a_transaction_pooler_without_the_knob_is_refused_naming_the_fix(pgbouncer_transaction, pg_url):
    url = pgbouncer_transaction.sqlalchemy_url(_database(pg_url))
    app = oke("pgb-bare", database_url=url)
    with pytest.raises(PoolerMisconfigured) as caught:
        await app.start()
    message = str(caught.value)
    assert "PgBouncer" in message and "prepared_statement_cache_size=0" in message and "listen_url" in message
    assert "pool_mode = session" in message and "cannot reach" not in message
    assert app.store is None


def test_the_console_and_serve_say_the_same_in_one_line(pgbouncer_transaction, pg_url):
    url = pgbouncer_transaction.sqlalchemy_url(_database(pg_url))
    stats = run_okconsole("--db", url, "stats", "--json")
    env = {"OKE_DATABASE_URL": url, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    served = run_okconsole("serve", "cli_apps.pooled:app", "--port", str(free_port()), env=env)
    for done in (stats, served):
        assert done.returncode == 1, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert "PgBouncer" in last and "prepared_statement_cache_size=0" in last, done.stderr
        assert "Traceback" not in done.stderr and "cannot reach" not in done.stderr


@pytest.fixture
def own_pgbouncer(pgbouncer_transaction, pg_cluster):
    """A transaction-mode PgBouncer for one test: PgBouncer 1.18 exits ("bad client state") when a
    cancel request races its client's close, which a console torn down mid-connect can send."""
    with PgBouncer(pg_cluster, pool_mode="transaction") as bouncer:
        yield bouncer


async def test_the_tui_says_why_in_its_status_line(own_pgbouncer, pg_url):
    """The console's screen does not sit at "connecting…": its status line names PgBouncer, and keeps trying."""
    from okconsole.app import ConsoleApp

    url = own_pgbouncer.sqlalchemy_url(_database(pg_url))
    console = ConsoleApp(url, refresh_s=0.2)

    def status() -> str:
        try:
            return str(console.screen.query_one("#status").render())
        except Exception:
            return ""

    async with console.run_test(size=(200, 40)) as pilot:
        deadline = time.monotonic() + 20
        while "PgBouncer" not in status():
            assert time.monotonic() < deadline, f"status line: {status()!r}"
            await pilot.pause(0.1)
        assert "store unreachable" in status() and "prepared_statement_cache_size=0" in status()
        assert console.store_ok is False


async def test_a_prepared_statement_the_pooler_lost_names_pgbouncer_and_the_fix(pgbouncer_transaction, pg_url):
    """A named statement prepared on one server connection, run again while another client holds
    that one: PgBouncer sends it to another, which lacks it. On the hot connections the call ends in
    the error naming the fix; through SQLAlchemy the same refusal is recognised behind its wrapper."""
    url = pgbouncer_transaction.sqlalchemy_url(_database(pg_url))
    holder = await asyncpg.connect(pg_dsn(url))
    hot = HotConnections(lambda: asyncpg.connect(pg_dsn(url)), 1, 10.0, target="pgbouncer-under-test")
    sa = create_async_engine(url, pool_size=1, max_overflow=0)
    try:
        async with hot.connection() as conn:
            named = await conn.prepare("SELECT 1")
            assert await named.fetchval() == 1  # its Sync: PgBouncer frees the server connection
        async with holder.transaction():  # holds the server connection the statement was prepared on
            await holder.execute("SELECT 3")
            with pytest.raises(PoolerMisconfigured) as caught:
                async with hot.connection() as conn:
                    await named.fetchval()
        async with sa.connect() as sa_conn:
            await sa_conn.execute(text("SELECT 2"))
            await sa_conn.commit()
            async with holder.transaction():
                await holder.execute("SELECT 3")
                with pytest.raises(Exception) as wrapped:
                    await sa_conn.execute(text("SELECT 2"))
        message = str(caught.value)
        assert "pgbouncer-under-test" in message and "PgBouncer" in message and f"?{KNOB}" in message
        assert isinstance(caught.value.__cause__, asyncpg.InvalidSQLStatementNameError)
        refusal = pooler_refusal(wrapped.value)
        assert refusal is not None and "does not exist" in refusal
        assert "PgBouncer" in str(misconfigured("db:5432/x", refusal))
    finally:
        await hot.close()
        await sa.dispose()
        await holder.close()


# --------------------------------------------------------------------------- waking idle workers


async def _emit_to_idle_workers(app_url: str, producer_url: str, options: dict) -> tuple[list[float], dict]:
    """Three emits from a store of another URL (its in-process wake-ups reach none of the app's
    waiters) to an app idling with a 30 s fallback poll: how long each took to reach its handler,
    and how the app's store was woken."""
    task = signal.once("pgb.wake")
    started: asyncio.Queue[tuple[int, float]] = asyncio.Queue()

    @on(task)
    @flow("pgb.wake-flow")
    async def handle(payload, fx):
        started.put_nowait((payload["n"], time.monotonic()))

    app = oke("pgb-wake", database_url=app_url, **options)
    producer = oke("pgb-producer", database_url=producer_url, bindings=[])
    waits: list[float] = []
    async with app, producer:
        runner = asyncio.create_task(app.run(concurrency=2))
        await asyncio.sleep(1.0)  # idle by now: every lane waits to be woken
        woken_by = {
            "listener": app.store._listener is not None,
            "poller": app.store._poller is not None,
            "hands_off": app.store.hands_off,
        }
        for n in range(3):
            emitted = time.monotonic()
            await producer.emit(task, {"n": n})
            got, at = await asyncio.wait_for(started.get(), 20)
            assert got == n
            waits.append(at - emitted)
            await asyncio.sleep(0.3)
        await app.stop()
        await asyncio.wait_for(runner, 20)
    return waits, woken_by


async def test_listen_url_wakes_idle_workers_by_notify(pgbouncer_transaction, pg_url, monkeypatch, caplog):
    monkeypatch.setattr("engine.worker.claiming.IDLE_POLL_S", NO_POLL_S)
    url = pgbouncer_transaction.sqlalchemy_url(_database(pg_url), KNOB)
    with caplog.at_level(logging.WARNING, logger="engine.store.postgres"):
        waits, woken_by = await _emit_to_idle_workers(url, pg_url, {"listen_url": pg_url})
    assert max(waits) < 5.0, waits  # a wake-up, not the 30 s poll
    assert woken_by == {"listener": True, "poller": False, "hands_off": True}
    assert not [r for r in caplog.records if "listen_url" in r.getMessage()]


async def test_without_listen_url_it_warns_once_and_polls(pgbouncer_transaction, pg_url, monkeypatch, caplog):
    monkeypatch.setattr("engine.worker.claiming.IDLE_POLL_S", NO_POLL_S)
    url = pgbouncer_transaction.sqlalchemy_url(_database(pg_url), KNOB)
    with caplog.at_level(logging.WARNING, logger="engine.store.postgres"):
        waits, woken_by = await _emit_to_idle_workers(url, pg_url, {})
    assert max(waits) < 5.0, waits  # the store's 0.5 s poll, not the workers' 30 s one
    warned = [r.getMessage() for r in caplog.records if r.name == "engine.store.postgres"]
    assert len(warned) == 1 and "listen_url" in warned[0] and "poll every 0.5 s" in warned[0], warned
    assert woken_by == {"listener": False, "poller": True, "hands_off": False}
    assert await fetch(pg_url, "SELECT count(*) FROM oke_idle_workers") == [(0,)]  # no offers: nobody hears takes


# --------------------------------------------------------------------------- listen_url's checks


async def test_a_listen_url_through_the_pooler_is_refused(pgbouncer_transaction, pg_url):
    database = _database(pg_url)
    url = pgbouncer_transaction.sqlalchemy_url(database, KNOB)
    app = oke("pgb-listen", database_url=url, listen_url=pgbouncer_transaction.sqlalchemy_url(database))
    with pytest.raises(PoolerMisconfigured, match="direct connection to PostgreSQL"):
        await app.start()


async def test_a_listen_url_of_another_database_is_refused(pgbouncer_transaction, pg_cluster, pg_url):
    url = pgbouncer_transaction.sqlalchemy_url(_database(pg_url), KNOB)
    app = oke("pgb-listen", database_url=url, listen_url=pg_cluster.sqlalchemy_url("postgres"))
    with pytest.raises(PoolerMisconfigured, match="reaches database 'postgres', not the store's"):
        await app.start()


async def test_a_connection_through_the_pooler_does_not_hear_notify(pgbouncer_transaction, pg_url, monkeypatch):
    """The last of listen_url's checks at start: its connection hears a NOTIFY sent on ours."""
    monkeypatch.setattr("engine.store.postgres.store.LISTEN_PROBE_S", 1.0)
    url = pgbouncer_transaction.sqlalchemy_url(_database(pg_url), KNOB)
    async with oke("pgb-listen", database_url=url, listen_url=pg_url) as app:
        direct = await asyncpg.connect(pg_dsn(pg_url))
        pooled = await asyncpg.connect(pg_dsn(url.split("?")[0]), statement_cache_size=0)
        try:
            assert await app.store._hears_notify(direct)
            assert not await app.store._hears_notify(pooled)
        finally:
            await direct.close()
            await pooled.close()
