"""The SQLite store: WAL, whole transactions per hop, the hot ones in a writer process.

Each claim, settle or enqueue is one `BEGIN IMMEDIATE … COMMIT` (tx.py), run by a writer
process the store starts (process.py; `sqlite_writer="thread"`: on its writer thread).
The store also owns two threads (thread.py): a writer for every other write (the operator's
and the engine's closures over a SQLAlchemy connection; it pauses the writer process meanwhile)
and a reader for the console's queries. Several processes may open one file; they meet through
SQLite's locks (busy timeout 30 s; `oke(..., busy_timeout_ms=...)`) and wake each other by
watching the WAL file change.

Every commit is on disk before its call returns, as with `synchronous=FULL`, but the WAL's fsync is
the store's own (SQLite runs at `synchronous=NORMAL`): a claim hands its messages to the handlers
once its commit is written to the WAL, visible to every process and safe from a crash of this one,
and the handlers start while the fsync runs; concurrent writes share fsyncs (walsync.py).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from ...errors import StoreUnavailable
from ...ids import now_ms
from ..base import Claimed, GatedClaim, NewMessage, Outcome, Store, check_keys, ensure_schema
from ..caller import wake_after_commit
from ..history import HistoryTally
from ..outage import READ_ONLY, disk_condition, read_only_dir
from ..sql.claim import claim_order, gated_first_order, sqlite_claim_statement
from ..sql.enqueue import (
    ENQUEUE_CHUNK,
    SQLITE_HOLDER,
    SQLITE_INSERT,
    SQLITE_INSERT_TIMED,
    SQLITE_WINDOW_HOLD,
    SQLITE_WINDOW_HOLDER,
)
from ..sql.gates import Gate
from ..wake import Waker, WalWatch, tape_topic, wake_local
from .file import BUSY_TIMEOUT_MS
from .process import WriterProcess
from .thread import DbThread, tolerant_text
from .tx import Row, hands_over_early, run_op, timed_params

T = TypeVar("T")
log = logging.getLogger("engine.store.sqlite")


def sqlite_path(url: str) -> str:
    """The file behind `sqlite[+driver]:///path` (relative to the working directory)."""
    parsed = make_url(url)
    if not parsed.drivername.startswith("sqlite"):
        raise ValueError(f"not a SQLite url: {url}")
    database = parsed.database or ""
    if database in ("", ":memory:"):
        raise ValueError("okengine needs a SQLite file (several processes share it), not :memory:")
    return database


def _raw(conn: Connection) -> sqlite3.Connection:
    return conn.connection.driver_connection  # type: ignore[return-value]


def _settle_row(o: Outcome) -> Row:
    """The outcome as the writer gets it: `SettleRow`'s fields, a plain tuple (wire.py)."""
    c = o.claimed
    return (
        c.seq,
        c.attempts,
        o.ok,
        c.id,
        c.signal,
        c.parent_run_id,
        o.run_id,
        o.flow,
        o.started_at,
        o.ended_at,
        o.code,
        o.message,
        o.carried,
        o.retry_in_ms,
        o.traceback,
    )


def _claimed(rows: list[Row]) -> list[Claimed]:
    return claim_order([Claimed(*row) for row in rows])


class SqliteStore(Store):
    dialect = "sqlite"

    def __init__(self, url: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS, writer: str = "process") -> None:
        self.url = url
        self.path = sqlite_path(url)
        self.busy_timeout_ms = busy_timeout_ms
        self._writer = DbThread(
            "oke-sqlite-writer", self.path, "BEGIN IMMEDIATE", busy_timeout_ms, may_create=True, syncs_wal=True
        )
        # the console's reads show rows another program may have written with bytes that are not UTF-8
        self._reader = DbThread("oke-sqlite-reader", self.path, "BEGIN", busy_timeout_ms, text_factory=tolerant_text)
        # The hot writes (emits, claims, settles) run in a process of their own, or on the writer thread.
        self._process = WriterProcess(self.path, busy_timeout_ms) if writer == "process" else None
        # With the writer in its own process two claims in flight overlap: one runs there while
        # the loop runs the other's handlers (on the thread they would only queue), and a worker
        # holds a full claim ahead for each: a hold shared by two lanes made smaller claims, and the
        # extra transactions ate the gain (docs/design/sqlite-writer-process.md).
        if self._process is not None:
            self.concurrent_claims = 2
        self.tally = HistoryTally()

    async def open(self) -> None:
        try:
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            await self.write(ensure_schema)
        except (OSError, sqlite3.Error, DBAPIError) as err:
            await self.close()
            # SQLAlchemy wraps sqlite3's error (and adds a multi-line hint): report the driver's own line.
            reason = err.orig if isinstance(err, DBAPIError) else err
            condition = disk_condition(err) or (READ_ONLY if read_only_dir(self.path) else None)
            lead = f"{condition}: " if condition else ""
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {lead}{reason}") from err

    async def close(self) -> None:
        if self._process is not None:
            await self._process.close()
        await self._writer.close()
        await self._reader.close()

    async def read(self, fn: Callable[[Connection], T]) -> T:
        def run(conn: Connection) -> T:
            with conn.begin():
                return fn(conn)

        return await self._reader.call(run)

    async def write(self, fn: Callable[[Connection], T]) -> T:
        def run(conn: Connection) -> T:
            with conn.begin():
                return fn(conn)

        if self._process is None:
            return await self._writer.call(run)
        async with self._process.paused():
            return await self._writer.call(run)

    async def _hot(self, op: str, *args: Any) -> Any:
        """Transaction `op` of tx.OPS on the hot writer: the process, or the writer thread."""
        if self._process is not None:
            return await self._process.call(op, *args)
        return await self._writer.call(
            lambda conn: run_op(op, args, _raw(conn)),
            early=lambda result: hands_over_early(op, result),
        )

    async def enqueue(self, rows: Sequence[NewMessage]) -> str | None:
        check_keys(rows)
        if all(r.plain for r in rows):
            await self._hot("insert", [_insert_params(r) for r in rows])
            holder = None
        else:
            holder = await self._hot("insert_timed", [_timed_row(r) for r in rows])
        if holder is None:
            self.tally.emitted((r.signal, r.created_at) for r in rows)
        wake_local(self.url)
        return holder

    async def enqueue_on(self, conn: AsyncConnection, rows: Sequence[NewMessage]) -> str | None:
        """On the caller's connection, in chunks; SQLite's lock holds other writers off until its
        commit, and this process's workers are woken after it (store/caller.py)."""
        check_keys(rows)
        holder = None
        if all(r.plain for r in rows):
            params = [_insert_params(r) for r in rows]
            for start in range(0, len(params), ENQUEUE_CHUNK):
                await conn.exec_driver_sql(SQLITE_INSERT, params[start : start + ENQUEUE_CHUNK])
        else:
            holder = await _insert_timed_on(conn, rows)
        counted = rows if holder is None else []
        wake_after_commit(conn, self.url, then=lambda: self.tally.emitted((r.signal, r.created_at) for r in counted))
        return holder

    async def claim(self, queues: Sequence[str], worker_id: str, lease_ms: int, limit: int) -> list[Claimed]:
        sql = sqlite_claim_statement(len(queues))
        return _claimed(await self._hot("claim", sql, list(queues), worker_id, lease_ms, limit))

    async def settle(self, worker_id: str, outcomes: Sequence[Outcome]) -> list[bool]:
        held: list[bool]
        held, failed_to = await self._hot("settle", worker_id, [_settle_row(o) for o in outcomes])
        self.tally.settled(outcomes, held, failed_to)
        if not all(o.ok for o in outcomes):
            wake_local(self.url)  # a failed attempt is pending again at once
        return held

    settles_with_claims = True
    # Every claim is one writer transaction with its WAL frames and sync, whatever its size, so a
    # message pays less of it in a larger one (docs/design/claim-ahead.md). Larger still drains
    # faster, but a longer writer transaction makes every emit of the process that meets it wait.
    claim_rows_max = 128

    async def settle_and_claim(
        self, worker_id: str, outcomes: Sequence[Outcome], queues: Sequence[str], lease_ms: int, limit: int
    ) -> tuple[list[bool], list[Claimed]]:
        """Both in one `BEGIN IMMEDIATE … COMMIT`: one fsync instead of two per claim cycle. The
        claim sees the settle (a failed attempt is claimable again in the same transaction). Handed
        over before the sync only with messages to run: an empty claim (a drain's last) returns once
        its settle is on disk."""
        sql = sqlite_claim_statement(len(queues))
        held, failed_to, rows = await self._hot(
            "settle_and_claim", worker_id, [_settle_row(o) for o in outcomes], sql, list(queues), lease_ms, limit
        )
        if outcomes:
            self.tally.settled(outcomes, held, failed_to)
        if not all(o.ok for o in outcomes):
            wake_local(self.url)  # other workers of this process: a failed attempt is pending again
        return held, _claimed(rows)

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
        """One `BEGIN IMMEDIATE … COMMIT` on the hot writer (tx.claim_gated): its write lock, held
        against every process, makes the limits' counts exact."""
        sql = sqlite_claim_statement(len(queues)) if queues else None
        settle_rows = [_settle_row(o) for o in outcomes]
        gate_rows = [tuple(g) for g in gates]
        held, failed_to, rows, held_back = await self._hot(
            "claim_gated", worker_id, settle_rows, sql, list(queues), gate_rows, lease_ms, limit, gated_limit
        )
        if outcomes:
            self.tally.settled(outcomes, held, failed_to)
            if not all(o.ok for o in outcomes):
                wake_local(self.url)
        claimed = gated_first_order([Claimed(*row) for row in rows], {g.queue for g in gates})
        return GatedClaim(held, claimed, held_back)

    def waker(self) -> Waker:
        return Waker(self.url, wal=WalWatch(self.path))

    def tape_waker(self, signal: str) -> Waker:
        return Waker(self.url, tape_topic(signal), WalWatch(self.path))


def _insert_params(r: NewMessage) -> tuple[Any, ...]:
    """SQLITE_INSERT's parameters for one row."""
    return (
        r.id,
        r.signal,
        r.queue,
        r.flow,
        r.key,
        r.payload,
        r.retries,
        int(r.dead_letter),
        r.created_at,
        r.created_at,
        r.parent_run_id,
        r.traceparent,
    )


def _timed_row(r: NewMessage) -> Row:
    """A row with time or order options as tx.timed_params takes it."""
    return (*_insert_params(r), r.delay_ms, r.run_at, r.priority, r.dedupe, r.dedupe_for_ms)


async def _insert_timed_on(conn: AsyncConnection, rows: Sequence[NewMessage]) -> str | None:
    """`tx.insert_timed` on the caller's connection (whose transaction holds SQLite's write lock)."""
    now = now_ms()
    holder = None
    for i, r in enumerate(rows):
        if i == 0 and r.dedupe is not None:
            held = (await conn.exec_driver_sql(SQLITE_WINDOW_HOLDER, (r.queue, r.dedupe, now))).scalar()
            if held is not None:
                return str(held)
        stored = (await conn.exec_driver_sql(SQLITE_INSERT_TIMED, timed_params(_timed_row(r), now))).rowcount
        if not stored and i == 0:
            holder = (await conn.exec_driver_sql(SQLITE_HOLDER, (r.queue, r.dedupe))).scalar()
        elif stored and r.dedupe_for_ms is not None:
            await conn.exec_driver_sql(SQLITE_WINDOW_HOLD, (r.queue, r.dedupe, r.id, r.dedupe_for_ms))
    return holder
