"""The SQLite store: WAL, one writer thread per process, whole transactions per hop.

The store owns two threads (sqlite_thread.py): a writer that runs each claim, settle or enqueue as
one `BEGIN IMMEDIATE … COMMIT` hop, and a reader for the console's queries. Several processes may
open one file; they meet through SQLite's locks (busy timeout 30 s; `oke(..., busy_timeout_ms=...)`)
and wake each other by watching the WAL file change.

Every commit is on disk before its call returns, as with `synchronous=FULL`, but the WAL's fsync is
the store's own (SQLite runs at `synchronous=NORMAL`): a claim hands its messages to the handlers
once its commit is written to the WAL, visible to every process and safe from a crash of this one,
and the handlers start while the fsync runs; concurrent writes share fsyncs (walsync.py).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from ..errors import StoreUnavailable
from ..ids import now_ms
from .base import Claimed, NewMessage, Outcome, Store, check_keys, ensure_schema
from .caller import wake_after_commit
from .history import HistoryTally
from .outage import READ_ONLY, disk_condition, read_only_dir
from .sql.claim import claim_order, sqlite_claim_statement
from .sql.enqueue import ENQUEUE_CHUNK, SQLITE_HOLDER, SQLITE_INSERT, SQLITE_INSERT_TIMED
from .sql.settle import (
    ACK_BATCH_FROM,
    ACK_ROWS_PER_STATEMENT,
    RUN_ROWS_PER_STATEMENT,
    SQLITE_ACK,
    SQLITE_ACK_BATCH,
    SQLITE_FAIL,
    SQLITE_FAILURE_ROW,
    sqlite_ack_in_statement,
    sqlite_runs_statement,
)
from .sqlite_thread import BUSY_TIMEOUT_MS, DbThread
from .wake import Waker, WalWatch, tape_topic, wake_local

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


def _in_write_tx(conn: Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    raw = _raw(conn)
    raw.execute("BEGIN IMMEDIATE")
    try:
        result = fn(raw)
        raw.execute("COMMIT")
    except BaseException:
        # An I/O error (the file turned read-only, the disk is full) may already have rolled the
        # transaction back, and a failed COMMIT may leave it open: end it either way, and keep the
        # original error rather than "cannot rollback - no transaction is active".
        if raw.in_transaction:
            try:
                raw.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        raise
    return result


class SqliteStore(Store):
    dialect = "sqlite"

    def __init__(self, url: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self.url = url
        self.path = sqlite_path(url)
        self.busy_timeout_ms = busy_timeout_ms
        self._writer = DbThread(
            "oke-sqlite-writer", self.path, "BEGIN IMMEDIATE", busy_timeout_ms, may_create=True, syncs_wal=True
        )
        self._reader = DbThread("oke-sqlite-reader", self.path, "BEGIN", busy_timeout_ms)
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

        return await self._writer.call(run)

    async def enqueue(self, rows: Sequence[NewMessage]) -> str | None:
        check_keys(rows)
        if all(r.plain for r in rows):
            params = [_insert_params(r) for r in rows]
            # The cursor is closed on the writer thread: freeing it on the loop thread while the writer
            # uses the connection is an API misuse sqlite3 reports (about 1 in 100 concurrent emits).
            await self._writer.call(
                lambda conn: _in_write_tx(conn, lambda raw: raw.executemany(SQLITE_INSERT, params).close())
            )
            holder = None
        else:
            holder = await self._writer.call(lambda conn: _in_write_tx(conn, lambda raw: _insert_timed(raw, rows)))
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
            now = now_ms()
            for i, r in enumerate(rows):
                stored = (await conn.exec_driver_sql(SQLITE_INSERT_TIMED, _timed_params(r, now))).rowcount
                if not stored and i == 0:
                    holder = (await conn.exec_driver_sql(SQLITE_HOLDER, (r.queue, r.dedupe))).scalar()
        counted = rows if holder is None else []
        wake_after_commit(conn, self.url, then=lambda: self.tally.emitted((r.signal, r.created_at) for r in counted))
        return holder

    async def claim(self, queues: Sequence[str], worker_id: str, lease_ms: int, limit: int) -> list[Claimed]:
        sql = sqlite_claim_statement(len(queues))
        return await self._writer.call(
            lambda conn: _in_write_tx(conn, lambda raw: _claim_in(raw, sql, queues, worker_id, lease_ms, limit)),
            early=bool,
        )

    async def settle(self, worker_id: str, outcomes: Sequence[Outcome]) -> list[bool]:
        failed_to: dict[tuple[int, int], str] = {}
        held = await self._writer.call(
            lambda conn: _in_write_tx(conn, lambda raw: _settle_in(raw, worker_id, outcomes, failed_to))
        )
        self.tally.settled(outcomes, held, failed_to)
        if not all(o.ok for o in outcomes):
            wake_local(self.url)  # a failed attempt is pending again at once
        return held

    settles_with_claims = True
    # Every claim is one writer transaction with its WAL frames and sync, whatever its size, so a
    # message pays less of it in a larger one: at 32 handlers claims of 128 instead of 64 drained
    # 43,000 msgs/s against 38,500 (bench/ab.py, 4 ABBA pairs). 256 gave 9 % more again, but a
    # longer writer transaction makes every emit of the process that meets it wait longer.
    claim_rows_max = 128

    async def settle_and_claim(
        self, worker_id: str, outcomes: Sequence[Outcome], queues: Sequence[str], lease_ms: int, limit: int
    ) -> tuple[list[bool], list[Claimed]]:
        """Both in one `BEGIN IMMEDIATE … COMMIT`: one fsync instead of two per claim cycle. The
        claim sees the settle (a failed attempt is claimable again in the same transaction)."""
        sql = sqlite_claim_statement(len(queues))

        failed_to: dict[tuple[int, int], str] = {}

        def run(raw: sqlite3.Connection) -> tuple[list[bool], list[Claimed]]:
            held = _settle_in(raw, worker_id, outcomes, failed_to) if outcomes else []
            return held, _claim_in(raw, sql, queues, worker_id, lease_ms, limit)

        # Handed over before the sync only with messages to run: an empty claim (a drain's last)
        # returns once its settle is on disk.
        result = await self._writer.call(lambda conn: _in_write_tx(conn, run), early=lambda r: bool(r[1]))
        if outcomes:
            self.tally.settled(outcomes, result[0], failed_to)
        if not all(o.ok for o in outcomes):
            wake_local(self.url)  # other workers of this process: a failed attempt is pending again
        return result

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


def _timed_params(r: NewMessage, now: int) -> tuple[Any, ...]:
    """SQLITE_INSERT_TIMED's parameters for one row (this machine's clock is the claim's)."""
    run_at = now + r.delay_ms if r.delay_ms is not None else r.run_at
    return (*_insert_params(r), run_at, r.priority, r.dedupe)


def _insert_timed(raw: sqlite3.Connection, rows: Sequence[NewMessage]) -> str | None:
    """Rows with time or order options, one by one: the first row's dedupe holder, when its key
    is held, else None."""
    now = now_ms()
    holder = None
    for i, r in enumerate(rows):
        stored = raw.execute(SQLITE_INSERT_TIMED, _timed_params(r, now)).rowcount
        if not stored and i == 0:
            holder = raw.execute(SQLITE_HOLDER, (r.queue, r.dedupe)).fetchone()[0]
    return holder


def _claim_in(
    raw: sqlite3.Connection, sql: str, queues: Sequence[str], worker_id: str, lease_ms: int, limit: int
) -> list[Claimed]:
    now = now_ms()
    params: dict[str, Any] = {"worker": worker_id, "lease_until": now + lease_ms, "now": now, "limit": limit}
    params.update({f"q{i}": q for i, q in enumerate(queues)})
    rows = raw.execute(sql, params).fetchall()
    return claim_order([Claimed(*row) for row in rows])


def _ack_all_held(raw: sqlite3.Connection, worker_id: str, oks: list[tuple[int, int]], now: int) -> bool:
    """Ack every (seq, attempts) of `oks` if this worker holds each one; else change nothing, False.

    Rows acked = len(oks) proves each pair matched its own row: the seqs of one attempt number are
    distinct, and a seq under two attempt numbers (a late outcome beside the current one) can match
    only once, so the count falls short and everything is rolled back.
    """
    by_attempt: dict[int, list[int]] = {}
    for seq, attempts in oks:
        by_attempt.setdefault(attempts, []).append(seq)
    raw.execute("SAVEPOINT oke_ack")
    acked = 0
    for attempts, seqs in by_attempt.items():
        for start in range(0, len(seqs), ACK_ROWS_PER_STATEMENT):
            chunk = seqs[start : start + ACK_ROWS_PER_STATEMENT]
            acked += raw.execute(sqlite_ack_in_statement(len(chunk)), (now, now, *chunk, attempts, worker_id)).rowcount
    if acked != len(oks):
        raw.execute("ROLLBACK TO oke_ack")
    raw.execute("RELEASE oke_ack")
    return acked == len(oks)


def _settle_in(
    raw: sqlite3.Connection, worker_id: str, outcomes: Sequence[Outcome], failed_to: dict[tuple[int, int], str]
) -> list[bool]:
    """Fenced outcomes, their failure records and runs, in the caller's write transaction;
    `failed_to` gets the status each held failure left its message in."""
    now = now_ms()
    # Held by (seq, attempt), not by seq: one batch may hold a late outcome of attempt 1 and the
    # outcome of attempt 2 of the same message (this worker reclaimed it); only the latter holds.
    held: set[tuple[int, int]] = set()
    oks = [(o.claimed.seq, o.claimed.attempts) for o in outcomes if o.ok]
    if len(oks) >= ACK_BATCH_FROM:
        _ack_batch(raw, worker_id, oks, now, held)
        one_by_one = [o for o in outcomes if not o.ok]
    else:
        one_by_one = list(outcomes)
    for out in one_by_one:
        _settle_one(raw, worker_id, out, now, held, failed_to)
    still = [(o.claimed.seq, o.claimed.attempts) in held for o in outcomes]
    _record_runs(raw, worker_id, outcomes, still)
    return still


def _ack_batch(
    raw: sqlite3.Connection, worker_id: str, oks: list[tuple[int, int]], now: int, held: set[tuple[int, int]]
) -> None:
    """Ack many successes at once: by `seq IN (...)` when all are held, else by the fenced join."""
    if _ack_all_held(raw, worker_id, oks, now):
        held.update(oks)
    else:
        fence = {"fence": json.dumps(oks), "worker": worker_id, "now": now}
        held.update(raw.execute(SQLITE_ACK_BATCH, fence).fetchall())


def _settle_one(
    raw: sqlite3.Connection,
    worker_id: str,
    out: Outcome,
    now: int,
    held: set[tuple[int, int]],
    failed_to: dict[tuple[int, int], str],
) -> None:
    """One fenced ack, or one fenced failure and its failure record; held attempts join `held`
    (and a failure's new status `failed_to`)."""
    c = out.claimed
    fence = {"seq": c.seq, "worker": worker_id, "attempts": c.attempts, "now": now}
    if out.ok:
        if raw.execute(SQLITE_ACK, fence).rowcount == 1:
            held.add((c.seq, c.attempts))
        return
    failed = raw.execute(SQLITE_FAIL, {**fence, "carried": out.carried, "retry_in": out.retry_in_ms}).fetchall()
    if failed:
        held.add((c.seq, c.attempts))
        failed_to[(c.seq, c.attempts)] = failed[0][0]
        raw.execute(
            SQLITE_FAILURE_ROW,
            {
                "message_id": c.id,
                "attempt": c.attempts,
                "code": out.code,
                "message": out.message,
                "at": out.ended_at,
                "run_id": out.run_id,
            },
        )


def _record_runs(raw: sqlite3.Connection, worker_id: str, outcomes: Sequence[Outcome], still: list[bool]) -> None:
    """A run row per outcome (succeeded, failed or lease_lost), many rows a statement."""
    for start in range(0, len(outcomes), RUN_ROWS_PER_STATEMENT):
        chunk = range(start, min(start + RUN_ROWS_PER_STATEMENT, len(outcomes)))
        params: list[Any] = []
        for i in chunk:
            out, c = outcomes[i], outcomes[i].claimed
            status = ("succeeded" if out.ok else "failed") if still[i] else "lease_lost"
            params += (
                out.run_id,
                out.flow,
                c.signal,
                c.signal,
                c.id,
                c.parent_run_id,
                status,
                c.attempts,
                worker_id,
                out.started_at,
                out.ended_at,
                None if out.ok else f"{out.code}: {out.message}",
            )
        raw.execute(sqlite_runs_statement(len(chunk)), params)
