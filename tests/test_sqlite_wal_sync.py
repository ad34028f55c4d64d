"""SQLite durability with the store's own WAL sync (engine/store/sqlite/thread.py, walsync.py).

SQLite runs at synchronous=NORMAL and every commit's WAL is fdatasynced before its call returns:
by the writer thread itself when no other call waits for it, else by the syncer thread beside it
while the writer goes on (one sync for many commits). What must hold: a write (an emit) returns
only after a sync that began after its commit; a claim's handlers start once the claim is
committed (another connection sees it) and while its sync is still running; a drain returns only
after its last outcomes are synced; concurrent writes share syncs; a failed sync is an outage,
never a silent success, for every commit it carried.

The sync is gated by wrapping the real fdatasync (the OS call, not the engine), so a test can hold
a thread inside it and look at what the rest of the engine does meanwhile. That wrapper lives in
this process, so these tests run the writer thread (`sqlite_writer="thread"`); the writer process
runs the same code on its side (engine/store/sqlite/file.py `StoreFile.deliver`), and
test_sqlite_writer_process.py checks what can be seen of it from outside.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import threading
import time
from typing import Any, Callable, Iterator

import pytest

import engine.store.sqlite.walsync as walsync
from engine import StoreUnavailable, flow, oke, on, signal
from workers.db import fetch, scalar

GATE_S = 0.3  # how long a test holds a sync before it looks at what happened meanwhile
# A drain records its worker row (engine/heartbeat.py) before its first claim: one commit, one sync.
DRAIN_WRITES_BEFORE_CLAIM = 1


class SyncGate:
    """Wraps the WAL sync: when armed, the next sync waits (in its thread) until released.

    `syncer_only`: hold (or fail) only the syncs the syncer thread makes, not the writer's own.
    `calls` counts every sync; `pause_s` makes each one take at least that long."""

    def __init__(self, real: Callable[[int], None]) -> None:
        self.real = real
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail_next: OSError | None = None
        self.skip = 0  # syncs to let through before the armed (or failing) one
        self.syncer_only = False
        self.calls = 0
        self.pause_s = 0.0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.pause_s:
            time.sleep(self.pause_s)
        if self.syncer_only and not threading.current_thread().name.endswith("-sync"):
            self.real(fd)
            return
        if self.skip and (self.armed or self.fail_next is not None):
            self.skip -= 1
            self.real(fd)
            return
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.release.wait(30), "the test never released the held sync"
        self.real(fd)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 20), "no sync was held"


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[SyncGate]:
    wrapper = SyncGate(walsync._fdatasync)
    monkeypatch.setattr(walsync, "_fdatasync", wrapper)
    yield wrapper
    wrapper.release.set()  # never leave a writer thread stuck behind a failed test


async def test_an_emit_returns_only_after_its_commit_is_synced(sqlite_url, gate):
    """The commit is visible to another connection while the sync is held, yet emit has not returned."""
    jobs = signal.once("sync.emit", optional=True)
    async with oke("t", database_url=sqlite_url, sqlite_writer="thread") as app:
        gate.armed = True
        emitting = asyncio.create_task(app.emit(jobs, {"n": 1}))
        await gate.wait_entered()
        await asyncio.sleep(GATE_S)
        assert await scalar(sqlite_url, "SELECT count(*) FROM oke_messages") == 1  # committed, written
        assert not emitting.done()  # but not reported until it is on disk
        gate.release.set()
        await asyncio.wait_for(emitting, 10)
    assert await scalar(sqlite_url, "PRAGMA journal_mode") == "wal"


async def test_a_claims_handlers_start_while_its_sync_runs(sqlite_url, gate):
    """With the sync after a claim held, its handler still starts, and at that moment another
    connection already sees the claim (inflight, attempt 1, this worker's lease)."""
    jobs = signal.once("sync.claim", retries=0)
    seen: list[Any] = []
    started = asyncio.Event()

    @on(jobs)
    @flow("w.sync.claim")
    async def handle(n: int, fx: Any) -> None:
        seen.extend(await fetch(sqlite_url, "SELECT status, attempts, locked_by IS NOT NULL FROM oke_messages "
                                "WHERE id = $1", fx.message_id))
        started.set()

    async with oke("t", database_url=sqlite_url, sqlite_writer="thread") as app:
        await app.emit(jobs, 1)
        gate.skip = DRAIN_WRITES_BEFORE_CLAIM
        gate.armed = True  # the claim's sync
        draining = asyncio.create_task(app.drain(concurrency=4))
        await gate.wait_entered()
        await asyncio.wait_for(started.wait(), 10)  # before the sync was released
        assert not gate.release.is_set()
        gate.release.set()
        await asyncio.wait_for(draining, 20)
    assert seen == [("inflight", 1, 1)]
    assert await fetch(sqlite_url, "SELECT status, attempts FROM oke_messages") == [("delivered", 1)]


async def test_a_drain_returns_only_after_its_last_outcomes_are_synced(sqlite_url, gate):
    """The handler arms the gate: the next sync is the one that carries its outcome (riding on the
    claim that finds nothing left). drain() must still be waiting while that sync is held. The
    handler first emits a marker: the writer runs one call at a time, so once that returns the
    sync of the handler's own claim (which may still run while the handler starts) is over."""
    jobs = signal.once("sync.drain", retries=0)
    marker = signal.once("sync.drain.marker", optional=True)

    @on(jobs)
    @flow("w.sync.drain")
    async def handle(n: int, fx: Any) -> None:
        await fx.emit(marker, n)
        gate.armed = True

    async with oke("t", database_url=sqlite_url, sqlite_writer="thread") as app:
        await app.emit(jobs, 1)
        draining = asyncio.create_task(app.drain(concurrency=1))
        await gate.wait_entered()
        await asyncio.sleep(GATE_S)
        assert await fetch(sqlite_url, "SELECT status FROM oke_messages WHERE signal = 'sync.drain'") == [("delivered",)]
        assert not draining.done()  # not reported before it is on disk
        gate.release.set()
        await asyncio.wait_for(draining, 20)


async def test_a_failed_sync_of_a_write_is_an_outage_and_the_next_write_works(sqlite_url, gate):
    jobs = signal.once("sync.fail", optional=True)
    async with oke("t", database_url=sqlite_url, sqlite_writer="thread") as app:
        gate.fail_next = OSError(errno.EIO, "Input/output error")
        with pytest.raises(StoreUnavailable, match="syncing the WAL to disk failed .*Input/output error"):
            await app.emit(jobs, {"n": 1})
        await app.emit(jobs, {"n": 2})  # the connection was dropped and is opened again
    # The failed emit's commit was written before its sync failed: the caller was told it may not
    # be stored (an outage), and here, with the disk fine after all, it is.
    assert await scalar(sqlite_url, "SELECT count(*) FROM oke_messages") == 2


async def test_a_failed_sync_after_a_claim_is_logged_and_its_handler_still_settles(sqlite_url, gate, caplog):
    """The claim was handed to its handler before the sync failed: nobody awaits that call any more,
    so the failure goes to the log, and the handler's outcome is settled on a new connection."""
    jobs = signal.once("sync.claimfail", retries=0)
    ran: list[int] = []

    @on(jobs)
    @flow("w.sync.claimfail")
    async def handle(n: int, fx: Any) -> None:
        ran.append(n)

    async with oke("t", database_url=sqlite_url, sqlite_writer="thread") as app:
        await app.emit(jobs, 7)
        gate.skip = DRAIN_WRITES_BEFORE_CLAIM
        gate.fail_next = OSError(errno.EIO, "Input/output error")  # the claim's sync
        with caplog.at_level(logging.ERROR, logger="engine.store.sqlite"):
            await asyncio.wait_for(app.drain(concurrency=2), 20)
    assert ran == [7]
    assert any("syncing the WAL to disk failed" in r.getMessage() for r in caplog.records)
    assert await fetch(sqlite_url, "SELECT status, attempts FROM oke_messages") == [("delivered", 1)]


async def _queue_behind_a_held_writer(app: Any, jobs: Any, n: int) -> tuple[list[asyncio.Task[Any]], threading.Event]:
    """`n` emits queued while the writer thread runs a write that waits for the returned event:
    once it is set, the writer finds calls waiting behind each commit but the last."""
    holding, let_go = threading.Event(), threading.Event()

    def hold(_conn: Any) -> None:
        holding.set()
        assert let_go.wait(20), "the test never let the writer go"

    blocker = asyncio.create_task(app.store.write(hold))
    assert await asyncio.to_thread(holding.wait, 20)
    emits = [asyncio.create_task(app.emit(jobs, {"n": i})) for i in range(n)]
    await asyncio.sleep(0.1)  # every emit is queued behind the blocker
    return [blocker, *emits], let_go


async def test_a_commit_the_syncer_carries_returns_only_after_its_sync_while_the_writer_goes_on(sqlite_url, gate):
    """With calls waiting, the writer hands a commit's sync to the syncer and runs the next call: the
    later emits commit (another connection sees all of them) and the last one, synced by the writer
    itself, returns; the earlier ones wait for the held sync of the syncer thread."""
    jobs = signal.once("sync.group", optional=True)
    async with oke("t", database_url=sqlite_url, sqlite_writer="thread") as app:
        tasks, let_go = await _queue_behind_a_held_writer(app, jobs, 3)
        gate.syncer_only, gate.armed = True, True
        let_go.set()
        await gate.wait_entered()
        last = tasks[-1]
        await asyncio.wait_for(last, 10)  # synced by the writer, not the held syncer
        await asyncio.sleep(GATE_S)
        assert await scalar(sqlite_url, "SELECT count(*) FROM oke_messages") == 3
        assert not any(t.done() for t in tasks[:-1])  # the blocker's and the first emits' sync is held
        gate.release.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)


async def test_concurrent_emits_share_syncs(sqlite_url, gate):
    """Emits that queue up behind the writer are synced a few at a time, not one sync each."""
    jobs = signal.once("sync.share", optional=True)
    async with oke("t", database_url=sqlite_url, sqlite_writer="thread") as app:
        tasks, let_go = await _queue_behind_a_held_writer(app, jobs, 20)
        gate.pause_s = 0.02  # a slow disk: commits pile up while a sync runs
        gate.calls = 0
        let_go.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
        syncs = gate.calls
    assert await scalar(sqlite_url, "SELECT count(*) FROM oke_messages") == 20
    assert syncs <= 6, f"{syncs} syncs for 21 commits"


async def test_a_failed_sync_of_the_syncer_fails_every_commit_it_carried(sqlite_url, gate):
    """The syncer's failed sync is an outage for each call it carried (none returns as stored); the
    writer reopens its connection and the next emit works."""
    jobs = signal.once("sync.groupfail", optional=True)
    async with oke("t", database_url=sqlite_url, sqlite_writer="thread") as app:
        tasks, let_go = await _queue_behind_a_held_writer(app, jobs, 3)
        gate.syncer_only, gate.pause_s = True, 0.05  # the syncer's first sync carries the blocker and emit 0
        gate.fail_next = OSError(errno.EIO, "Input/output error")
        let_go.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
        failed = [r for r in results if isinstance(r, StoreUnavailable)]
        assert failed and all("syncing the WAL to disk failed" in str(r) for r in failed)
        assert isinstance(results[0], StoreUnavailable)  # the blocker's commit went to the syncer first
        await app.emit(jobs, {"n": 99})  # a new connection, a new start
