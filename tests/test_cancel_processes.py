"""`okconsole cancel` of a message whose handler runs in ANOTHER process (a real app process,
tests/workers/once_worker.py mode "slow"): the holder cancels the handler within 2 s, the attempt is
recorded Cancelled, the message ends dead and a replay runs it again; `--json` reports it under
`requested` until the holder confirms; a holder that is gone leaves it to the lease. On SQLite with
the writer thread and the writer process, and on PostgreSQL (where the request is NOTIFYed)."""

from __future__ import annotations

import json
import os
import signal as signals
import time

import pytest
from consolekit import run_okconsole

from engine import oke, ops, signal
from engine.store import make_store
from prockit import WorkerProcs, until

SHAPES = ("sqlite-thread", "sqlite-process", "postgres")


@pytest.fixture(params=SHAPES)
def shape(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(database url, the SQLite writer the worker process opens it with)."""
    if request.param == "postgres":
        return request.getfixturevalue("pg_url"), "process"
    return request.getfixturevalue("sqlite_url"), request.param.removeprefix("sqlite-")


@pytest.fixture
def procs(tmp_path):
    group = WorkerProcs(tmp_path)
    try:
        yield group
    finally:
        group.kill_all()


def _events(procs: WorkerProcs, what: str, msg: str, worker: str | None = None) -> list[list[str]]:
    return [
        line
        for line in procs.lines("events")
        if line[0] == what and line[1] == msg and (worker is None or line[3] == worker)
    ]


def _logged(procs: WorkerProcs, what: str, msg: str, worker: str | None = None):
    async def check() -> bool:
        return bool(_events(procs, what, msg, worker))

    return check


def _cancel_json(url: str, msg: str, reason: str = "wrong recipient") -> dict:
    done = run_okconsole("cancel", "slow", msg, "--db", url, "--yes", "--json", "--reason", reason, "--actor", "ana")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def _running_message(procs: WorkerProcs, url: str, writer: str, lease_ms: int = 30_000):
    """A worker process running the handler of one "slow" message (it sleeps an hour): (store, id)."""
    procs.start("slow", "w0", url, lease_ms=lease_ms, concurrency=2, sqlite_writer=writer)
    await procs.ready("w0")
    store = make_store(url)
    await store.open()
    slow = signal.once("slow", retries=3)
    async with oke("operator", database_url=url) as app:
        msg = await app.emit(slow, {"sleep": 3600})
    await until(_logged(procs, "start", msg), "the worker to start the handler", timeout=30)
    return store, msg


async def test_cancel_stops_a_handler_in_another_process_within_two_seconds(shape, procs):
    url, writer = shape
    store, msg = await _running_message(procs, url, writer)
    try:
        asked = time.time()
        out = _cancel_json(url, msg)
        assert (out["cancelled"], out["ids"], out["requested"], out["skipped"]) == (0, [], [msg], [])
        await until(_logged(procs, "cancelled", msg), "the handler to be cancelled", timeout=10)
        [[_, _, attempt, _, at_ms]] = _events(procs, "cancelled", msg)
        assert attempt == "1" and int(at_ms) / 1000 - asked < 2.0
        assert _events(procs, "finally", msg) and not _events(procs, "end", msg)  # its cleanup ran

        async def dead() -> bool:
            return (await ops.show(store, msg)).status == "dead"

        await until(dead, "the message to end dead", timeout=10)
        detail = await ops.show(store, msg)
        assert [(f.code, f.message, f.attempt) for f in detail.failures] == [("Cancelled", "wrong recipient", 1)]
        again = _cancel_json(url, msg)  # confirmed: no longer requested
        assert (again["requested"], again["skipped"]) == ([], [{"id": msg, "status": "dead"}])

        replayed = await ops.replay(store, "slow", [msg], actor="ana", payload={"sleep": 0})
        assert replayed.replayed == 1

        async def delivered() -> bool:
            return (await ops.show(store, msg)).status == "delivered"

        await until(delivered, "the replay to run to its end", timeout=20)
        await procs.stop()
    finally:
        await store.close()


@pytest.mark.long
async def test_a_gone_holder_leaves_it_to_the_lease(shape, procs):
    """SIGKILLed mid-handler: a cancel is `requested` (and stays so: nobody confirms) while the lease
    lives; once it has expired, a cancel ends the message as it ends a pending one."""
    url, writer = shape
    store, msg = await _running_message(procs, url, writer, lease_ms=10_000)  # outlives two CLI runs
    try:
        os.kill(procs.procs["w0"].pid, signals.SIGKILL)
        procs.procs["w0"].wait(10)
        assert _cancel_json(url, msg)["requested"] == [msg]
        assert _cancel_json(url, msg)["requested"] == [msg]  # still: the holder never confirms
        assert (await ops.show(store, msg)).status == "inflight"

        async def ended() -> bool:
            return _cancel_json(url, msg)["ids"] == [msg]

        await until(ended, "a cancel after the lease to end the message", timeout=20, every=0.5)
        detail = await ops.show(store, msg)
        assert detail.status == "dead" and [f.code for f in detail.failures] == ["Cancelled"]
    finally:
        await store.close()


async def test_the_next_holder_of_a_message_whose_holder_is_gone_stops_it(shape, procs):
    """The request stands for the message: the worker that takes it over after the lease stops it too."""
    url, writer = shape
    store, msg = await _running_message(procs, url, writer, lease_ms=3_000)
    try:
        os.kill(procs.procs["w0"].pid, signals.SIGKILL)
        procs.procs["w0"].wait(10)
        assert _cancel_json(url, msg, reason="stop it")["requested"] == [msg]
        procs.start("slow", "w1", url, lease_ms=6_000, sqlite_writer=writer)
        await procs.ready("w1")
        await until(_logged(procs, "cancelled", msg, "w1"), "w1 to stop it", 30)

        async def dead() -> bool:
            return (await ops.show(store, msg)).status == "dead"

        await until(dead, "the message to end dead", timeout=10)
        detail = await ops.show(store, msg)
        # attempt 2, or a later one of w1's on a machine slow enough to lose a lease
        assert {(f.code, f.message) for f in detail.failures} == {("Cancelled", "stop it")}
        assert detail.failures[-1].attempt >= 2 and detail.status == "dead"
        await procs.stop()
    finally:
        await store.close()
