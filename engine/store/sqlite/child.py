"""The SQLite store's writer process: one connection, each request run whole, answered over a socket.

In one process a SQLite drain is a serial cycle, the writer's transaction and then the loop's
turn, because a writer thread and the event loop share the GIL. In a process of its own the writer
runs the next claim while the loop runs the last one's handlers (docs/design/sqlite-writer-process.md). The store
(process.py) starts it with stub parent packages, so it imports only the standard library
and the engine's stdlib-only modules: no SQLAlchemy, so it starts in a fraction of the time.

It ends when its socket closes: when the store sends `close` (everything sent before is run and
synced first), or when its parent dies (what is still unread then is not run: nobody waits for it).
SIGINT and SIGTERM are ignored: a Ctrl-C or a service stop reaches the whole process group, and
the parent's graceful stop still needs its writer to settle the last outcomes.
"""

from __future__ import annotations

import functools
import select
import signal
import socket
import threading
from collections import deque
from typing import Any

from .file import LostSync, StoreFile, open_raw
from .tx import hands_over_early, run_op
from .walsync import WalSyncer
from .wire import LOG, Frames, error_to_wire, frame

READ_BYTES = 1 << 20


class Inbox:
    """The requests sent so far, read ahead of the one running: a `cancel` read before its request
    started keeps that request from running, and `waiting()` tells whether another call waits."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.frames = Frames()
        self.queue: deque[tuple[int, str, Any]] = deque()
        self.cancelled: set[int] = set()
        self.started = 0  # the id of the last request taken (ids grow in the order they are sent)
        self.ended = False  # the parent closed its end, or died

    def _read(self, block: bool) -> None:
        if not block and not select.select([self.sock], [], [], 0)[0]:
            return
        try:
            data = self.sock.recv(READ_BYTES)
        except ConnectionResetError:  # the parent died with answers unread: gone all the same
            data = b""
        if not data:
            self.ended = True
            return
        for rid, op, args in self.frames.feed(data):
            if op == "cancel":
                if args[0] > self.started:
                    self.cancelled.add(args[0])
            else:
                self.queue.append((rid, op, args))

    def next(self) -> tuple[int, str, Any] | None:
        """The next request to run, or None once the parent is gone."""
        while True:
            self._read(block=not self.queue)
            if self.ended:
                return None
            while self.queue:
                request = self.queue.popleft()
                self.started = request[0]
                if request[0] in self.cancelled:
                    self.cancelled.discard(request[0])
                    continue
                return request

    def waiting(self) -> bool:
        self._read(block=False)
        return bool(self.queue)

    def until_release(self, hold_id: int) -> bool:
        """Read (and queue) requests until the parent releases the hold `hold_id`; False if it died."""
        while not self.ended:
            for i, (rid, op, _args) in enumerate(self.queue):
                if op == "release" and rid == hold_id:
                    del self.queue[i]
                    return True
            self._read(block=True)
        return False


class Outbox:
    """Answers to the parent, from the writer's thread and its syncer's."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        data = frame(message)
        with self.lock:
            try:
                self.sock.sendall(data)
            except OSError:
                pass  # the parent is gone: nobody to tell

    def poster(self, rid: int) -> Any:
        """How `StoreFile.deliver` tells request `rid`'s caller."""

        def post(outcome: Any) -> None:
            if isinstance(outcome, LostSync):
                self.send((LOG, "error", str(outcome.error)))
            elif isinstance(outcome, BaseException):
                self.send((rid, False, error_to_wire(outcome)))
            else:
                self.send((rid, True, outcome))

        return post


def serve(file: StoreFile[Any], inbox: Inbox, out: Outbox) -> int | None:
    """Run requests until the parent is gone or asks to close; the id of that `close`, if it did."""
    while (request := inbox.next()) is not None:
        rid, op, args = request
        if op == "close":
            return rid
        if op == "hold":  # the parent's own writer thread writes meanwhile: stay out of its way
            out.send((rid, True, None))
            if not inbox.until_release(rid):
                return None
            continue
        try:
            result = file.run(functools.partial(run_op, op, args))
        except BaseException as err:
            out.send((rid, False, error_to_wire(err)))
            continue
        file.deliver(result, hands_over_early(op, result), out.poster(rid), others_waiting=inbox.waiting())
    return None


def _close(raw: Any) -> None:
    raw.close()


def main(path: str, busy_timeout_ms: int, fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    out = Outbox(sock)
    syncer = WalSyncer("oke-sqlite-writer-sync")
    file: StoreFile[Any] = StoreFile(path, lambda: open_raw(path, busy_timeout_ms), _close, False, syncer)
    closing = None
    try:
        closing = serve(file, Inbox(sock), out)
    finally:
        try:
            file.close()
        finally:
            syncer.stop()
        if closing is not None:
            out.send((closing, True, None))
        sock.close()
