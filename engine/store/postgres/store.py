"""The PostgreSQL store: SKIP LOCKED claims, LISTEN/NOTIFY wake-ups, asyncpg on the hot path.

Operator reads and writes go through SQLAlchemy (`read` / `write`); enqueue,
claim and settle use prepared asyncpg statements on a few hot connections (hot.py),
because on two cores the driver's round trips are the budget. Wake-ups ride a dedicated
LISTEN connection, never a hot one; after it reconnects every waiter is
woken to re-read the table, since notifications sent meanwhile are gone.

Behind a pooler in transaction mode (the URL's `?prepared_statement_cache_size=0`, pooler.py) no
statement is named, settings are made per transaction, and LISTEN takes `listen_url`'s direct
connection; without one the waiters are woken by a `Poller` and nothing is handed off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import asyncpg
from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from ...errors import StoreUnavailable
from ...ids import new_id, now_ms
from .. import counts
from ..base import Claimed, GatedClaim, NewMessage, Outcome, Store, check_keys, ensure_schema
from ..caller import wake_after_commit
from ..history import HistoryTally
from ..limits import OVERRIDES_SQL, Override
from ..pauses import PAUSED_SIGNALS_SQL
from ..sql.claim import claim_order, gated_first_order, postgres_claim_statement
from ..sql.enqueue import (
    COPY_COLUMNS,
    COPY_FROM_ROWS,
    ENQUEUE_CHUNK,
    POSTGRES_DEDUPE_LOCK,
    POSTGRES_HOLDER,
    POSTGRES_INSERT,
    POSTGRES_INSERT_TIMED,
    POSTGRES_KEY_LOCKS,
    POSTGRES_WINDOW_HOLD,
    POSTGRES_WINDOW_HOLDER,
)
from ..sql.gates import (
    POSTGRES_GATE_STATE,
    POSTGRES_LOCK_GATES,
    POSTGRES_RECORD_STARTS,
    POSTGRES_STARTS,
    Gate,
    GateRoom,
    expand,
    gate_room,
    held_back_ms,
    needs_starts,
)
from ..sql.handoff import (
    EMIT_ONE,
    HANDED,
    HOLD_LISTENER_LOCK,
    IDLE_WORKERS_DDL,
    OFFER,
    TAKE_CHANNEL,
    WITHDRAW,
    take_notice,
)
from ..sql.notify import (
    CANCEL_CHANNEL,
    PAUSE_CHANNEL,
    POSTGRES_WAKE_QUEUES,
    TAPE_CHANNEL,
    WORK_CHANNEL,
    tape_of_notice,
)
from ..sql.settle import POSTGRES_ACK_ROWS_PER_STATEMENT, POSTGRES_ACK_WITH_RUNS, POSTGRES_FAIL, POSTGRES_RUNS
from ..wake import CANCELS, POOLED_POLL_S, PauseNotices, Poller, Waker, tape_topic, wake_local, wake_tapes
from .hot import HotConnections
from .pooler import (
    KNOB,
    PoolerMisconfigured,
    asyncpg_dsn,
    misconfigured,
    pooler_refusal,
    shared_session,
    transaction_pooled,
)

T = TypeVar("T")
log = logging.getLogger("engine.store.postgres")
CHANNEL = WORK_CHANNEL
SCHEMA_LOCK = 0x6F6B6501  # advisory lock taken while creating or upgrading the schema
CONNECT_TIMEOUT_S = 10.0
# A statement whose reply has not come within this long is given up as an outage (asyncio.TimeoutError):
# without it a worker cut off from the server by a silent partition (packets dropped, no reset) waits
# on TCP retransmissions for many minutes, and its emits hang instead of raising StoreUnavailable.
COMMAND_TIMEOUT_S = 10.0
SA_COMMAND_TIMEOUT_S = 30.0  # the same bound for operator reads and writes, which may scan more
# The server's side of a partition: a cut-off client's open transaction (a tape append holds the
# tape's row lock across round trips) would keep its locks until the server's TCP keepalive gives
# up (hours), stalling every other process. Our transactions never sit idle between statements,
# so one idle this long has lost its client: the server ends it and frees its locks.
IDLE_SETTING = "idle_in_transaction_session_timeout"
SESSION_SETTINGS = {
    "application_name": "okengine",
    IDLE_SETTING: str(int(COMMAND_TIMEOUT_S * 1000)),
}
# Behind a pooler the session is not ours (PgBouncer refuses the setting at startup, and in
# transaction mode a session SET would stay on a server connection other clients get next): the
# same bound is set inside each transaction that spans round trips.
SET_LOCAL_IDLE = f"SET LOCAL {IDLE_SETTING} = {SESSION_SETTINGS[IDLE_SETTING]}"
# Where a connection landed: its backend, database and server (two of ours sharing a backend are
# behind a transaction-mode pooler; a LISTEN connection must reach the same database and server).
SERVER_PROBE = "SELECT pg_backend_pid(), current_database(), pg_postmaster_start_time()"
LISTEN_PROBE_S = 5.0  # how long open() waits for listen_url's connection to hear a NOTIFY of ours
SA_POOL_SIZE = 3  # SQLAlchemy connections kept idle for reads and operator writes
SA_MAX_OVERFLOW = 12  # more for bursts (closed again when returned)
COMPACT_EVERY_S = 2.0  # how often a busy process folds message-count deltas (store/counts.py)

# The claim of up to `limit` messages: $1 worker, $2 lease ms, $3 queues (engine/store/sql/claim.py).
claim_statement = postgres_claim_statement


def describe_target(url: str) -> str:
    parsed = make_url(url)
    return f"{parsed.host or 'localhost'}:{parsed.port or 5432}/{parsed.database or ''}"


class PostgresStore(Store):
    dialect = "postgresql"
    concurrent_claims = 2  # a claim's round trip overlaps the other's (docs/design/claim-ahead.md)

    def __init__(self, url: str, pool_size: int = 4, listen_url: str | None = None) -> None:
        self.url = url
        self.dsn = asyncpg_dsn(url)
        # The URL says a pooler in transaction mode is in front: nothing may outlive a transaction.
        self.transaction_pooled = transaction_pooled(url)
        # Settings made per transaction (SET LOCAL), not at connect: behind any pooler (known from
        # the URL, or from its refusal of the startup setting).
        self.set_local = self.transaction_pooled
        self.pool_size = pool_size
        self.sa: AsyncEngine | None = None
        self.hot: HotConnections | None = None
        # Where LISTEN connects: listen_url, else the store's own URL unless that is a transaction
        # pooler's (LISTEN there hears nothing): then no listener, a Poller, and no hand-offs.
        self.listen_dsn = asyncpg_dsn(listen_url) if listen_url else None if self.transaction_pooled else self.dsn
        self.listen_target = describe_target(listen_url or url)
        self.listen_given = bool(listen_url)  # checked at open(): it must reach the store's database directly
        self.hands_off = self.listen_dsn is not None
        self._listener: _Listener | None = None
        self._poller: Poller | None = None
        self._takers: dict[str, Callable[[int], None]] = {}  # worker id -> its pool's take (on_handed)
        self._compacted_at = 0.0
        self._compacting: asyncio.Task[None] | None = None
        self.tally = HistoryTally()

    def idle_connection_ceiling(self) -> int:
        """Connections this store may keep open while idle: the hot ones, SQLAlchemy's kept pool, LISTEN.

        Bursts open more (SQLAlchemy's overflow closes again on return); clients never add any.
        """
        return self.pool_size + SA_POOL_SIZE + 1

    async def open(self) -> None:
        target = describe_target(self.url)
        try:
            self.hot = HotConnections(self._connect_hot, self.pool_size, COMMAND_TIMEOUT_S, target=target)
            async with self.hot.connection() as conn:  # reachable, and the first emit finds one open
                here = await _where(conn)
            self.sa = create_async_engine(
                self.url,
                pool_size=SA_POOL_SIZE,
                max_overflow=SA_MAX_OVERFLOW,
                pool_pre_ping=True,
                connect_args=self._connect_args(SA_COMMAND_TIMEOUT_S),
            )
            backend = await self.write(_ensure_schema_locked)
            if backend == here[0] and not self.transaction_pooled:
                raise shared_session(target)
            if self.listen_given:
                await self._check_listen_target(here, {here[0], backend})
        except StoreUnavailable:  # a pooler's refusal, or listen_url's (they say what to do)
            await self.close()
            raise
        except (TimeoutError, OSError, asyncpg.PostgresError, ConnectionError) as err:
            await self.close()
            reason = str(err) or type(err).__name__
            raise StoreUnavailable(f"cannot reach PostgreSQL at {target}: {reason}") from err
        except Exception as err:
            if _is_connect_error(err):
                await self.close()
                raise StoreUnavailable(f"cannot reach PostgreSQL at {target}: {err.__cause__ or err}") from err
            raise

    async def _check_listen_target(self, here: Landing, ours: set[int]) -> None:
        """listen_url reaches the store's database on the same server, and directly: LISTEN hears
        only that database's notifications, and through a transaction pooler it hears nothing."""
        assert self.listen_dsn is not None
        where = self.listen_target
        direct = "LISTEN needs a direct connection to PostgreSQL (its host and port, not PgBouncer's)"
        try:
            conn = await asyncpg.connect(self.listen_dsn, timeout=CONNECT_TIMEOUT_S, statement_cache_size=0)
        except (TimeoutError, OSError, asyncpg.PostgresError, ConnectionError) as err:
            raise StoreUnavailable(f"cannot reach PostgreSQL at {where} (listen_url): {err}") from err
        try:
            there = await _where(conn)
            if there[0] in ours:
                raise PoolerMisconfigured(
                    f"oke(listen_url=...) at {where} shares a server session with the store: {direct}"
                )
            if there[1] != here[1]:
                raise PoolerMisconfigured(
                    f"oke(listen_url=...) at {where} reaches database {there[1]!r}, not the store's {here[1]!r}: "
                    "notifications never cross databases"
                )
            if there[2] != here[2]:
                raise PoolerMisconfigured(
                    f"oke(listen_url=...) at {where} reaches another server than the database URL"
                )
            if not await self._hears_notify(conn):
                raise PoolerMisconfigured(
                    f"oke(listen_url=...) at {where} did not hear a notification sent through the database URL "
                    f"within {LISTEN_PROBE_S:g} s: {direct}"
                )
        finally:
            await conn.close()

    async def _hears_notify(self, conn: asyncpg.Connection) -> bool:
        """Whether `conn` hears a NOTIFY sent on a hot connection (a new channel, used once)."""
        heard = asyncio.Event()
        channel = f"oke_listen_probe_{new_id()}"
        await conn.add_listener(channel, lambda *_: heard.set())
        assert self.hot is not None, "store is not open"
        async with self.hot.connection() as hot:
            await hot.execute("SELECT pg_notify($1, '')", channel)
        try:
            async with asyncio.timeout(LISTEN_PROBE_S):
                await heard.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        if self._compacting is not None:
            await asyncio.gather(self._compacting, return_exceptions=True)
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
        if self._poller is not None:
            await self._poller.close()
            self._poller = None
        if self.hot is not None:
            await self.hot.close()
            self.hot = None
        if self.sa is not None:
            await self.sa.dispose()
            self.sa = None

    def _connect_args(self, command_timeout: float) -> dict[str, Any]:
        """asyncpg.connect's options for the hot connections and SQLAlchemy's."""
        settings = dict(SESSION_SETTINGS)
        if self.set_local:
            del settings[IDLE_SETTING]
        args: dict[str, Any] = {"timeout": CONNECT_TIMEOUT_S, "command_timeout": command_timeout}
        args["server_settings"] = settings
        if self.transaction_pooled:
            args["statement_cache_size"] = 0  # unnamed statements, parsed again on each call
        return args

    async def _connect_hot(self) -> asyncpg.Connection:
        try:
            return await asyncpg.connect(self.dsn, **self._connect_args(COMMAND_TIMEOUT_S))
        except asyncpg.PostgresError as err:
            if self.set_local or IDLE_SETTING not in str(err):
                raise
        # A pooler in front that does not pass the setting on (PgBouncer: "unsupported startup
        # parameter"): connect without it and set it in each transaction instead.
        log.info("a connection pooler in front of %s refuses %s at startup: set per transaction",
                 describe_target(self.url), IDLE_SETTING)  # fmt: skip
        self.set_local = True
        return await asyncpg.connect(self.dsn, **self._connect_args(COMMAND_TIMEOUT_S))

    @contextlib.contextmanager
    def _refusals(self) -> Iterator[None]:
        """A pooler's refusal of a prepared statement or a setting, as the error that names the fix."""
        try:
            yield
        except Exception as err:
            refusal = pooler_refusal(err)
            if refusal is None:
                raise
            raise misconfigured(describe_target(self.url), refusal) from err

    async def read(self, fn: Callable[[Connection], T]) -> T:
        assert self.sa is not None, "store is not open"
        with self._refusals():
            async with self.sa.connect() as conn:
                async with conn.begin():
                    if self.set_local:
                        await conn.exec_driver_sql(SET_LOCAL_IDLE)
                    return await conn.run_sync(fn)

    async def write(self, fn: Callable[[Connection], T]) -> T:
        assert self.sa is not None, "store is not open"
        with self._refusals():
            async with self.sa.begin() as conn:
                if self.set_local:
                    await conn.exec_driver_sql(SET_LOCAL_IDLE)
                return await conn.run_sync(fn)

    async def enqueue(self, rows: Sequence[NewMessage]) -> str | None:
        assert self.hot is not None, "store is not open"
        check_keys(rows)
        async with self.hot.connection() as conn:
            if len(rows) == 1 and rows[0].plain and rows[0].key is None:  # the common emit: one statement
                r = rows[0]  # handed to an idle worker, or pending (sql/handoff.py)
                await conn.execute(
                    EMIT_ONE, r.id, r.signal, r.queue, r.flow, r.key, r.payload, r.retries,
                    r.dead_letter, r.created_at, r.parent_run_id, r.traceparent,
                )  # fmt: skip
                holder = None
            elif len(rows) <= ENQUEUE_CHUNK and all(r.plain and r.key is None for r in rows):
                await conn.execute(POSTGRES_INSERT, *_insert_columns(rows))
                holder = None
            else:
                holder = await _insert_in_transaction(conn, rows, self.set_local)
        if holder is None:
            self.tally.emitted((r.signal, r.created_at) for r in rows)
        wake_local(self.url)
        self._maybe_compact_counts()
        return holder

    async def enqueue_on(self, conn: AsyncConnection, rows: Sequence[NewMessage]) -> str | None:
        """The same statements on the caller's connection: their NOTIFY is delivered at its commit,
        to this process's listener as to every other's; its key locks are held until then."""
        check_keys(rows)
        holder = await _insert_deduped(_sqlalchemy_runner(conn), rows)
        stored = rows if holder is None else []
        wake_after_commit(conn, self.url, then=lambda: self.tally.emitted((r.signal, r.created_at) for r in stored))
        return holder

    async def paused_signals(self) -> frozenset[str]:
        # On a hot connection in one statement: a worker reads this before a claim after a pause
        # notice (or, while its LISTEN connection is down, after an idle spell). Through SQLAlchemy
        # (checkout, BEGIN, SELECT, COMMIT) the read held that claim up (docs/design/idle-path.md).
        assert self.hot is not None, "store is not open"
        async with self.hot.connection() as conn:
            rows = await conn.fetch(PAUSED_SIGNALS_SQL)
        return frozenset(row[0] for row in rows)

    async def limit_overrides(self) -> dict[str, Override]:
        # On a hot connection in one statement, as the paused set: read at the same moments.
        assert self.hot is not None, "store is not open"
        async with self.hot.connection() as conn:
            rows = await conn.fetch(OVERRIDES_SQL)
        return {row[0]: Override(row[1], row[2]) for row in rows}

    async def claim(self, queues: Sequence[str], worker_id: str, lease_ms: int, limit: int) -> list[Claimed]:
        assert self.hot is not None, "store is not open"
        async with self.hot.connection() as conn:
            rows = await conn.fetch(claim_statement(limit), worker_id, lease_ms, list(queues))
        return claim_order([Claimed(*row) for row in rows])

    async def claim_gated(
        self,
        worker_id: str,
        outcomes: Sequence[Outcome],
        queues: Sequence[str],
        gates: Sequence[Gate],
        lease_ms: int,
        limit: int,
        gated_limit: int,
    ) -> GatedClaim:
        """The gated queues in one transaction under their advisory locks (sql/gates.py), then the
        plain queues with the plain claim statement, as `claim` does."""
        held = await self.settle(worker_id, outcomes) if outcomes else []
        assert self.hot is not None, "store is not open"
        async with self.hot.connection() as conn:
            async with _transaction(conn, self.set_local):
                rows, held_back = await _claim_gates(conn, worker_id, gates, lease_ms, gated_limit)
            rest = claim_size_step(limit - len(rows))
            if queues and rest > 0:
                rows += await conn.fetch(claim_statement(rest), worker_id, lease_ms, list(queues))
        claimed = gated_first_order([Claimed(*row) for row in rows], {g.queue for g in gates})
        return GatedClaim(held, claimed, held_back)

    async def settle(self, worker_id: str, outcomes: Sequence[Outcome]) -> list[bool]:
        # Not joined with the next claim (SQLite does that): here the settle runs on its own
        # connection while the next claim is in flight, and that overlap is worth more than the
        # commit it would save (docs/design/claim-ahead.md).
        assert self.hot is not None, "store is not open"
        failed_to: dict[tuple[int, int], str] = {}
        async with self.hot.connection() as conn:
            if _needs_transaction(outcomes):
                async with _transaction(conn, self.set_local):
                    held = await _settle_on(conn, worker_id, outcomes, failed_to)
            else:
                held = await _settle_on(conn, worker_id, outcomes, failed_to)
        self.tally.settled(outcomes, held, failed_to)
        self._maybe_compact_counts()
        return held

    def _maybe_compact_counts(self) -> None:
        """Every COMPACT_EVERY_S, fold the count deltas in the background (store/counts.py), so the
        overview sums a few rows per signal, not one per statement since the store began."""
        now = time.monotonic()
        if self._compacting is not None or now - self._compacted_at < COMPACT_EVERY_S:
            return
        self._compacted_at = now
        self._compacting = asyncio.get_running_loop().create_task(self._compact_counts(), name="oke-count-compactor")

    async def _compact_counts(self) -> None:
        try:
            assert self.hot is not None
            async with self.hot.connection() as conn:
                async with _transaction(conn, self.set_local):
                    if not await conn.fetchval(counts.TRY_COMPACT_LOCK_SQL, counts.COMPACT_LOCK):
                        return
                    await conn.execute(counts.COMPACT_SQL)
                    stale = await conn.fetchval(counts.STATS_STALE_SQL)
                if stale:
                    await conn.execute(counts.ANALYZE_SQL)
        except Exception as err:  # best effort: the deltas stay and still count; the next pass folds them
            log.debug("count compaction skipped (%s: %s)", type(err).__name__, err)
        finally:
            self._compacting = None

    def waker(self) -> Waker:
        self._start_wakeups()
        return Waker(self.url)

    def tape_waker(self, signal: str) -> Waker:
        """Woken by this process's appends and, through LISTEN oke_tape, by other processes'."""
        listener = self._start_wakeups()
        if listener is not None:
            listener.listen_soon(TAPE_CHANNEL, self._on_tape_notice)
        return Waker(self.url, tape_topic(signal))

    def pause_notices(self) -> PauseNotices | None:
        """Heard on the workers' LISTEN connection, once a waker started it."""
        return None if self._listener is None else self._listener.pauses

    def cancel_notices(self) -> PauseNotices | None:
        """Cancel requests heard on the workers' LISTEN connection, once a waker started it."""
        return None if self._listener is None else self._listener.cancels

    hands_off = True  # unless no LISTEN connection can be had (__init__)

    def on_handed(self, worker_id: str, take: Callable[[int], None]) -> Callable[[], None]:
        # This store's own listener and takers: two apps on one database in one process each hear
        # every notice, and only the one whose worker it names may take it.
        listener = self._start_wakeups()
        if listener is None:
            return lambda: None  # nothing is handed off without a listener (offer_idle says no)
        listener.listen_soon(TAKE_CHANNEL, self._on_take_notice)
        self._takers[worker_id] = take

        def forget() -> None:
            if self._takers.get(worker_id) is take:
                del self._takers[worker_id]

        return forget

    def _on_take_notice(self, payload: str) -> None:
        notice = take_notice(payload)  # "" when the connection came back: nothing to take then
        if notice is not None and (take := self._takers.get(notice[0])) is not None:
            take(notice[1])

    async def offer_idle(self, worker_id: str, queues: Sequence[str], lease_ms: int, hold_ms: int) -> bool:
        listener_pid = None if self._listener is None else self._listener.backend_hearing(TAKE_CHANNEL)
        if listener_pid is None:
            return False  # it would not hear what it is handed: that would wait out its lease
        assert self.hot is not None, "store is not open"
        async with self.hot.connection() as conn:
            await conn.execute(OFFER, worker_id, list(queues), lease_ms, hold_ms, listener_pid)
        return True

    async def withdraw_idle(self, worker_id: str) -> None:
        assert self.hot is not None, "store is not open"
        async with self.hot.connection() as conn:
            await conn.execute(WITHDRAW, worker_id)

    async def handed(self, worker_id: str, seq: int) -> tuple[list[Claimed], int | None]:
        assert self.hot is not None, "store is not open"
        async with self.hot.connection() as conn:
            row = await conn.fetchrow(HANDED, seq, worker_id)
        if row is None:
            return [], None
        *columns, lease_left_ms = row.values()
        return [Claimed(*columns)], lease_left_ms

    def _on_tape_notice(self, payload: str) -> None:
        if not payload:  # the LISTEN connection came back: anything may have happened
            wake_tapes(self.url)
        else:
            wake_local(self.url, tape_topic(tape_of_notice(payload)))

    def _start_wakeups(self) -> _Listener | None:
        """The LISTEN connection, started; None where none can be had (behind a transaction pooler
        without listen_url): then a Poller wakes this process's waiters, with a warning, once."""
        if self.listen_dsn is None:
            if self._poller is None:
                log.warning(
                    "PostgreSQL at %s is behind a pooler in transaction mode (%s=0 in its URL) and "
                    "oke(..., listen_url=...) is not set: idle workers and live tapes poll every %.1f s instead "
                    "of being woken by LISTEN/NOTIFY, and no emit is handed to an idle worker; give listen_url "
                    "a direct PostgreSQL URL",
                    describe_target(self.url), KNOB, POOLED_POLL_S,
                )  # fmt: skip
                self._poller = Poller(self.url)
            self._poller.ensure_started()
            return None
        if self._listener is None:
            self._listener = _Listener(self.listen_dsn, self.url)
        self._listener.ensure_started()
        return self._listener


# A connection's backend pid, database and server start (SERVER_PROBE).
Landing = tuple[int, str, Any]


async def _where(conn: Any) -> Landing:
    row = await conn.fetchrow(SERVER_PROBE)
    return (int(row[0]), str(row[1]), row[2])


def _insert_columns(rows: Sequence[NewMessage]) -> tuple[list[Any], ...]:
    """The rows as the column arrays POSTGRES_INSERT unnests ($1 … $11)."""
    return (
        [r.id for r in rows],
        [r.signal for r in rows],
        [r.queue for r in rows],
        [r.flow for r in rows],
        [r.key for r in rows],
        [r.payload for r in rows],
        [r.retries for r in rows],
        [r.dead_letter for r in rows],
        [r.created_at for r in rows],
        [r.parent_run_id for r in rows],
        [r.traceparent for r in rows],
    )


def _timed_columns(rows: Sequence[NewMessage]) -> tuple[list[Any], ...]:
    """POSTGRES_INSERT_TIMED's option arrays ($12 … $15)."""
    return (
        [r.delay_ms for r in rows],
        [r.run_at for r in rows],
        [r.priority for r in rows],
        [r.dedupe for r in rows],
    )


# run(sql, args, fetch): a statement on one connection, its rows when fetch (asyncpg's own
# connection for our transactions, SQLAlchemy's for the caller's).
Runner = Callable[[str, tuple[Any, ...], bool], Awaitable[list[Any]]]
# copy(rows): COPY plain rows into oke_messages on the same connection (asyncpg's only).
Copier = Callable[[Sequence[NewMessage]], Awaitable[None]]


def _asyncpg_runner(conn: Any) -> Runner:
    async def run(sql: str, args: tuple[Any, ...], fetch: bool) -> list[Any]:
        if fetch:
            return list(await conn.fetch(sql, *args))
        await conn.execute(sql, *args)
        return []

    return run


def _asyncpg_copier(conn: Any) -> Copier:
    async def copy(rows: Sequence[NewMessage]) -> None:
        records = [
            (
                r.id, r.signal, r.queue, r.flow, r.key, r.payload, "pending", 0, r.retries, r.dead_letter,
                r.created_at, r.created_at, r.parent_run_id, 0, r.traceparent,
            )
            for r in rows
        ]  # fmt: skip
        await conn.copy_records_to_table("oke_messages", records=records, columns=COPY_COLUMNS)
        await conn.execute(POSTGRES_WAKE_QUEUES, list(dict.fromkeys(r.queue for r in rows)))

    return copy


def _sqlalchemy_runner(conn: AsyncConnection) -> Runner:
    async def run(sql: str, args: tuple[Any, ...], fetch: bool) -> list[Any]:
        result = await conn.exec_driver_sql(sql, args)
        return list(result.all()) if fetch else []

    return run


async def _insert_rows(run: Runner, rows: Sequence[NewMessage], copy: Copier | None = None) -> set[str]:
    """Inside a transaction: the per-key locks, then the rows, ENQUEUE_CHUNK a statement (the
    timed statement for a chunk with time or order options, COPY for a large plain one when
    `copy` is given); the ids it stored."""
    keys = [f"{r.queue}\x1f{r.key}" for r in rows if r.key is not None]
    if keys:
        await run(POSTGRES_KEY_LOCKS, (keys,), False)
    stored: set[str] = set()
    for start in range(0, len(rows), ENQUEUE_CHUNK):
        chunk = rows[start : start + ENQUEUE_CHUNK]
        plain = all(r.plain for r in chunk)
        if plain and copy is not None and len(chunk) >= COPY_FROM_ROWS:
            await copy(chunk)
            stored.update(r.id for r in chunk)
        elif plain:
            await run(POSTGRES_INSERT, _insert_columns(chunk), False)
            stored.update(r.id for r in chunk)
        else:
            found = await run(POSTGRES_INSERT_TIMED, (*_insert_columns(chunk), *_timed_columns(chunk)), True)
            stored.update(row[0] for row in found)
    return stored


# Tries of a dedupe emit whose holder finished between the skipped insert and the read of its id.
_DEDUPE_TRIES = 5


async def _insert_deduped(run: Runner, rows: Sequence[NewMessage], copy: Copier | None = None) -> str | None:
    """The rows; when the first one's dedupe key is held, nothing of it is stored and the holder's
    id is returned. A skipped insert waited for a concurrent holder to commit; a holder that
    finished before its id was read frees the key: insert again (every row of one emit carries
    the key, so a second insert stores only what the first skipped). A key held for a window
    (`dedupe_for`) is checked first, under the key's lock, so emits of one key take turns."""
    first = rows[0]
    if first.dedupe is not None:
        await run(POSTGRES_DEDUPE_LOCK, (first.queue, first.dedupe), False)
        held = await run(POSTGRES_WINDOW_HOLDER, (first.queue, first.dedupe, now_ms()), True)
        if held:
            return str(held[0][0])
    for _ in range(_DEDUPE_TRIES):
        stored = await _insert_rows(run, rows, copy)
        if first.dedupe is None or first.id in stored:
            await _hold_windows(run, [r for r in rows if r.id in stored])
            return None
        found = await run(POSTGRES_HOLDER, (first.queue, first.dedupe), True)
        if found:
            return str(found[0][0])
    raise RuntimeError(f'emit("{first.signal}", dedupe=...): the key kept changing hands; try again')


async def _hold_windows(run: Runner, stored: Sequence[NewMessage]) -> None:
    """Each stored row with a `dedupe_for` window holds its key for it (oke_dedupe_holds)."""
    for r in stored:
        if r.dedupe is not None and r.dedupe_for_ms is not None:
            await run(POSTGRES_WINDOW_HOLD, (r.queue, r.dedupe, r.id, r.dedupe_for_ms), False)


@contextlib.asynccontextmanager
async def _transaction(conn: Any, set_local: bool) -> AsyncIterator[None]:
    """asyncpg's transaction; behind a pooler with the idle bound set inside it (SET LOCAL), since
    the session's setting could not be made."""
    async with conn.transaction():
        if set_local:
            await conn.execute(SET_LOCAL_IDLE)
        yield


def claim_size_step(size: int) -> int:
    """A claim size as the claimer rounds it (one prepared statement per size): above 8, down to a
    multiple of 8."""
    return size if size <= 8 else size - size % 8


async def _claim_gates(
    conn: Any, worker_id: str, gates: Sequence[Gate], lease_ms: int, gated_limit: int
) -> tuple[list[Any], int | None]:
    """In the caller's transaction: lock the gates' queues, read what their limits allow in a new
    snapshot, claim that much from each, and log the rate-limited starts."""
    if not gates or gated_limit <= 0:
        return [], None
    ordered = sorted(gates, key=lambda g: g.lock_key)
    await conn.fetchval(POSTGRES_LOCK_GATES, [g.lock_key for g in ordered])
    state = await conn.fetch(
        POSTGRES_GATE_STATE,
        [g.queue for g in ordered],
        [g.signal for g in ordered],
        [g.rate_window_ms or 0 for g in ordered],
    )
    rows: list[Any] = []
    rooms: list[tuple[GateRoom, bool]] = []
    now = 0
    for gate, found in zip(ordered, state, strict=True):
        now = found["now"]
        wanted, started = claim_size_step(max(0, gated_limit - len(rows))), found["started"]
        starts: list[int] = []
        if started is not None and needs_starts(gate, started, wanted):
            starts = expand(await conn.fetch(POSTGRES_STARTS, gate.queue, now - (gate.rate_window_ms or 0)))
        room = gate_room(gate, now, wanted, found["running"], starts, started)
        take = claim_size_step(room.allowed)
        taken = await conn.fetch(claim_statement(take), worker_id, lease_ms, [gate.queue]) if take else []
        if taken and gate.rate_window_ms is not None:
            await conn.execute(POSTGRES_RECORD_STARTS, gate.queue, now, len(taken), gate.rate_window_ms)
        rows += taken
        rooms.append((room, len(taken) == take if take else found["waiting"]))
    return rows, held_back_ms(rooms, now)


async def _insert_in_transaction(conn: Any, rows: Sequence[NewMessage], set_local: bool) -> str | None:
    async with _transaction(conn, set_local):
        return await _insert_deduped(_asyncpg_runner(conn), rows, _asyncpg_copier(conn))


async def _settle_on(
    conn: Any, worker_id: str, outcomes: Sequence[Outcome], failed_to: dict[tuple[int, int], str]
) -> list[bool]:
    """Fenced outcomes, their failure records and runs. Successes (with their runs) are one
    statement; failures and wake-ups add more, so `_needs_transaction` says when to wrap it.
    `failed_to` gets the status each held failure left its message in."""
    now = now_ms()
    oks = [o for o in outcomes if o.ok]
    fails = [o for o in outcomes if not o.ok]
    # Held outcomes by (seq, attempt), not by seq: one batch may hold a late outcome of attempt 1
    # and the outcome of attempt 2 of the same message (the same worker reclaimed it); only the
    # latter is held, and the former's run must say lease_lost.
    held_attempts: set[tuple[int, int]] = set()
    if oks:
        held_attempts.update(await _ack_with_runs(conn, worker_id, oks, now))
    if fails:
        await _fail_with_runs(conn, worker_id, fails, now, held_attempts, failed_to)
    # Wake claimers when this settle made something eligible: a failed attempt is pending
    # again, and a finished keyed message unblocks the next one of its key (without the
    # wake-up an idle key advanced one message per IDLE_POLL_S).
    ready = _queues_to_wake(outcomes)
    if ready:
        await conn.execute(POSTGRES_WAKE_QUEUES, ready)
    return [(o.claimed.seq, o.claimed.attempts) in held_attempts for o in outcomes]


async def _ack_with_runs(conn: Any, worker_id: str, oks: list[Outcome], now: int) -> list[tuple[int, int]]:
    """Ack the successes and record their runs, a statement per POSTGRES_ACK_ROWS_PER_STATEMENT
    (one transaction when more): the (seq, attempts) it acked."""
    step = POSTGRES_ACK_ROWS_PER_STATEMENT
    acked: list[tuple[int, int]] = []
    for start in range(0, len(oks), step):
        acked += await _ack_chunk(conn, worker_id, oks[start : start + step], now)
    return acked


async def _ack_chunk(conn: Any, worker_id: str, oks: list[Outcome], now: int) -> list[tuple[int, int]]:
    rows = await conn.fetch(
        POSTGRES_ACK_WITH_RUNS,
        [o.claimed.seq for o in oks],
        [o.claimed.attempts for o in oks],
        [o.run_id for o in oks],
        [o.flow for o in oks],
        [o.claimed.signal for o in oks],
        [o.claimed.id for o in oks],
        [o.claimed.parent_run_id for o in oks],
        [o.started_at for o in oks],
        [o.ended_at for o in oks],
        now,
        worker_id,
    )
    return [(r[0], r[1]) for r in rows]


async def _fail_with_runs(
    conn: Any,
    worker_id: str,
    fails: list[Outcome],
    now: int,
    held_attempts: set[tuple[int, int]],
    failed_to: dict[tuple[int, int], str],
) -> None:
    """Each failure fenced with its failure record (held ones join `held_attempts`, their new
    status `failed_to`), then their runs."""
    for out in fails:
        c = out.claimed
        status = await conn.fetchval(
            POSTGRES_FAIL,
            c.seq,
            c.attempts,
            now,
            worker_id,
            out.code,
            out.message,
            out.ended_at,
            out.run_id,
            out.retry_in_ms,
            out.carried,
            out.traceback,
        )
        if status is not None:
            held_attempts.add((c.seq, c.attempts))
            failed_to[(c.seq, c.attempts)] = status
    await conn.execute(
        POSTGRES_RUNS,
        [o.run_id for o in fails],
        [o.flow for o in fails],
        [o.claimed.signal for o in fails],
        [o.claimed.id for o in fails],
        [o.claimed.parent_run_id for o in fails],
        ["failed" if (o.claimed.seq, o.claimed.attempts) in held_attempts else "lease_lost" for o in fails],
        [o.claimed.attempts for o in fails],
        [o.started_at for o in fails],
        [o.ended_at for o in fails],
        worker_id,
        [f"{o.code}: {o.message}" for o in fails],
    )


def _queues_to_wake(outcomes: Sequence[Outcome]) -> list[str]:
    return sorted({o.claimed.queue for o in outcomes if not o.ok or o.claimed.key is not None})


def _needs_transaction(outcomes: Sequence[Outcome]) -> bool:
    """Plain successes with no key to wake, few enough for one statement, are atomic on their own."""
    return len(outcomes) > POSTGRES_ACK_ROWS_PER_STATEMENT or bool(_queues_to_wake(outcomes))


def _ensure_schema_locked(conn: Connection) -> int:
    """Create or upgrade the schema; the backend it ran on (open() compares it with the hot one's)."""
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": SCHEMA_LOCK})
    ensure_schema(conn)
    conn.execute(text(IDLE_WORKERS_DDL))  # PostgreSQL's alone, unlogged (sql/handoff.py)
    return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _log_listen_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (err := task.exception()) is not None:
        log.debug("LISTEN on a new channel failed (%s: %s); the connection listens again when it is back",
                  type(err).__name__, err)  # fmt: skip


def _is_connect_error(err: BaseException) -> bool:
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, (OSError, asyncpg.PostgresError, ConnectionError, asyncio.TimeoutError)):
            return True
        seen = seen.__cause__
    return False


class _Listener:
    """One LISTEN connection per store; wakes this process's workers on every notify."""

    def __init__(self, dsn: str, url: str) -> None:
        self.dsn = dsn
        self.url = url
        self.task: asyncio.Task[None] | None = None
        self.conn: asyncpg.Connection | None = None
        self.ready = asyncio.Event()
        # Extra channels (pauses, live tapes); CHANNEL itself wakes the workers.
        self.pauses = PauseNotices(self.ready)
        self.cancels = PauseNotices(self.ready)  # the same bookkeeping, for requests to stop a handler
        self.channels: dict[str, Callable[[str], None]] = {
            PAUSE_CHANNEL: self._on_pause,
            CANCEL_CHANNEL: self._on_cancel,
        }
        self.listening: set[str] = set()
        self.listen_lock = asyncio.Lock()

    def ensure_started(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name="oke-pg-listen")

    def _on_notify(self, *_args: Any) -> None:
        wake_local(self.url)

    def _on_pause(self, _payload: str) -> None:
        """A pause changed (or the connection is back): the workers re-read the paused set before
        their next claim, which this wake-up brings about (a resume's queues may be claimable)."""
        self.pauses.heard()
        wake_local(self.url)

    def _on_cancel(self, _payload: str) -> None:
        """A handler is asked to stop (or the connection is back): the cancel watchers read the requests."""
        self.cancels.heard()
        wake_local(self.url, CANCELS)

    def _on_channel(self, _conn: Any, _pid: int, channel: str, payload: object) -> None:
        callback = self.channels.get(channel)
        if callback is not None:
            callback(str(payload))

    async def _listen_channels(self) -> None:
        """LISTEN on channels registered since the connection opened. One at a time: a connection
        runs one statement at once, and a channel added while the connection (re)opens would
        otherwise LISTEN beside the opening's own."""
        async with self.listen_lock:
            conn = self.conn
            if conn is None:
                return
            for channel in list(self.channels):
                if channel not in self.listening:
                    await conn.add_listener(channel, self._on_channel)
                    self.listening.add(channel)

    def backend_hearing(self, channel: str) -> int | None:
        """The server pid of this LISTEN connection while it is up and listens on `channel`."""
        conn = self.conn
        if conn is None or not self.ready.is_set() or channel not in self.listening:
            return None
        return conn.get_server_pid()

    def listen_soon(self, channel: str, callback: Callable[[str], None]) -> None:
        """Register `channel` and LISTEN on it now if connected; else when the connection opens. A
        failure here is the connection's: it comes back and listens on every channel then."""
        if channel in self.channels:
            return
        self.channels[channel] = callback
        if self.conn is not None:
            task = asyncio.get_running_loop().create_task(self._listen_channels())
            task.add_done_callback(_log_listen_failure)

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            lost = asyncio.Event()
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT_S)
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, self._on_notify)
                await conn.execute(HOLD_LISTENER_LOCK)  # while it lives: offers naming it are live
                self.listening = set()
                self.conn = conn  # only now may listen_soon LISTEN on it (one statement at a time)
                await self._listen_channels()
                self.ready.set()
                backoff = 0.1
                wake_local(self.url)  # notifications sent while we were away are gone: re-read
                for callback in list(self.channels.values()):
                    callback("")
                await lost.wait()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the database is away: retry with back-off
                log.warning("LISTEN connection failed (%s); retrying in %.1fs", err, backoff)
            finally:
                self.ready.clear()
                if conn is not None and not conn.is_closed():
                    conn.terminate()
                self.conn = None
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):
                pass
            self.task = None
