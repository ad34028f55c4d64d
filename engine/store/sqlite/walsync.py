"""Group commit for the SQLite writer: the WAL is fdatasynced by a thread of its own.

The writer thread commits at `synchronous=NORMAL` (the commit's frames are written to the WAL, not
synced). When other calls wait for the writer, it hands the commit to this syncer and goes on: its
next transaction runs while the WAL is synced, and one fdatasync covers every commit written
before it began. A commit's caller is told only after such a sync, so each call still returns once
its commit is on disk. With nobody waiting, the writer syncs itself (`sync_now`): a hand-off
to another thread would only add its wake-up to the call.

Nothing written later can be on disk without what was written before it: the WAL's frames carry
checksums chained from the first, and recovery keeps only the unbroken run of whole transactions
from the start. So an outcome committed while its claim's sync still runs can never survive a
power cut that its claim does not.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

# What SQLite itself uses for a WAL sync on Linux (tests wrap it to hold or fail a sync).
_fdatasync = getattr(os, "fdatasync", os.fsync)

Done = Callable[[OSError | None], None]


class WalSyncer:
    """Syncs a writer's WAL after its commits, in order, many commits a sync.

    Each commit is queued with the writer's connection generation. When a sync fails, every
    commit of that generation (queued or still to come) fails with it: the writer must reopen its
    connection (a new generation) before anything it writes is trusted again.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._queue: list[tuple[int, int, Done]] = []  # (generation, WAL descriptor, done)
        self._busy = False
        self._failed_generation = -1
        self._stopped = False
        self._thread: threading.Thread | None = None

    def after_commit(self, generation: int, wal_fd: int, done: Done) -> None:
        """Call `done(None)` from the syncer's thread once a sync begun after this call has ended,
        or `done(error)` when it (or an earlier sync of this generation) failed."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._queue.append((generation, wal_fd, done))
            self._cond.notify()

    def sync_now(self, generation: int, wal_fd: int) -> OSError | None:
        """Sync on the caller's thread (the writer's, when nothing else waits for it): None once
        done, else the error, which condemns the generation as a failed queued sync does."""
        if self._failed_generation == generation:
            return OSError("an earlier sync of this connection failed")
        try:
            _fdatasync(wal_fd)
        except OSError as err:
            self._failed_generation = generation
            return err
        return None

    def failed(self, generation: int) -> bool:
        """Whether a sync of this connection generation failed (the writer must reopen)."""
        return self._failed_generation == generation

    def quiesce(self) -> None:
        """Wait until every queued commit has been synced (or failed): before the writer closes the
        WAL descriptor the queue still refers to."""
        with self._cond:
            self._cond.wait_for(lambda: not self._queue and not self._busy)

    def stop(self) -> None:
        """Sync what is queued, then end the thread."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue) or self._stopped)
                if not self._queue:
                    return
                batch, self._queue = self._queue, []
                self._busy = True
            try:
                self._sync(batch)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _sync(self, batch: list[tuple[int, int, Done]]) -> None:
        """One fdatasync per connection generation in the batch (one, unless the writer reopened)."""
        errors: dict[tuple[int, int], OSError | None] = {}
        for generation, fd, _done in batch:
            if (generation, fd) in errors:
                continue
            if self._failed_generation == generation:
                errors[generation, fd] = OSError("an earlier sync of this connection failed")
                continue
            try:
                _fdatasync(fd)
                errors[generation, fd] = None
            except OSError as err:
                self._failed_generation = generation
                errors[generation, fd] = err
        for generation, fd, done in batch:
            done(errors[generation, fd])
