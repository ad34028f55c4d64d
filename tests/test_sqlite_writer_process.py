"""The SQLite store's writer process (engine/store/sqlite/process.py, child.py), from outside.

What must hold: it starts with the first hot write (never for a store only read), ends with the
store and with its parent (SIGKILL included); when it is killed, the calls it owed fail as an
outage and the next call gets a new one, and a drain it dies in loses nothing; Ctrl-C (SIGINT to
the process group) does not end it under the parent's graceful stop; writes of the store's own
writer thread (controls) pause it and both land; a store used from a second event loop gets a
writer of that loop. The in-process sync semantics are in test_sqlite_wal_sync.py.
"""
from __future__ import annotations

import asyncio
import os
import signal as os_signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from engine import StoreUnavailable, flow, oke, on, ops, signal
from engine.store import make_store
from prockit import children, until
from workers.db import scalar

REPO = Path(__file__).resolve().parents[1]


def writer_pids() -> list[int]:
    """This process's children running the SQLite writer."""
    return [pid for pid in children() if is_writer(pid)]


def is_writer(pid: int) -> bool:
    try:
        return b"engine.store.sqlite.child" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False  # ended meanwhile


def alive(pid: int) -> bool:
    """Running (a zombie, ended but not yet reaped, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def ended(pid: int, what: str) -> None:
    async def gone() -> bool:
        return not alive(pid)

    await until(gone, what, timeout=20)


async def test_the_writer_process_starts_with_the_first_emit_and_ends_with_the_store(sqlite_url):
    jobs = signal.once("wp.jobs", optional=True)
    async with oke("t", database_url=sqlite_url) as app:
        await ops.stats(app.store)  # reads and the store's own writes (the schema) start none
        assert writer_pids() == []
        await app.emit(jobs, {"n": 1})
        (pid,) = writer_pids()
        await app.emit(jobs, {"n": 2})
        assert writer_pids() == [pid]  # one per store, kept
    assert not alive(pid)
    assert writer_pids() == []
    assert await scalar(sqlite_url, "SELECT count(*) FROM oke_messages") == 2


async def test_the_thread_writer_starts_no_process(sqlite_url):
    jobs = signal.once("wp.thread", optional=True)
    async with oke("t", database_url=sqlite_url, sqlite_writer="thread") as app:
        await app.emit(jobs, {"n": 1})
        assert writer_pids() == []
    assert await scalar(sqlite_url, "SELECT count(*) FROM oke_messages") == 1


def test_a_writer_that_is_not_process_or_thread_is_refused_before_anything_starts(sqlite_url):
    with pytest.raises(ValueError, match=r"sqlite_writer=.*'process' or 'thread', got 'fork'"):
        oke("t", database_url=sqlite_url, sqlite_writer="fork")
    with pytest.raises(ValueError, match=r"sqlite_writer: 'process' or 'thread', got 'Process'"):
        make_store(sqlite_url, sqlite_writer="Process")
    assert not Path(sqlite_url.split("///", 1)[1]).exists()


async def test_a_call_in_flight_when_the_writer_dies_is_an_outage_and_the_next_emit_gets_a_new_writer(sqlite_url):
    """The writer waits for another connection's write lock; killed meanwhile, its emit fails with
    StoreUnavailable (nothing was written), and the next emit is written by a new writer."""
    jobs = signal.once("wp.kill", optional=True)
    async with oke("t", database_url=sqlite_url) as app:
        await app.emit(jobs, {"n": 1})
        (pid,) = writer_pids()
        blocker = sqlite3.connect(sqlite_url.split("///", 1)[1], isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            emitting = asyncio.create_task(app.emit(jobs, {"n": 2}))
            await asyncio.sleep(0.3)
            assert not emitting.done()  # waiting for the lock, in the writer process
            os.kill(pid, os_signal.SIGKILL)
            with pytest.raises(StoreUnavailable, match=r"writer process \(pid \d+\) ended"):
                await asyncio.wait_for(emitting, 10)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        await ended(pid, "the killed writer to be reaped")
        await app.emit(jobs, {"n": 3})
        (new_pid,) = writer_pids()
        assert new_pid != pid
    assert await scalar(sqlite_url, "SELECT json_group_array(json_extract(payload, '$.n')) FROM oke_messages") == "[1,3]"


async def test_a_drain_whose_writer_is_killed_twice_delivers_every_message(sqlite_url):
    """SIGKILL of the writer process while 32 handlers drain 3,000 messages, twice: the workers
    back off and go on with a new writer; a claim the dead writer had committed is reclaimed after
    its lease. Every message ends delivered, each handled at least once."""
    jobs = signal.once("wp.drain", retries=3)
    handled: set[int] = set()
    n = 3_000

    @on(jobs)
    @flow("w.wp.drain")
    async def handle(payload: dict[str, int], fx: Any) -> None:
        handled.add(payload["n"])
        await asyncio.sleep(0.001)

    async with oke("t", database_url=sqlite_url, lease_ms=1_000) as app:
        await app.emit_many(jobs, [{"n": i} for i in range(n)])
        draining = asyncio.create_task(app.drain(concurrency=32))
        for share in (0.2, 0.5):
            await until(lambda s=share: _at_least(handled, s * n), f"{share:.0%} handled")
            for pid in writer_pids():
                os.kill(pid, os_signal.SIGKILL)
        await asyncio.wait_for(draining, 60)

        async def all_delivered() -> bool:
            await app.drain(concurrency=32)  # what the killed writers had claimed, after its lease
            return await scalar(sqlite_url, "SELECT count(*) FROM oke_messages WHERE status = 'delivered'") == n

        await until(all_delivered, "every message delivered", timeout=60, every=0.5)
    assert handled == set(range(n))


async def _at_least(handled: set[int], count: float) -> bool:
    return len(handled) >= count


async def test_controls_during_a_drain_pause_the_writer_and_both_land(sqlite_url):
    """Pauses and resumes (the store's writer thread) while the writer process drains: each lands,
    and the drain still delivers everything."""
    jobs = signal.once("wp.controls")
    other = signal.once("wp.other", optional=True)
    n = 2_000

    @on(jobs)
    @flow("w.wp.controls")
    async def handle(payload: Any, fx: Any) -> None:
        return None

    async with oke("t", database_url=sqlite_url) as app:
        await app.emit_many(jobs, list(range(n)))
        draining = asyncio.create_task(app.drain(concurrency=32))
        for _ in range(10):
            await ops.pause(app.store, other.name, actor="test", reason="during a drain")
            await ops.resume(app.store, other.name, actor="test", reason="during a drain")
        await asyncio.wait_for(draining, 60)
    assert await scalar(sqlite_url, "SELECT count(*) FROM oke_messages WHERE status = 'delivered'") == n
    assert await scalar(sqlite_url, "SELECT count(*) FROM oke_audit WHERE reason = 'during a drain'") == 20


async def test_ctrl_c_to_the_group_leaves_the_writer_running(sqlite_url):
    """SIGINT reaches every process of a terminal's group; the writer ignores it, since the parent
    may still settle its last outcomes while it stops."""
    jobs = signal.once("wp.sigint", optional=True)
    async with oke("t", database_url=sqlite_url) as app:
        await app.emit(jobs, {"n": 1})
        (pid,) = writer_pids()
        os.kill(pid, os_signal.SIGINT)
        await asyncio.sleep(0.3)
        await app.emit(jobs, {"n": 2})
        assert writer_pids() == [pid]
    assert await scalar(sqlite_url, "SELECT count(*) FROM oke_messages") == 2


def test_the_writer_process_ends_when_its_parent_is_killed(sqlite_url, tmp_path):
    """A parent SIGKILLed mid-run (no close, no cleanup) while it emits without pause: its writer
    sees the socket close (or reset, with answers unread) and exits quietly, so no orphan keeps the
    store file open and no traceback lands in the app's log (the writer shares its stderr)."""
    script = tmp_path / "parent.py"
    # The parent sends emits its writer must wait for (another connection holds the write lock),
    # then blocks its loop: the answers, written once the lock goes, stay unread in its socket, so
    # its death resets the writer's end instead of closing it.
    script.write_text(textwrap.dedent(f"""
        import asyncio, sqlite3, sys, threading, time
        sys.path.insert(0, {str(REPO)!r})
        from engine import oke, signal
        jobs = signal.once("wp.orphan", optional=True)

        async def main():
            async with oke("t", database_url={sqlite_url!r}) as app:
                await app.emit(jobs, 0)
                blocker = sqlite3.connect({sqlite_url.split("///", 1)[1]!r}, isolation_level=None,
                                          check_same_thread=False)
                blocker.execute("BEGIN IMMEDIATE")
                emits = [asyncio.create_task(app.emit(jobs, n)) for n in range(1, 21)]
                await asyncio.sleep(0.3)
                threading.Timer(0.3, lambda: blocker.execute("ROLLBACK")).start()
                print("ready", flush=True)
                time.sleep(60)

        asyncio.run(main())
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # the lock is gone and the writer has answered: unread
        writers = [pid for pid in children(parent.pid) if is_writer(pid)]
        assert len(writers) == 1
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while alive(writers[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(writers[0]), "the writer outlived its SIGKILLed parent"
        assert parent.stderr is not None
        assert "Traceback" not in parent.stderr.read()  # the writer's, after its parent died
    finally:
        parent.kill()
        parent.wait(10)


async def test_a_store_used_from_a_second_event_loop_gets_a_writer_of_that_loop(sqlite_url):
    """A store kept across `asyncio.run` calls: the first loop's writer is left (it ends), and the
    second loop's emits are written by one of its own."""
    store = make_store(sqlite_url)

    def emit_on_a_new_loop(n: int) -> int:
        async def run() -> int:
            if n == 1:
                await store.open()
            await store.enqueue([_row(n)])
            (pid,) = writer_pids()
            return pid

        return asyncio.run(run())

    first = await asyncio.to_thread(emit_on_a_new_loop, 1)
    second = await asyncio.to_thread(emit_on_a_new_loop, 2)
    assert second != first
    await ended(first, "the first loop's writer to end")
    await store.close()
    assert not alive(second)
    assert await scalar(sqlite_url, "SELECT count(*) FROM oke_messages") == 2


def _row(n: int) -> Any:
    from engine.ids import new_id, now_ms
    from engine.store import NewMessage

    return NewMessage(new_id("msg_"), "wp.loops", "wp.loops", None, None, str(n), 0, False, None, now_ms())


@pytest.mark.parametrize("executable, says", [
    ("/nonexistent/python", r"cannot start the SQLite writer process"),
    ("/bin/false", r"writer process \(pid \d+\) ended"),
], ids=["missing", "exits at once"])
async def test_a_writer_process_that_cannot_start_is_an_outage_that_names_the_thread_writer(
        sqlite_url, monkeypatch, executable, says):
    """An interpreter that cannot start the child (a frozen executable, a missing binary): the emit
    fails with StoreUnavailable naming the way out, and the thread writer works there."""
    jobs = signal.once("wp.nostart", optional=True)
    monkeypatch.setattr(sys, "executable", executable)
    async with oke("t", database_url=sqlite_url) as app:
        with pytest.raises(StoreUnavailable, match=says + r".*sqlite_writer='thread'"):
            await asyncio.wait_for(app.emit(jobs, {"n": 1}), 10)
    async with oke("t", database_url=sqlite_url, sqlite_writer="thread") as app:
        await app.emit(jobs, {"n": 2})
    assert await scalar(sqlite_url, "SELECT json_group_array(json_extract(payload, '$.n')) FROM oke_messages") == "[2]"
