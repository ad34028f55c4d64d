"""The hot connections of a PostgreSQL store: what emits, claims and settles run on.

asyncpg's Pool arms a timer on every acquire and runs every release in a task of its own (a
shield), and an idle worker's emit → handler start pays for both twice, with cold caches
(docs/design/idle-path.md). Here a call takes
the connection given back last and gives it back without awaiting anything; only waiting for one
(all in use) or opening one awaits, and that is bounded like a statement.

A connection comes back fit for the next call or not at all. One given back inside a transaction,
after a cancel or a timeout, or after any error other than the server refusing a statement is
terminated (its state is unknown), and its place goes to the next call, which opens a new one. No
reset query is needed: the store's locks are transaction-scoped, LISTEN has its own connection, and
it sets no session state.

A call that a pooler refused (a prepared statement another server connection holds or lacks: a
transaction-mode PgBouncer the URL does not declare) ends in the error that names the fix
(pooler.py), not the driver's.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType

import asyncpg

from ..outage import is_outage
from .pooler import misconfigured, pooler_refusal

Connect = Callable[[], Awaitable[asyncpg.Connection]]

# A connection idle longer than this is closed rather than used (asyncpg's pool does the same, at
# 300 s): a NAT or firewall on the way may have dropped its flow silently, and its next statement
# would wait out the statement timeout before the call could retry.
MAX_IDLE_S = 300.0


class HotConnections:
    """Up to `size` connections, the one given back last handed out first (its caches are warm)."""

    def __init__(
        self, connect: Connect, size: int, wait_s: float, max_idle_s: float = MAX_IDLE_S, *, target: str = "the server"
    ) -> None:
        if size < 1:
            raise ValueError(f"hot connections: size must be at least 1, got {size}")
        self._connect = connect
        self.target = target  # host:port/database, for the errors that name it
        self.size = size
        self.wait_s = wait_s
        self.max_idle_s = max_idle_s
        self._idle: list[tuple[asyncpg.Connection, float]] = []  # with when each was given back
        self._open = 0  # idle, in use, or being opened
        self._waiters: deque[asyncio.Future[asyncpg.Connection | None]] = deque()
        self._closing: set[asyncio.Task[None]] = set()  # idle connections saying goodbye to the server
        self._closed = False

    @property
    def open_count(self) -> int:
        """Connections open or being opened (never more than `size`)."""
        return self._open

    def connection(self) -> _Lease:
        """`async with hot.connection() as conn:` one call's connection, given back at the end."""
        return _Lease(self)

    async def take(self) -> asyncpg.Connection:
        """An idle connection; a new one while fewer than `size` are open; else the next one given
        back. asyncio.TimeoutError after `wait_s` of waiting and opening: an outage, as a statement's."""
        self._check_open()
        while self._idle:
            conn, since = self._idle.pop()
            if not conn.is_closed() and time.monotonic() - since < self.max_idle_s:
                return conn
            self._open -= 1  # closed by the server while it sat idle, or idle too long to trust
            self._close_quietly(conn)
        async with asyncio.timeout(self.wait_s):
            if self._open < self.size:
                self._open += 1
            else:
                handed = await self._wait()
                if handed is not None:
                    return handed
                # a place freed by a connection that was discarded: open one in it
            return await self._open_one()

    def give(self, conn: asyncpg.Connection, fit: bool = True) -> None:
        """Back from a call: kept for the next one when `fit` and clean, else terminated (its place
        goes to a waiting call, which opens a new one)."""
        if fit and not self._closed and not conn.is_closed() and not conn.is_in_transaction():
            self._hand(conn)
        else:
            conn.terminate()
            self._hand(None)

    async def close(self) -> None:
        """Close the idle connections now; those in use are terminated when given back."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(asyncpg.InterfaceError("the store is closed"))
        idle, self._idle = self._idle, []
        self._open -= len(idle)
        await asyncio.gather(*(self._close(conn) for conn, _ in idle), *self._closing)

    async def _wait(self) -> asyncpg.Connection | None:
        waiter: asyncio.Future[asyncpg.Connection | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._hand(waiter.result())  # handed over just as this call gave up: pass it on
            else:
                waiter.cancel()
            raise

    async def _open_one(self) -> asyncpg.Connection:
        """Open a connection in a place already counted in `_open`; the place is freed on failure."""
        try:
            conn = await self._connect()
        except BaseException:
            self._hand(None)
            raise
        if self._closed:
            self.give(conn, fit=False)
            self._check_open()
        return conn

    def _hand(self, conn: asyncpg.Connection | None) -> None:
        """A connection, or a free place (None), to the first call still waiting; else kept idle
        (a connection) or given up (a place)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is None:
            self._open -= 1
        else:
            self._idle.append((conn, time.monotonic()))

    def _close_quietly(self, conn: asyncpg.Connection) -> None:
        """Close without making the caller wait (a graceful close, so the server logs no lost client)."""
        if conn.is_closed():
            return
        closing = asyncio.ensure_future(self._close(conn))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def _close(self, conn: asyncpg.Connection) -> None:
        try:
            await conn.close(timeout=self.wait_s)
        except Exception:  # noqa: BLE001 - it was going away anyway
            conn.terminate()

    def _check_open(self) -> None:
        if self._closed:
            raise asyncpg.InterfaceError("the store is closed")


class _Lease:
    """One call's connection: fit to keep unless the call ended in something other than the server
    refusing a statement (a cancel, a timeout, a broken connection)."""

    def __init__(self, hot: HotConnections) -> None:
        self.hot = hot
        self.conn: asyncpg.Connection | None = None

    async def __aenter__(self) -> asyncpg.Connection:
        self.conn = await self.hot.take()
        return self.conn

    async def __aexit__(
        self, _type: type[BaseException] | None, exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        assert self.conn is not None
        fit = exc is None or (isinstance(exc, asyncpg.PostgresError) and not is_outage(exc))
        self.hot.give(self.conn, fit)
        refusal = None if exc is None else pooler_refusal(exc)
        if refusal is not None:
            raise misconfigured(self.hot.target, refusal) from exc
