"""The SQLite store's side of its writer process (child.py): start it, call it, pause it.

The child is started at the store's first hot write (an emit, a claim, a settle), so a store
opened only to read (the console) never starts one. It runs on the loop that started it; a call
from another loop (a later `asyncio.run`) ends it and starts a new one. When it dies (killed, out
of memory) every call it still owed fails with StoreUnavailable, an outage the workers back off
from, and the next call starts a new one; a claim it had committed is reclaimed after its lease,
as after a crash of the whole process.

Writes that are not on the hot path (controls, heartbeats, history, retention, live tapes) still
run on the store's writer thread, a closure over a SQLAlchemy connection: `paused()` holds the
child between two of its transactions meanwhile, so the two writers of one process never wait for
each other on SQLite's lock (its busy handler sleeps; a pause is one round trip).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from ...errors import StoreUnavailable
from .wire import LOG, Frames, error_from_wire, frame

log = logging.getLogger("engine.store.sqlite")
ENGINE_DIR = Path(__file__).resolve().parent.parent.parent
# The child imports engine.store.sqlite.child under empty stand-ins for `engine`, `engine.store` and
# `engine.store.sqlite`: their __init__ would import SQLAlchemy, Starlette and the rest of the engine.
_LAUNCH = """\
import sys, types
engine_dir, path, busy_timeout_ms, fd = sys.argv[1:5]
for name, where in (("engine", ""), ("engine.store", "/store"), ("engine.store.sqlite", "/store/sqlite")):
    package = types.ModuleType(name)
    package.__path__ = [engine_dir + where]
    sys.modules[name] = package
from engine.store.sqlite.child import main
main(path, int(busy_timeout_ms), int(fd))
"""
CLOSE_WAIT_S = 30.0  # a close waits this long for the child's last transaction and sync
# A start that fails may fail every time (a frozen executable cannot run `python -I -S -c`).
_THREAD_HINT = "; where this interpreter cannot start one, use oke(..., sqlite_writer='thread')"


class _Link(asyncio.Protocol):
    """One child process and the calls it owes, on the loop that started it."""

    def __init__(self, path: str, busy_timeout_ms: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.path = path
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.ids = itertools.count(1)
        self.frames = Frames()
        self.transport: asyncio.Transport | None = None
        self.backlog: list[bytes] = []  # sent before the socket's transport was made
        self.lost: StoreUnavailable | None = None
        ours, theirs = socket.socketpair()
        self.sock = ours
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _LAUNCH, str(ENGINE_DIR), path, str(busy_timeout_ms)]
                + [str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        except OSError as err:
            ours.close()
            failed = f"cannot start the SQLite writer process ({err})"
            raise StoreUnavailable(f"{failed}{_THREAD_HINT} (store {path})") from err
        finally:
            theirs.close()
        self.answered = False  # a child that ends before its first answer may not start here at all
        self.connecting = self.loop.create_task(self.loop.connect_accepted_socket(lambda: self, ours))
        self.connecting.add_done_callback(self._connected)
        self.reaping: asyncio.Task[None] | None = None

    def _connected(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.connection_lost(None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        for data in self.backlog:
            transport.write(data)
        self.backlog.clear()

    def data_received(self, data: bytes) -> None:
        self.answered = True
        for rid, ok, value in self.frames.feed(data):
            if rid == LOG:
                log.log(logging.getLevelName(ok.upper()), "%s", value)
                continue
            future = self.pending.pop(rid, None)
            if future is None or future.done():
                continue  # its caller was cancelled
            if ok:
                future.set_result(value)
            else:
                future.set_exception(error_from_wire(value))

    def connection_lost(self, exc: Exception | None) -> None:
        code = self.proc.poll()
        ended = "ended" if code is None else f"ended with exit code {code}"
        hint = "" if self.answered else _THREAD_HINT
        what = f"the SQLite writer process (pid {self.proc.pid}) {ended}"
        self.lost = StoreUnavailable(f"{what}{hint} (store {self.path})")
        self.reaping = self.loop.create_task(_reaped(self.proc))  # no zombie left behind
        for future in self.pending.values():
            if not future.done():
                future.set_exception(self.lost)
        self.pending.clear()

    def send(self, op: str, args: tuple[Any, ...]) -> tuple[int, asyncio.Future[Any]]:
        if self.lost is not None:
            raise self.lost
        rid = next(self.ids)
        data = frame((rid, op, args))
        future: asyncio.Future[Any] = self.loop.create_future()
        self.pending[rid] = future
        self.write(data)
        return rid, future

    def write(self, data: bytes) -> None:
        if self.lost is not None:
            return
        if self.transport is None:
            self.backlog.append(data)
        else:
            self.transport.write(data)

    def forget(self, rid: int) -> None:
        """A caller stopped waiting: the child skips the call if it has not started it."""
        if self.pending.pop(rid, None) is not None:
            self.write(frame((next(self.ids), "cancel", (rid,))))

    def release(self, hold_id: int) -> None:
        self.write(frame((hold_id, "release", ())))

    def abandon(self) -> None:
        """End the child from outside its loop (that loop may be closed): it sees its socket close."""
        self.lost = self.lost or StoreUnavailable(f"the SQLite writer process was left (store {self.path})")
        self.sock.close()


class WriterProcess:
    """The writer process of one SQLite store: hot writes by name, and pauses for the store's own
    writer thread."""

    def __init__(self, path: str, busy_timeout_ms: int) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.link: _Link | None = None

    def _running(self) -> _Link | None:
        """The child serving this loop, if one runs."""
        link = self.link
        if link is None or link.lost is not None or link.loop is not asyncio.get_running_loop():
            return None
        return link

    def _started(self) -> _Link:
        link = self._running()
        if link is None:
            if self.link is not None and self.link.lost is None:
                self.link.abandon()  # started by another loop
            link = self.link = _Link(self.path, self.busy_timeout_ms)
        return link

    async def call(self, op: str, *args: Any) -> Any:
        """Run transaction `op` (tx.OPS) in the child; its result once its commit is synced
        (a claim that took messages: once its commit is written)."""
        link = self._started()
        rid, future = link.send(op, args)
        try:
            return await future
        except asyncio.CancelledError:
            link.forget(rid)
            raise

    @asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """The child waits between two transactions (after those already sent) while this holds."""
        link = self._running()
        if link is None:
            yield
            return
        rid, held = link.send("hold", ())
        try:
            try:
                await held
            except StoreUnavailable:
                pass  # the child is gone: nothing to pause
            yield
        finally:
            link.release(rid)

    async def close(self) -> None:
        """Let the child finish what was sent and sync it, then end it."""
        link, self.link = self.link, None
        if link is None:
            return
        if link.lost is None and link.loop is asyncio.get_running_loop():
            try:
                _rid, closed = link.send("close", ())
                await asyncio.wait_for(closed, CLOSE_WAIT_S)
            except (StoreUnavailable, TimeoutError):
                pass
            if link.transport is not None:
                link.transport.close()
        else:
            link.abandon()
        await _reaped(link.proc)


async def _reaped(proc: subprocess.Popen[bytes]) -> None:
    """Wait for the child to exit (its socket is closed: it is on its way out); kill it after
    CLOSE_WAIT_S."""
    deadline = time.monotonic() + CLOSE_WAIT_S
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            return
        await asyncio.sleep(0.005)
