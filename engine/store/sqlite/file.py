"""The SQLite store's file as each of its connections holds it, and a writer's way from a commit
to its caller.

Every connection runs in WAL mode with a busy timeout; the writer's commits are made durable by
the store's own WAL sync (walsync.py), so SQLite runs at synchronous=NORMAL. A `StoreFile` keeps
one connection: it checks the file is still the one it opened, reopens after a failed sync, and
tells a commit's caller once the commit is on disk (or, for a claim, once it is written).

Standard library only: the writer process (child.py) runs it without SQLAlchemy.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ...errors import StoreUnavailable
from .walsync import WalSyncer

C = TypeVar("C")
BUSY_TIMEOUT_MS = 30_000
# SQLite writes each commit to the WAL without syncing it; the writer's WalSyncer fsyncs the WAL
# after every commit, so each commit is on disk before its call returns.
SYNCHRONOUS = "NORMAL"


def enter_wal(raw: sqlite3.Connection, busy_timeout_ms: int) -> None:
    """Switch the file to WAL, retrying while another process holds it.

    Switching needs an exclusive lock, and SQLite answers "database is locked" at once (without its
    busy handler, to avoid a deadlock) when two processes open a fresh file together. So this retries
    until the busy timeout, as any other statement would wait.
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000
    pause = 0.005
    while True:
        try:
            mode = raw.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                raw.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) and "busy" not in str(err) or time.monotonic() >= deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.1)


def prepare(raw: sqlite3.Connection, busy_timeout_ms: int) -> None:
    """What every connection to the store sets before its first statement."""
    raw.isolation_level = None  # the store issues BEGIN itself
    raw.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    enter_wal(raw, busy_timeout_ms)
    raw.execute(f"PRAGMA synchronous = {SYNCHRONOUS}")


def file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`, or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def sync_failed(path: str, err: OSError) -> StoreUnavailable:
    return StoreUnavailable(
        f"SQLite store {path}: syncing the WAL to disk failed ({err}); the last commit may not survive a power cut"
    )


class StoreFile(Generic[C]):
    """One connection to the store file, opened by `opener` and checked before each use.

    SQLite keeps writing to an open file after its directory is removed (or the file replaced), so
    without the check every emit would "succeed" into a file nobody can open again. A missing or
    replaced file is an outage (StoreUnavailable); the connection is dropped and reopened once a
    file is back at the path, never created anew (`may_create` only lets the first open create it).

    With a `syncer` (the writer), each commit is made durable before its caller is told: synced
    here when nothing else waits for the writer, else handed to the syncer while the writer goes on
    with the next call, so concurrent commits share syncs (group commit).
    """

    def __init__(
        self,
        path: str,
        opener: Callable[[], C],
        closer: Callable[[C], None],
        may_create: bool = False,
        syncer: WalSyncer | None = None,
    ) -> None:
        self.path = path
        self.opener, self.closer = opener, closer
        self.may_create = may_create
        self.syncer = syncer
        self.conn: C | None = None
        self.identity: tuple[int, int] | None = None
        self.generation = 0  # of the connection: counts reopens, so a failed sync condemns only its own
        self.wal_fd: int | None = None

    def connect(self) -> C:
        if self.conn is not None and self.syncer is not None and self.syncer.failed(self.generation):
            self.close()  # its last commits may not survive a power cut: a new connection, a new start
        if self.conn is not None and file_identity(self.path) != self.identity:
            self.close()
            raise StoreUnavailable(f"SQLite store {self.path} was moved, removed or replaced while in use")
        if self.conn is None:
            if not self.may_create and file_identity(self.path) is None:
                raise StoreUnavailable(f"SQLite store {self.path} is missing (moved or removed while in use)")
            self.conn = self.opener()
            self.generation += 1
            self.identity = file_identity(self.path)
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
                self.close()
                raise sync_failed(self.path, err) from err
        return self.wal_fd

    def run(self, fn: Callable[[C], Any]) -> Any:
        """`fn(connection)`; with a syncer, the WAL's descriptor is at hand for the commit's sync."""
        result = fn(self.connect())
        if self.syncer is not None:
            self._wal()
        return result

    def deliver(self, result: Any, handed: bool, post: Callable[[Any], None], others_waiting: bool) -> None:
        """Tell the caller of a committed call: `post(result)` once its commit is synced, or
        (`handed`, a claim with messages) at once, and the log then hears of a failed sync;
        `post(StoreUnavailable)` when the sync fails before the caller was told."""
        if handed:
            post(result)
        syncer, wal_fd = self.syncer, self.wal_fd
        if syncer is None or wal_fd is None:
            if not handed:
                post(result)
            return

        def synced(err: OSError | None) -> None:
            if err is None:
                if not handed:
                    post(result)
            elif handed:
                # The claim stands (its handlers run, every process sees it), but it may not survive
                # a power cut; nobody awaits this call any more, so the log is where it is told.
                post(LostSync(sync_failed(self.path, err)))
            else:
                post(sync_failed(self.path, err))

        if others_waiting:
            syncer.after_commit(self.generation, wal_fd, synced)
        else:  # nobody waits for this writer: sync here, no hand-off to wait for
            synced(syncer.sync_now(self.generation, wal_fd))

    def close(self) -> None:
        if self.syncer is not None:
            self.syncer.quiesce()  # nothing queued still refers to the descriptor
        if self.wal_fd is not None:
            os.close(self.wal_fd)
            self.wal_fd = None
        if self.conn is not None:
            conn, self.conn = self.conn, None
            self.closer(conn)


class LostSync:
    """Posted after a call already handed over (a claim): its sync failed, and only the log can say so."""

    __slots__ = ("error",)

    def __init__(self, error: StoreUnavailable) -> None:
        self.error = error


def open_raw(path: str, busy_timeout_ms: int) -> sqlite3.Connection:
    """A plain sqlite3 connection to the store, prepared as every connection is."""
    raw = sqlite3.connect(path, timeout=busy_timeout_ms / 1000, check_same_thread=False, isolation_level=None)
    try:
        prepare(raw, busy_timeout_ms)
    except BaseException:
        raw.close()
        raise
    return raw
