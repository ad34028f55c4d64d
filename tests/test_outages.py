"""Outages: the database goes away under a running app and comes back.

PostgreSQL (a private cluster for this module, stopped and started for real): boot against a stopped
server, workers riding out a stop, emit while it is down and after it returns, an SSE stream across
a restart, the console and the CLI while it is down. SQLite: a write lock held by another process,
the store's directory moved away (and back) or removed, the store file turned read-only.

What "rides out" means everywhere: no busy loop while the store is away (claim attempts and CPU
time are counted), recovery without a restart, every message delivered exactly once (a handler
runs again only where a lease was lost), nothing left inflight, and emit never returns an id for a
message it did not store.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest

from engine import StoreUnavailable, flow, http, oke, on, signal
from engine.client import Client
from engine.flows import current_bindings
from livekit import free_port, serving, wait_listening
from pgcluster import PgCluster, PgClusterError
from prockit import tree_cpu_s
from workers.db import fetch
from consolekit import okconsole_cmd

OUTAGE_S = 2.5


# --------------------------------------------------------------------------- helpers

@pytest.fixture(scope="module")
def own_pg():
    """This module's own PostgreSQL: stopping it disturbs no other test."""
    cluster = PgCluster(use_env=False)
    try:
        cluster.start()
    except (PgClusterError, OSError) as err:
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(f"PostgreSQL unavailable: {err} (CI=true)", pytrace=False)
        pytest.skip(f"PostgreSQL unavailable: {err}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg(own_pg: PgCluster) -> PgCluster:
    if not _server_up(own_pg):  # a failed test left it stopped
        own_pg.start_server()
    return own_pg


@pytest.fixture
def pg_db(pg: PgCluster) -> str:
    name = f"oke_out_{os.urandom(6).hex()}"
    return pg.create_database(name)


def _server_up(cluster: PgCluster) -> bool:
    try:
        cluster.fetch("SELECT 1")
        return True
    except Exception:
        return False


@contextlib.asynccontextmanager
async def pg_down(cluster: PgCluster, mode: str = "fast") -> AsyncIterator[None]:
    """The server stopped for the block, then started: `fast` terminates the sessions cleanly,
    `immediate` is a crash (the start runs WAL recovery)."""
    await asyncio.to_thread(cluster.stop_server, mode)
    try:
        yield
    finally:
        await asyncio.to_thread(cluster.start_server)


def one_line(err: BaseException) -> str:
    text = str(err)
    assert text and "\n" not in text, f"expected a one-line reason, got {text!r}"
    return text


async def until(check: Any, timeout: float, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.05)


class CountingClaims:
    """Counts store.claim calls (attempts, failed ones included) on one app's store."""

    def __init__(self, app: Any) -> None:
        self.count = 0
        store = app.store
        original = store.claim

        async def claim(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await original(*args, **kwargs)

        store.claim = claim


class Recorder:
    """A `once` signal whose handler records each call; some messages fail their first attempt."""

    def __init__(self, name: str = "jobs") -> None:
        self.signal = signal.once(name, retries=2)
        self.started: collections.Counter[int] = collections.Counter()
        self.succeeded: collections.Counter[int] = collections.Counter()
        self.failed: collections.Counter[int] = collections.Counter()

        @on(self.signal)
        @flow(f"workers.{name}")
        async def handle(payload: dict, fx: Any) -> None:
            n = payload["n"]
            self.started[n] += 1
            await asyncio.sleep(payload.get("sleep", 0.0))
            if payload.get("fail_first") and fx.attempt == 1:
                self.failed[n] += 1
                raise RuntimeError(f"first attempt of {n} fails")
            self.succeeded[n] += 1

    def all_done(self, ns: range | list[int]) -> bool:
        return all(self.succeeded[n] >= 1 for n in ns)


async def status_counts(app: Any) -> dict[str, int]:
    rows = await fetch(app.database_url, "SELECT status, count(*) FROM oke_messages GROUP BY status")
    return {status: count for status, count in rows}


async def settled_state(app: Any, rec: Recorder, ns: list[int]) -> None:
    """Every message delivered, nothing pending or inflight; every handler call's outcome recorded
    (none lost in the outage), exactly one success landed per message, a handler succeeded twice
    only where a lease was lost, and every landed failure has its failure row and a retry."""
    counts = await status_counts(app)
    assert counts == {"delivered": len(ns)}, counts
    runs = await fetch(app.database_url, "SELECT m.payload, r.status FROM oke_runs r "
                                         "JOIN oke_messages m ON m.id = r.message_id")
    by_status: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for payload, status in runs:
        by_status[status][json.loads(payload)["n"]] += 1
    assert len(runs) == sum(rec.started[n] for n in ns), (len(runs), sum(rec.started.values()))
    assert all(by_status["succeeded"][n] == 1 for n in ns), by_status["succeeded"]
    lost = set(by_status["lease_lost"])
    twice = {n for n in ns if rec.succeeded[n] != 1}
    assert twice <= lost, f"handlers ran more than once without a lost lease: {sorted(twice - lost)}"
    failures = await fetch(app.database_url, "SELECT count(*) FROM oke_failures")
    assert failures[0][0] == sum(by_status["failed"].values()), (failures, by_status["failed"])
    landed = set(by_status["failed"])
    assert {n for n in ns if rec.failed[n]} - lost <= landed <= {n for n in ns if rec.failed[n]}


# --------------------------------------------------------------------------- PostgreSQL

@pytest.mark.postgres
async def test_boot_against_a_stopped_server_is_store_unavailable(pg: PgCluster, pg_db: str):
    signal.once("jobs", optional=True)
    async with pg_down(pg):
        with pytest.raises(StoreUnavailable) as err:
            async with oke("t", database_url=pg_db):
                pass
        text = one_line(err.value)
        assert f"127.0.0.1:{pg.port}" in text
    async with oke("t", database_url=pg_db) as app:  # and boots once it is back
        assert app.store is not None


@pytest.mark.postgres
@pytest.mark.parametrize("lease_ms", [10_000, 1_500], ids=["lease_outlives_outage", "lease_expires_in_outage"])
async def test_workers_ride_out_a_postgres_stop(pg: PgCluster, pg_db: str, lease_ms: int):
    """With a lease shorter than the outage, the slow handlers' leases expire while it is down: a
    message may then run again (its first outcome is fenced off as lease_lost) but never lands twice."""
    rec = Recorder()
    async with oke("shop", database_url=pg_db, lease_ms=lease_ms) as app:
        claims = CountingClaims(app)
        before = list(range(30))
        for n in before:
            await app.emit(rec.signal, {"n": n, "fail_first": n % 10 == 3})
        runner = asyncio.create_task(app.run(concurrency=8))
        await until(lambda: rec.all_done(before), 15, "the first batch")
        # 8 slow handlers (two fail their first attempt) hold every slot when the server stops:
        # they finish during the outage, so their outcomes are settled while it is down
        slow = list(range(30, 38))
        for n in slow:
            await app.emit(rec.signal, {"n": n, "sleep": 1.0, "fail_first": n in (31, 35)})
        await until(lambda: all(rec.started[n] for n in slow), 10, "slow handlers started")

        async with pg_down(pg):
            claims_at_stop, cpu_at_stop = claims.count, tree_cpu_s()
            for _ in range(3):
                with pytest.raises(StoreUnavailable) as err:
                    await app.emit(rec.signal, {"n": 999})
                text = one_line(err.value)
                assert 'emit("jobs")' in text and "may not be stored" in text
            await asyncio.sleep(OUTAGE_S)
            claims_during = claims.count - claims_at_stop
            cpu_during = tree_cpu_s() - cpu_at_stop
            assert not runner.done(), "workers gave up during the outage"
        # back-off: a handful of claim attempts over the outage, and the process mostly idle
        assert claims_during <= 15, claims_during
        assert cpu_during < 0.5 * (OUTAGE_S + 0.5), cpu_during

        back = time.monotonic()
        after = list(range(38, 60))
        for n in after:  # the first emit after the restart works: no app restart, no retry
            await app.emit(rec.signal, {"n": n, "fail_first": n % 10 == 3})
        everything = before + slow + after
        await until(lambda: rec.all_done(everything), 15, "every message handled")
        recovered_in = time.monotonic() - back
        assert recovered_in < 8, recovered_in  # nothing waited for a 10 s lease to expire
        await asyncio.sleep(0.3)  # the last settle
        await app.stop()
        await asyncio.wait_for(runner, 15)
        await settled_state(app, rec, everything)
        assert 999 not in rec.started


@contextlib.asynccontextmanager
async def _stopped_while_down(
        pg: PgCluster, app: Any, rec: Recorder, ns: list[int], sleep_s: float) -> AsyncIterator[tuple[dict, asyncio.Task]]:
    """One message per n, each handler sleeping `sleep_s`, a worker with a slot for each; once all
    have started the server stops, and once all have finished the app is told to stop. The block
    runs with the server still down (ids by n, the worker's task); it starts again after it."""
    ids = {n: await app.emit(rec.signal, {"n": n, "sleep": sleep_s}) for n in ns}
    runner = asyncio.create_task(app.run(concurrency=len(ns)))
    await until(lambda: all(rec.started[n] for n in ns), 10, "handlers started")
    async with pg_down(pg):
        await until(lambda: all(rec.succeeded[n] for n in ns), 10, "handlers finished")
        await app.stop()
        yield ids, runner


@pytest.mark.postgres
@pytest.mark.long
async def test_a_stop_during_an_outage_names_the_outcomes_it_gives_up_and_they_run_again(
        pg: PgCluster, pg_db: str, caplog: pytest.LogCaptureFixture):
    """A worker stopped while the server is down cannot write what its handlers finished: after
    its back-off it exits and logs each message it gave up settling; those messages run again,
    once, after their leases end."""
    rec = Recorder()
    ns = list(range(4))
    with caplog.at_level(logging.ERROR, logger="engine.worker"):
        async with oke("shop", database_url=pg_db, lease_ms=1_500) as app:
            async with _stopped_while_down(pg, app, rec, ns, 2.0) as (ids, runner):
                await asyncio.wait_for(runner, 20)
    given_up = [r.getMessage() for r in caplog.records if "giving up settling" in r.getMessage()]
    assert len(given_up) == 1, given_up
    assert all(f"{ids[n]} attempt 1" in given_up[0] for n in ns), given_up

    # the first leases (1.5 s) end while the server is down; these (10 s) outlive the 2 s handlers
    async with oke("shop", database_url=pg_db, lease_ms=10_000) as app:
        runner = asyncio.create_task(app.run(concurrency=4))
        await until(lambda: all(rec.succeeded[n] == 2 for n in ns), 15, "every message run again")
        await asyncio.sleep(0.3)  # the last settle
        await app.stop()
        await asyncio.wait_for(runner, 15)
        rows = await fetch(app.database_url, "SELECT id, status, attempts FROM oke_messages")
    assert {mid: (status, attempts) for mid, status, attempts in rows} == \
        {ids[n]: ("delivered", 2) for n in ns}
    assert all(rec.started[n] == 2 for n in ns), rec.started


@pytest.mark.postgres
async def test_a_stop_during_an_outage_settles_what_finished_if_the_server_is_back_before_the_last_try(
        pg: PgCluster, pg_db: str, caplog: pytest.LogCaptureFixture):
    """The settler at stop waits 0.05, 0.1, … 3.2 s between tries (about 6.4 s in all) and gives up
    only when the try after the longest wait fails too: a server back 4-5 s into the outage gets
    every finished outcome, and nothing runs twice."""
    rec = Recorder()
    ns = list(range(4))
    with caplog.at_level(logging.ERROR, logger="engine.worker"):
        async with oke("shop", database_url=pg_db, lease_ms=1_500) as app:
            async with _stopped_while_down(pg, app, rec, ns, 1.0) as (ids, runner):
                await asyncio.sleep(4.0)  # past the try at 3.15 s, before the one at 6.35 s
                assert not runner.done(), "the worker gave up before its last try"
            await asyncio.wait_for(runner, 20)
            rows = await fetch(app.database_url, "SELECT id, status, attempts FROM oke_messages")
    assert not [r.getMessage() for r in caplog.records if "giving up settling" in r.getMessage()]
    assert {mid: (status, attempts) for mid, status, attempts in rows} == \
        {ids[n]: ("delivered", 1) for n in ns}
    assert all(rec.started[n] == 1 for n in ns), rec.started


@pytest.mark.postgres
async def test_emit_while_down_raises_and_works_again_once_back(pg: PgCluster, pg_db: str, monkeypatch):
    """Every emit path: once bound here (asyncpg pool), broadcast and once bound in another process (a
    SQLAlchemy read of the recorded bindings first), live (a SQLAlchemy write). Twice (a clean stop,
    then a crash), so replaced connections are exercised too."""
    import engine.bindings_cache

    monkeypatch.setattr(engine.bindings_cache, "BINDINGS_CACHE_S", 0.0)  # read the bindings at every emit
    jobs = signal.once("jobs")
    fanout = signal.broadcast("fanout")
    remote = signal.once("remote")
    status = signal.live("status", optional=True)

    async def nothing(_payload: Any, _fx: Any) -> None:
        pass

    on(fanout, flow("workers.fanout", do=nothing))
    on(remote, flow("workers.remote", do=nothing))
    async with oke("workers", database_url=pg_db):
        pass  # records its bindings, as a worker deployment would
    on(jobs, flow("workers.jobs", do=nothing))
    here = [b for b in current_bindings() if b.trigger is jobs]
    targets = [(jobs, "jobs"), (fanout, "fanout"), (remote, "remote"), (status, "status")]
    stored: list[str] = []
    async with oke("shop", database_url=pg_db, bindings=here) as app:
        for round_ in range(2):
            for sig, _name in targets:
                stored.append(await app.emit(sig, {"round": round_, "before": True}))
            async with pg_down(pg, mode=("fast", "immediate")[round_]):
                for sig, name in targets:
                    with pytest.raises(StoreUnavailable) as err:
                        await app.emit(sig, {"round": round_, "during": True})
                    assert f'emit("{name}")' in one_line(err.value)
            for sig, _name in targets:  # at once, no restart of the app
                stored.append(await app.emit(sig, {"round": round_, "after": True}))
    rows = await fetch(pg_db, "SELECT payload FROM oke_messages UNION ALL SELECT payload FROM oke_tape_events")
    payloads = [json.loads(p) for (p,) in rows]
    assert len(payloads) == 16 and not [p for p in payloads if p.get("during")], payloads
    assert len(stored) == len(set(stored)) == 16


@pytest.mark.postgres
async def test_concurrent_live_emits_while_down_all_raise_then_share_a_transaction(pg: PgCluster, pg_db: str):
    """Live emits are group-committed: every caller waiting on a batch the outage hit gets the
    StoreUnavailable one emit gets, and once the server is back the next batch commits."""
    status = signal.live("status", optional=True)
    async with oke("shop", database_url=pg_db) as app:
        before = await app.emit(status, {"before": True})
        async with pg_down(pg):
            results = await asyncio.gather(*(app.emit(status, {"during": i}) for i in range(20)),
                                           return_exceptions=True)
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        for r in results:
            text = one_line(r)
            assert 'emit("status")' in text and "did not confirm the append" in text, text
        after = await asyncio.gather(*(app.emit(status, {"after": i}) for i in range(20)))
    assert [int(i.split(".")[1]) for i in [before, *after]] == list(range(1, 22))
    rows = await fetch(pg_db, "SELECT payload FROM oke_tape_events ORDER BY seq")
    assert [json.loads(p) for (p,) in rows] == [{"before": True}] + [{"after": i} for i in range(20)]


async def _sse_reader(client: httpx.AsyncClient, url: str, frames: list[dict[str, str]],
                      opened: list[float]) -> None:
    """One connection for the whole test: every frame it carries, heartbeats included."""
    async with client.stream("GET", url) as response:
        assert response.status_code == 200
        opened.append(time.monotonic())
        current: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line == "":
                frames.append(current or {"comment": ""})
                current = {}
            elif line.startswith(":"):
                current.setdefault("comment", "")
            else:
                field, _, value = line.partition(": ")
                current[field] = value
    frames.append({"closed": ""})


@pytest.mark.postgres
async def test_sse_stream_survives_a_postgres_restart(pg: PgCluster, pg_db: str):
    status = signal.live("status")
    on(http.live(status).public())
    app = oke("shop", database_url=pg_db, sse_heartbeat_s=0.3)
    other = oke("elsewhere", database_url=pg_db)  # another emitter (not serving): reaches us by NOTIFY
    port = free_port()
    async with app, other, httpx.AsyncClient(timeout=None) as client:
        server = asyncio.create_task(app.serve(port=port, concurrency=1))
        await wait_listening(port)
        frames: list[dict[str, str]] = []
        opened: list[float] = []
        reader = asyncio.create_task(_sse_reader(client, f"http://127.0.0.1:{port}/_oke/live/status",
                                                 frames, opened))

        def events() -> list[dict[str, str]]:
            return [f for f in frames if "data" in f]

        for i in range(5):
            await app.emit(status, {"i": i})
        await until(lambda: len(events()) == 5, 10, "events before the outage")

        async with pg_down(pg):
            during_from = len(frames)
            await asyncio.sleep(1.5)
            assert len(frames) - during_from >= 2, "no heartbeats while the database was down"
            # a new stream while the store is away gets a clear 503, not a 500 with a traceback
            response = await client.get(f"http://127.0.0.1:{port}/_oke/live/status")
            assert response.status_code == 503, (response.status_code, response.text)
            assert response.json()["error"]["code"] == "StoreUnavailable"
            assert response.headers["retry-after"] == "1"
            # and the Python client (auto_resubscribe) retries a 503 like a drop: it replays the tape once it can
            late_events: list[Any] = []

            async def follow() -> None:
                async for event in Client(f"http://127.0.0.1:{port}").stream(status, auto_resubscribe=True):
                    late_events.append(event)

            late = asyncio.create_task(follow())
            await asyncio.sleep(0.3)
            assert not late.done(), late

        listener = app.store._listener  # the LISTEN connection came back by itself
        await until(lambda: listener is not None and listener.ready.is_set(), 10, "LISTEN reconnected")
        back = time.monotonic()
        for i in range(5, 10):
            await app.emit(status, {"i": i})
        for i in range(10, 15):
            await other.emit(status, {"i": i})
        await until(lambda: len(events()) == 15, 15, "every event after the restart")
        assert time.monotonic() - back < 5
        await asyncio.sleep(0.5)  # nothing more (no event twice)

        await until(lambda: len(late_events) == 15, 15, "the late client's replay")
        assert [e.data["i"] for e in late_events] == list(range(15))
        late.cancel()
        got = events()
        assert [json.loads(f["data"])["i"] for f in got] == list(range(15))
        seqs = [int(f["id"].split(".")[1]) for f in got]
        assert seqs == sorted(set(seqs))
        assert len(opened) == 1 and "closed" not in frames[-1], "the stream was dropped"
        await app.stop()
        await asyncio.wait_for(server, 20)
        await asyncio.wait_for(reader, 10)
        assert frames[-2].get("data") == "[DONE]"


@pytest.mark.postgres
async def test_console_and_cli_while_postgres_is_down(pg: PgCluster, pg_db: str):
    from okconsole.app import ConsoleApp

    jobs = signal.once("jobs", optional=True)
    async with oke("shop", database_url=pg_db, bindings=[]) as app:
        await app.emit(jobs, {"n": 1})
    console = ConsoleApp(pg_db, refresh_s=0.2)

    def status() -> str:
        try:
            return str(console.screen.query_one("#status").render())
        except Exception:
            return ""

    async with console.run_test(size=(140, 40)) as pilot:
        async def wait(predicate: Any, what: str, timeout: float = 15) -> None:
            deadline = time.monotonic() + timeout
            while not predicate():
                assert time.monotonic() < deadline, f"{what}; status line: {status()!r}"
                await pilot.pause(0.1)

        await wait(lambda: " ok" in status(), "the overview loads")
        async with pg_down(pg):
            await wait(lambda: "store unreachable" in status(), "'store unreachable' shown")
            assert console.store_ok is False
            cli = await asyncio.to_thread(
                subprocess.run, [*okconsole_cmd(), "stats", "--db", pg_db], capture_output=True, text=True,
                timeout=60)
            assert cli.returncode == 1, (cli.returncode, cli.stdout, cli.stderr)
            lines = cli.stderr.strip().splitlines()
            assert len(lines) == 1 and str(pg.port) in lines[0], cli.stderr
            assert "Traceback" not in cli.stderr
        await wait(lambda: " ok" in status() and "unreachable" not in status(), "recovered on its own")
        assert console.store_ok is True


async def test_metrics_while_postgres_is_down_serve_the_process_counters(pg: PgCluster, pg_db: str):
    """A scrape during an outage answers 200 with oke_store_up 0 and this process's handler
    counters (a monitoring gap would hide the outage itself); the store's gauges come back after."""
    from prometheus_client.parser import text_string_to_metric_families

    jobs = signal.once("jobs")
    on(jobs, flow("workers.jobs", do=lambda _p, _fx: None))
    on(http.metrics().public())

    def samples(text: str) -> dict[tuple[str, str], float]:
        return {(s.name, s.labels.get("outcome", s.labels.get("status", ""))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples
                if s.labels.get("signal", "jobs") == "jobs"}

    app = oke("shop", database_url=pg_db)
    async with app, serving(app) as base, httpx.AsyncClient(timeout=20) as client:
        await app.emit(jobs, {"n": 1})
        for _ in range(100):  # handled and settled
            if samples((await client.get(f"{base}/_oke/metrics")).text).get(("oke_messages", "delivered")) == 1:
                break
            await asyncio.sleep(0.05)
        async with pg_down(pg):
            down = await client.get(f"{base}/_oke/metrics")
        await until(lambda: _server_up(pg), 30, "the server back")
        for _ in range(100):
            up = await client.get(f"{base}/_oke/metrics")
            if samples(up.text).get(("oke_store_up", "")) == 1:
                break
            await asyncio.sleep(0.1)
    assert down.status_code == 200
    during = samples(down.text)
    assert during[("oke_store_up", "")] == 0
    assert during[("oke_handled_total", "delivered")] == 1
    assert ("oke_messages", "delivered") not in during
    assert samples(up.text)[("oke_messages", "delivered")] == 1


# --------------------------------------------------------------------------- SQLite

def hold_write_lock(path: str, seconds: float) -> subprocess.Popen:
    """Another process takes SQLite's write lock (BEGIN IMMEDIATE) and sleeps holding it."""
    code = (f"import sqlite3, sys, time\n"
            f"c = sqlite3.connect({path!r}, isolation_level=None)\n"
            f"c.execute('BEGIN IMMEDIATE')\n"
            f"print('held', flush=True)\n"
            f"time.sleep({seconds})\n"
            f"c.execute('COMMIT')\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


async def test_sqlite_write_lock_held_by_another_process(tmp_path: Path):
    path = str(tmp_path / "oke.db")
    rec = Recorder()
    async with oke("shop", database_url=f"sqlite+aiosqlite:///{path}", lease_ms=10_000,
                   busy_timeout_ms=300) as app:
        claims = CountingClaims(app)
        before = list(range(20))
        for n in before:
            await app.emit(rec.signal, {"n": n, "fail_first": n % 10 == 3})
        runner = asyncio.create_task(app.run(concurrency=8))
        await until(lambda: rec.all_done(before), 10, "the first batch")
        slow = list(range(20, 28))  # finish while the lock is held: their settles wait for it
        for n in slow:
            await app.emit(rec.signal, {"n": n, "sleep": 0.5, "fail_first": n == 22})
        queued = list(range(28, 40))  # pending behind the slow ones: claimed after the lock goes
        for n in queued:
            await app.emit(rec.signal, {"n": n})
        await until(lambda: all(rec.started[n] for n in slow), 10, "slow handlers started")

        holder = await asyncio.to_thread(hold_write_lock, path, OUTAGE_S)
        try:
            claims_at, cpu_at = claims.count, tree_cpu_s()  # the writer process's too
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as err:  # the lock outlasts the busy timeout
                await app.emit(rec.signal, {"n": 999})
            waited = time.monotonic() - started
            text = one_line(err.value)
            assert 'emit("jobs")' in text and "locked" in text, text
            assert 0.25 <= waited < 2.0, waited
            await asyncio.to_thread(holder.wait, 30)
            claims_during = claims.count - claims_at
            cpu_during = tree_cpu_s() - cpu_at
        finally:
            holder.kill()
        # each attempt waits out the busy timeout, then backs off: no spinning on the lock
        assert claims_during <= 10, claims_during
        assert cpu_during < 0.5 * OUTAGE_S, cpu_during

        after = list(range(40, 50))
        for n in after:
            await app.emit(rec.signal, {"n": n})
        everything = before + slow + queued + after
        await until(lambda: rec.all_done(everything), 10, "every message handled")
        await asyncio.sleep(0.3)
        await app.stop()
        await asyncio.wait_for(runner, 15)
        await settled_state(app, rec, everything)


async def test_sqlite_emit_waits_for_a_lock_shorter_than_the_busy_timeout(tmp_path: Path):
    path = str(tmp_path / "oke.db")
    jobs = signal.once("jobs", optional=True)
    async with oke("shop", database_url=f"sqlite+aiosqlite:///{path}", bindings=[],
                   busy_timeout_ms=5_000) as app:
        holder = await asyncio.to_thread(hold_write_lock, path, 0.8)
        try:
            started = time.monotonic()
            await app.emit(jobs, {"n": 1})  # waits for the lock, then stores
            assert time.monotonic() - started >= 0.5
        finally:
            holder.wait(10)
        assert await status_counts(app) == {"pending": 1}


async def test_sqlite_concurrent_live_emits_behind_a_held_lock_all_raise(tmp_path: Path):
    path = str(tmp_path / "oke.db")
    status = signal.live("status", optional=True)
    async with oke("shop", database_url=f"sqlite+aiosqlite:///{path}", busy_timeout_ms=300) as app:
        await app.emit(status, {"before": True})
        holder = await asyncio.to_thread(hold_write_lock, path, 1.5)
        try:
            results = await asyncio.gather(*(app.emit(status, {"during": i}) for i in range(20)),
                                           return_exceptions=True)
        finally:
            await asyncio.to_thread(holder.wait, 30)
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        for r in results:
            text = one_line(r)
            assert 'emit("status")' in text and "did not confirm the append" in text and "locked" in text, text
        after = await asyncio.gather(*(app.emit(status, {"after": i}) for i in range(5)))
    assert [int(i.split(".")[1]) for i in after] == list(range(2, 7))


@pytest.mark.parametrize("how", ["moved_away_and_back", "removed"])
async def test_sqlite_store_directory_disappears(tmp_path: Path, how: str):
    home = tmp_path / "store"
    path = str(home / "oke.db")
    rec = Recorder()
    async with oke("shop", database_url=f"sqlite+aiosqlite:///{path}", lease_ms=10_000) as app:
        claims = CountingClaims(app)
        before = list(range(10))
        for n in before:
            await app.emit(rec.signal, {"n": n})
        runner = asyncio.create_task(app.run(concurrency=4))
        await until(lambda: rec.all_done(before), 10, "the first batch")
        slow = list(range(10, 14))
        for n in slow:
            await app.emit(rec.signal, {"n": n, "sleep": 0.5})
        await until(lambda: all(rec.started[n] for n in slow), 10, "slow handlers started")

        if how == "removed":
            shutil.rmtree(home)
        else:
            home.rename(tmp_path / "elsewhere")
        claims_at, cpu_at = claims.count, tree_cpu_s()  # the writer process's too
        for _ in range(3):
            with pytest.raises(StoreUnavailable) as err:  # never an id for a message in a ghost file
                await app.emit(rec.signal, {"n": 999})
            text = one_line(err.value)
            assert 'emit("jobs")' in text and path in text, text
        await asyncio.sleep(OUTAGE_S)
        assert not home.exists(), "the engine recreated the store somewhere nobody expects"
        assert claims.count - claims_at <= 12, claims.count - claims_at
        assert tree_cpu_s() - cpu_at < 0.5 * OUTAGE_S
        assert not runner.done()

        if how == "removed":  # gone for good: workers keep backing off until stopped
            await app.stop()
            await asyncio.wait_for(runner, 20)
            return
        (tmp_path / "elsewhere").rename(home)  # back: the same file, the work continues
        after = list(range(14, 20))
        for n in after:
            await app.emit(rec.signal, {"n": n})
        everything = before + slow + after
        await until(lambda: rec.all_done(everything), 10, "every message handled")
        await asyncio.sleep(0.3)
        await app.stop()
        await asyncio.wait_for(runner, 15)
        await settled_state(app, rec, everything)


def _chattr(flag: str, *paths: str) -> bool:
    if not shutil.which("chattr"):
        return False
    return subprocess.run(["chattr", flag, *paths], capture_output=True).returncode == 0


@pytest.mark.parametrize("what", ["files", "directory"])
async def test_sqlite_store_turns_read_only(tmp_path: Path, what: str):
    """The store turns unwritable under the running app (`chattr +i`, which binds root and open file
    descriptors too, like a filesystem gone read-only), then writable again.

    `files`: the database and its WAL: writes fail with a disk I/O error, an outage.
    `directory`: only the directory: SQLite in WAL mode needs no new file while it runs, so the app
    simply keeps working (nothing to recover from)."""
    home = tmp_path / "store"
    path = str(home / "oke.db")
    rec = Recorder()
    async with oke("shop", database_url=f"sqlite+aiosqlite:///{path}", lease_ms=10_000) as app:
        claims = CountingClaims(app)
        before = list(range(10))
        for n in before:
            await app.emit(rec.signal, {"n": n})
        runner = asyncio.create_task(app.run(concurrency=4))
        await until(lambda: rec.all_done(before), 10, "the first batch")
        slow = list(range(10, 14))
        for n in slow:
            await app.emit(rec.signal, {"n": n, "sleep": 0.5, "fail_first": n == 12})
        queued = list(range(14, 20))
        for n in queued:
            await app.emit(rec.signal, {"n": n})
        await until(lambda: all(rec.started[n] for n in slow), 10, "slow handlers started")

        # not -shm: it is memory-mapped, and writing an immutable mapping is a SIGBUS
        targets = [path, path + "-wal"] if what == "files" else [str(home)]
        if not _chattr("+i", *targets):
            await app.stop()
            await runner
            pytest.skip("chattr +i is not available here (needs CAP_LINUX_IMMUTABLE on ext4/xfs)")
        during: list[int] = []
        try:
            claims_at, cpu_at = claims.count, tree_cpu_s()  # the writer process's too
            if what == "files":
                with pytest.raises(StoreUnavailable) as err:
                    await app.emit(rec.signal, {"n": 999})
                text = one_line(err.value)
                assert 'emit("jobs")' in text and "I/O" in text, text
                await asyncio.sleep(OUTAGE_S)
                assert claims.count - claims_at <= 12, claims.count - claims_at
                assert tree_cpu_s() - cpu_at < 0.5 * OUTAGE_S
            else:
                during = list(range(100, 105))
                for n in during:
                    await app.emit(rec.signal, {"n": n})
                await until(lambda: rec.all_done(slow + queued + during), 10, "work in a read-only directory")
        finally:
            _chattr("-i", *targets)
        after = list(range(20, 26))
        for n in after:
            await app.emit(rec.signal, {"n": n})
        everything = before + slow + queued + during + after
        await until(lambda: rec.all_done(everything), 10, "every message handled")
        await asyncio.sleep(0.3)
        await app.stop()
        await asyncio.wait_for(runner, 15)
        await settled_state(app, rec, everything)


async def test_console_on_a_sqlite_store_that_moves_away_and_back(tmp_path: Path):
    from okconsole.app import ConsoleApp

    home = tmp_path / "store"
    url = f"sqlite+aiosqlite:///{home / 'oke.db'}"
    jobs = signal.once("jobs", optional=True)
    async with oke("shop", database_url=url, bindings=[]) as app:
        await app.emit(jobs, {"n": 1})
    console = ConsoleApp(url, refresh_s=0.2)
    async with console.run_test(size=(140, 40)) as pilot:
        async def wait(predicate: Any, what: str, timeout: float = 10) -> None:
            deadline = time.monotonic() + timeout
            while not predicate():
                assert time.monotonic() < deadline, what
                await pilot.pause(0.1)

        await wait(lambda: console.store_ok is True, "the overview loads")
        home.rename(tmp_path / "elsewhere")
        await wait(lambda: console.store_ok is False, "'store unreachable' shown")
        assert "store unreachable" in str(console.screen.query_one("#status").render())
        await asyncio.sleep(0.6)  # several refreshes while it is away
        assert not home.exists(), "the console recreated an empty store in its place"
        (tmp_path / "elsewhere").rename(home)
        await wait(lambda: console.store_ok is True, "recovered on its own")
        table = console.screen.query_one("#signals")
        await wait(lambda: table.row_count == 1, "the same store's signals")
