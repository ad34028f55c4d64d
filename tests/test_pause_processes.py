"""A pause issued by one process holds back a worker in ANOTHER process within 1 s, and a resume
lets it go on, on SQLite and PostgreSQL. The worker is a real subprocess
(tests/workers/once_worker.py, mode "bulk", which records each message it handles)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text

from engine import flow, oke, ops, signal
from engine.flows import Binding
from engine.worker.pausing import PAUSE_TRUST_S
from prockit import WorkerProcs, until


@pytest.fixture
def procs(tmp_path):
    group = WorkerProcs(tmp_path)
    try:
        yield group
    finally:
        group.kill_all()


PAUSE_BY_HAND = "INSERT INTO oke_pauses (signal, paused_at, actor) VALUES ('bulk', 0, 'psql')"  # no NOTIFY


def _never(payload, fx):
    raise AssertionError("the emitting app runs no workers")


@contextlib.asynccontextmanager
async def _operator_after_one_handled(url: str, procs: WorkerProcs) -> AsyncIterator[tuple[Any, Any, str]]:
    """A worker process on signal "bulk" and an operator app beside it, once the worker handled one
    message (so it has read the paused set): (app, the signal, that message's id)."""
    bulk = signal.once("bulk")
    procs.start("bulk", "w0", url)
    await procs.ready("w0")
    async with oke("operator", database_url=url, bindings=[Binding(bulk, flow("workers.bulk", do=_never))]) as app:
        first = await app.emit(bulk, {"n": 0})
        await until(lambda: _handled(procs, first), "the worker to take a message before the pause", timeout=30)
        yield app, bulk, first
    await procs.stop()


async def test_a_pause_from_one_process_stops_a_worker_in_another_within_a_second(db_url, procs):
    async with _operator_after_one_handled(db_url, procs) as (app, bulk, first):
        await ops.pause(app.store, "bulk", actor="ana", reason="incident")
        paused_at = time.monotonic()
        await asyncio.sleep(1.0)  # the promise: no process claims from at most 1 s after the command
        held = [await app.emit(bulk, {"n": n}) for n in range(1, 21)]
        await asyncio.sleep(1.5)  # the worker had every chance to take them
        assert [line[0] for line in procs.lines("handled-*")] == [first]
        assert [(await ops.show(app.store, i)).status for i in held] == ["pending"] * 20  # stored
        assert time.monotonic() - paused_at < 10

        await ops.resume(app.store, "bulk", actor="ana")
        await until(lambda: _all_handled(procs, held), "the worker to take the held messages after resume", 30)


async def test_on_postgres_a_pause_reaches_a_worker_in_another_process_at_commit(pg_url, procs):
    """The pause's NOTIFY makes the worker re-read the paused set before its next claim, so a
    message emitted right after the pause commits is held back, though the worker read the set a
    moment before (without the notice it trusts that read for PAUSE_REFRESH_S)."""
    async with _operator_after_one_handled(pg_url, procs) as (app, bulk, first):
        await ops.pause(app.store, "bulk", actor="ana", reason="incident")
        held = [await app.emit(bulk, {"n": n}) for n in range(3, 13)]  # no wait after the pause
        await asyncio.sleep(1.5)
        assert [line[0] for line in procs.lines("handled-*")] == [first]
        assert [(await ops.show(app.store, i)).status for i in held] == ["pending"] * 10

        await ops.resume(app.store, "bulk", actor="ana")
        await until(lambda: _all_handled(procs, held), "the worker to take the held messages after resume", 30)


async def test_on_postgres_a_pause_written_by_hand_with_sql_holds_within_the_trust_period(pg_url, procs):
    """A row put into oke_pauses with SQL sends no notice: workers see it when they re-read the set
    anyway, at most PAUSE_TRUST_S after their last read."""
    async with _operator_after_one_handled(pg_url, procs) as (app, bulk, first):
        await app.store.write(lambda conn: conn.execute(text(PAUSE_BY_HAND)))
        await asyncio.sleep(PAUSE_TRUST_S + 1.0)
        held = [await app.emit(bulk, {"n": n}) for n in range(1, 6)]
        await asyncio.sleep(1.5)
        assert [line[0] for line in procs.lines("handled-*")] == [first]
        assert [(await ops.show(app.store, i)).status for i in held] == ["pending"] * 5


async def test_on_postgres_a_worker_whose_listen_connection_was_cut_re_reads_the_paused_set(pg_url, procs):
    """Notices sent while the LISTEN connection is down are lost, so a worker that connects again
    re-reads the paused set before its next claim: a pause written by hand with SQL (which sends no
    notice) is seen at once after the cut, not PAUSE_TRUST_S later."""
    async with _operator_after_one_handled(pg_url, procs) as (app, bulk, first):

        def pause_and_cut(conn) -> int:
            conn.execute(text(PAUSE_BY_HAND))
            return conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query LIKE 'LISTEN%'"
                )
            ).scalar_one()

        assert await app.store.write(pause_and_cut) >= 1  # the worker's listener (and ours, if any)
        await asyncio.sleep(1.0)  # it connects again within 0.1 s
        held = [await app.emit(bulk, {"n": n}) for n in range(1, 6)]
        await asyncio.sleep(1.5)
        assert [line[0] for line in procs.lines("handled-*")] == [first]
        assert [(await ops.show(app.store, i)).status for i in held] == ["pending"] * 5


async def _handled(procs: WorkerProcs, msg_id: str) -> bool:
    return any(line[0] == msg_id for line in procs.lines("handled-*"))


async def _all_handled(procs: WorkerProcs, ids: list[str]) -> bool:
    return set(ids) <= {line[0] for line in procs.lines("handled-*")}
