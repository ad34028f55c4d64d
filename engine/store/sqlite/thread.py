"""A thread that owns one SQLite connection and runs every call on it, whole.

aiosqlite hands every call to its thread (about 90% of stdlib sqlite3's speed lost on a claim
loop), so the SQLite store owns two of these instead: a writer that runs each write as one
`BEGIN IMMEDIATE … COMMIT` (the hot ones too, with `sqlite_writer="thread"`), and a reader for the
console's queries. The writer's commits are made durable by its WalSyncer (walsync.py) through its
StoreFile (file.py): synced on the writer's own thread when nothing else is waiting for
it, else by the syncer beside it, many commits a sync.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, create_engine, event
from sqlalchemy.pool import StaticPool

from ...errors import StoreUnavailable
from .file import BUSY_TIMEOUT_MS, LostSync, StoreFile, prepare
from .walsync import WalSyncer

T = TypeVar("T")
log = logging.getLogger("engine.store.sqlite")


def tolerant_text(data: bytes) -> str:
    """TEXT as str even when it is not UTF-8 (written by some other program): each bad byte
    becomes a lone surrogate (surrogateescape), which engine.display shows as `\\xNN`, instead
    of the whole query failing and the console showing nothing of the store."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="surrogateescape")


def _make_engine(path: str, begin_sql: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS, text_factory: Any = None) -> Any:
    engine = create_engine(
        f"sqlite:///{path}",
        poolclass=StaticPool,
        connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        prepare(dbapi_conn, busy_timeout_ms)
        if text_factory is not None:
            dbapi_conn.text_factory = text_factory

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
    """One thread holding one connection (a `StoreFile`); every call runs whole on it, in the order
    called.

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
        text_factory: Callable[[bytes], str] | None = None,
    ) -> None:
        self.name = name
        self.jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.closed = False
        self.closing: _Handover[None] | None = None  # told once the thread has closed the connection
        self.path = path
        self.file: StoreFile[Connection] = StoreFile(
            path,
            lambda: _make_engine(path, begin_sql, busy_timeout_ms, text_factory).connect(),
            _close_connection,
            may_create,
            WalSyncer(f"{name}-sync") if syncs_wal else None,
        )

    def _serve(self) -> None:
        """The thread: each job in turn, until close() queues None; then the connection closes."""
        while (job := self.jobs.get()) is not None:
            if not job.cancelled:
                self._run(job)
        closing = self.closing
        try:
            self.file.close()
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
            result = self.file.run(job.fn)
        except BaseException as err:
            handover.post(err)
            return
        handed = job.early is not None and job.early(result)
        self.file.deliver(result, handed, handover.post, others_waiting=not self.jobs.empty())

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
            if self.file.syncer is not None:
                self.file.syncer.stop()


def _close_connection(conn: Connection) -> None:
    conn.close()
    conn.engine.dispose()


class _Handover(Generic[T]):
    """A call's result (or error), posted once from the thread to the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[T] = loop.create_future()

    def post(self, outcome: T | BaseException | LostSync) -> None:
        if isinstance(outcome, LostSync):
            log.error("%s", outcome.error)
            return
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
