"""A pause issued by one process holds back a worker in ANOTHER process within 1 s, and a resume
lets it go on (SPEC §11), on SQLite and PostgreSQL. The worker is a real subprocess
(tests/workers/once_worker.py, mode "bulk", which records each message it handles)."""
from __future__ import annotations

import asyncio
import time

import pytest

from engine import flow, oke, ops, signal
from engine.flows import Binding
from prockit import WorkerProcs, until


@pytest.fixture
def procs(tmp_path):
    group = WorkerProcs(tmp_path)
    try:
        yield group
    finally:
        group.kill_all()


def _never(payload, fx):
    raise AssertionError("the emitting app runs no workers")


async def test_a_pause_from_one_process_stops_a_worker_in_another_within_a_second(db_url, procs):
    bulk = signal.once("bulk")
    procs.start("bulk", "w0", db_url)
    await procs.ready("w0")
    async with oke("operator", database_url=db_url, bindings=[Binding(bulk, flow("workers.bulk", do=_never))]) as app:
        first = await app.emit(bulk, {"n": 0})
        await until(lambda: _handled(procs, first), "the worker to take a message before the pause", timeout=30)

        await ops.pause(app.store, "bulk", actor="ana", reason="incident")
        paused_at = time.monotonic()
        await asyncio.sleep(1.0)  # SPEC: no process claims from at most 1 s after the command
        held = [await app.emit(bulk, {"n": n}) for n in range(1, 21)]
        await asyncio.sleep(1.5)  # the worker had every chance to take them
        assert [line[0] for line in procs.lines("handled-*")] == [first]
        assert [(await ops.show(app.store, i)).status for i in held] == ["pending"] * 20  # stored
        assert time.monotonic() - paused_at < 10

        await ops.resume(app.store, "bulk", actor="ana")
        await until(lambda: _all_handled(procs, held), "the worker to take the held messages after resume", 30)
    await procs.stop()


async def _handled(procs: WorkerProcs, msg_id: str) -> bool:
    return any(line[0] == msg_id for line in procs.lines("handled-*"))


async def _all_handled(procs: WorkerProcs, ids: list[str]) -> bool:
    return set(ids) <= {line[0] for line in procs.lines("handled-*")}
