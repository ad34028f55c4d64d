"""A thread that owns one SQLite connection and runs every call on it, whole.

aiosqlite hands every call to its thread (about 90% of stdlib sqlite3's speed lost on a claim
loop), so the SQLite store owns two of these instead: a writer that runs each claim, settle or
enqueue as one `BEGIN IMMEDIATE … COMMIT`, and a reader for the console's queries. The writer's
commits are made durable by its WalSyncer (walsync.py): synced on the writer's own thread when
nothing else is waiting for it, else by the syncer beside it, many commits a sync.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, create_engine, event
from sqlalchemy.pool import StaticPool

from ..errors import StoreUnavailable
from .walsync import WalSyncer

T = TypeVar("T")
log = logging.getLogger("engine.store.sqlite")
BUSY_TIMEOUT_MS = 30_000
# SQLite writes each commit to the WAL without syncing it; the writer's WalSyncer fsyncs the WAL
# after every commit (walsync.py), so each commit is on disk before its call returns.
SYNCHRONOUS = "NORMAL"


def _enter_wal(dbapi_conn: sqlite3.Connection, busy_timeout_ms: int) -> None:
    """Switch the file to WAL, retrying while another process holds it.

    Switching needs an exclusive lock, and SQLite answers "database is locked" at once (without its
    busy handler, to avoid a deadlock) when two processes open a fresh file together. So this retries
    until the busy timeout, as any other statement would wait.
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000
    pause = 0.005
    while True:
        try:
            mode = dbapi_conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                dbapi_conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) and "busy" not in str(err) or time.monotonic() >= deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.1)


def _make_engine(path: str, begin_sql: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> Any:
    engine = create_engine(
        f"sqlite:///{path}",
        poolclass=StaticPool,
        connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        dbapi_conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        _enter_wal(dbapi_conn, busy_timeout_ms)
        dbapi_conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS}")

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql(begin_sql)

    return engine


class _Job(Generic[T]):
    """One call waiting for the thread; cancelled before it starts, it never runs."""

    __slots__ = ("fn", "handover", "early", "cancelled")

    def __init__(self, fn: Callable[[Connection], T], handover: _Handover[T], early: Callable[[T], bool] | None):
        self.fn, self.handover, self.early = fn, handover, early
        self.cancelled = False


class DbThread:
    """One thread holding one connection; every call runs whole on it, in the order called.

    Before each call the store file is checked to still be the one the connection opened: SQLite
    keeps writing to an open file after its directory is removed (or the file replaced), so without
    the check every emit would "succeed" into a file nobody can open again. A missing or replaced
    file is an outage (StoreUnavailable); the connection is dropped and reopened once a file is back
    at the path, never created anew (`may_create` only lets the writer create the store at open).

    The writer (`syncs_wal`) makes each commit durable before its call returns (SQLite runs at
    synchronous=NORMAL): it fdatasyncs the WAL itself when no other call waits for the thread, and
    otherwise leaves the sync to its WalSyncer and goes on with the next call, so concurrent emits
    share syncs (group commit) instead of each waiting out one of its own.
    """

    def __init__(
        self,
        name: str,
        path: str,
        begin_sql: str,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        may_create: bool = False,
        syncs_wal: bool = False,
    ) -> None:
        self.name = name
        self.jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.closed = False
        self.closing: _Handover[None] | None = None  # told once the thread has closed the connection
        self.path = path
        self.begin_sql = begin_sql
        self.busy_timeout_ms = busy_timeout_ms
        self.may_create = may_create
        self.syncer = WalSyncer(f"{name}-sync") if syncs_wal else None
        self.generation = 0  # of the connection: counts reopens, so a failed sync condemns only its own
        self.wal_fd: int | None = None
        self.engine: Any = None
        self.conn: Connection | None = None
        self.identity: tuple[int, int] | None = None

    def _file_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def _connect(self) -> Connection:
        if self.conn is not None and self.syncer is not None and self.syncer.failed(self.generation):
            self._close()  # its last commits may not survive a power cut: a new connection, a new start
        if self.conn is not None and self._file_identity() != self.identity:
            self._close()
            raise StoreUnavailable(f"SQLite store {self.path} was moved, removed or replaced while in use")
        if self.conn is None:
            if not self.may_create and self._file_identity() is None:
                raise StoreUnavailable(f"SQLite store {self.path} is missing (moved or removed while in use)")
            self.engine = _make_engine(self.path, self.begin_sql, self.busy_timeout_ms)
            self.conn = self.engine.connect()
            self.generation += 1
            self.identity = self._file_identity()
            self.may_create = False
        return self.conn

    def _wal(self) -> int:
        """The WAL's descriptor. The file stays the same while this connection is open (SQLite
        deletes it only when its last connection closes, and a checkpoint truncates it in place),
        so one descriptor serves every call."""
        if self.wal_fd is None:
            try:
                self.wal_fd = os.open(self.path + "-wal", os.O_RDONLY)
            except OSError as err:
                self._close()
                raise self._sync_failed(err) from err
        return self.wal_fd

    def _sync_failed(self, err: OSError) -> StoreUnavailable:
        return StoreUnavailable(
            f"SQLite store {self.path}: syncing the WAL to disk failed ({err}); "
            "the last commit may not survive a power cut"
        )

    def _serve(self) -> None:
        """The thread: each job in turn, until close() queues None; then the connection closes."""
        while (job := self.jobs.get()) is not None:
            if not job.cancelled:
                self._run(job)
        closing = self.closing
        try:
            self._close()
        except BaseException as err:
            if closing is not None:
                closing.post(err)
            return
        if closing is not None:
            closing.post(None)

    def _run(self, job: _Job[T]) -> None:
        """One call: `fn`, then (the writer) its sync; the caller is told once, after the sync, or
        (`early(result)`) as soon as `fn` has committed."""
        handover = job.handover
        try:
            result = job.fn(self._connect())
            wal_fd = self._wal() if self.syncer is not None else None
        except BaseException as err:
            handover.post(err)
            return
        handed = job.early is not None and job.early(result)
        if handed:
            handover.post(result)
        if self.syncer is None or wal_fd is None:
            if not handed:
                handover.post(result)
            return

        def synced(err: OSError | None) -> None:
            if err is None:
                if not handed:
                    handover.post(result)
            elif handed:
                # The claim stands (its handlers run, every process sees it), but it may not survive
                # a power cut; nobody awaits this call any more, so the log is where it is told.
                log.error("%s", self._sync_failed(err))
            else:
                handover.post(self._sync_failed(err))

        if self.jobs.empty():  # nobody waits for this thread: sync here, no hand-off to wait for
            synced(self.syncer.sync_now(self.generation, wal_fd))
        else:
            self.syncer.after_commit(self.generation, wal_fd, synced)

    async def call(self, fn: Callable[[Connection], T], early: Callable[[T], bool] | None = None) -> T:
        """Run `fn(connection)` on this thread; returns once its commit is on disk.

        With `early`, when `early(result)` holds the result comes back as soon as `fn`'s commit is
        written to the WAL, while the WAL is still being synced: a claim's handlers then start
        during the fsync instead of after it. The claim is written (visible to every process, kept
        if this process dies) before any handler starts; only a power cut within the fsync could
        undo it, and its messages would then be claimed again with the same attempt number.

        The thread posts to the loop once a call, never twice (a second wake-up of the loop would
        contend with the next call for the GIL)."""
        if self.closed:
            raise StoreUnavailable(f"SQLite store {self.path} is closed")
        job = _Job(fn, _Handover(asyncio.get_running_loop()), early)
        if self.thread is None:
            self.thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self.thread.start()
        self.jobs.put(job)
        try:
            return await job.handover.future
        except asyncio.CancelledError:
            job.cancelled = True  # not started yet: never runs (a started call runs on)
            raise

    def _close(self) -> None:
        if self.syncer is not None:
            self.syncer.quiesce()  # nothing queued still refers to the descriptor
        if self.wal_fd is not None:
            os.close(self.wal_fd)
            self.wal_fd = None
        if self.conn is not None:
            self.conn.close()
            self.engine.dispose()
            self.conn = None

    async def close(self) -> None:
        """Close the connection and stop the thread, after the calls queued before; a second close
        (say, after a failed open) is a no-op."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.thread is not None:
                self.closing = _Handover(asyncio.get_running_loop())
                self.jobs.put(None)
                await self.closing.future
        finally:
            if self.syncer is not None:
                self.syncer.stop()


class _Handover(Generic[T]):
    """A call's result (or error), posted once from the thread to the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[T] = loop.create_future()

    def post(self, outcome: T | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self._take, outcome)
        except RuntimeError:  # the loop closed meanwhile: nobody is waiting
            pass

    def _take(self, outcome: T | BaseException) -> None:
        if self.future.done():  # the caller was cancelled
            return
        if isinstance(outcome, BaseException):
            self.future.set_exception(outcome)
        else:
            self.future.set_result(outcome)
