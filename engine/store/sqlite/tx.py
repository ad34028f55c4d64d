"""The SQLite store's hot transactions on a plain sqlite3 connection: enqueue, claim, settle.

Each runs whole in one `BEGIN IMMEDIATE … COMMIT` on the writer, in this process (a thread) or in
the writer process (child.py). What crosses between them is plain tuples (an outcome is a
`SettleRow`; a claim returns its rows, made `Claimed` by the store), so this module, like the
child, runs on the standard library alone.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from ...ids import now_ms
from ..sql.claim import SQLITE_CLAIM
from ..sql.enqueue import (
    SQLITE_HOLDER,
    SQLITE_INSERT,
    SQLITE_INSERT_TIMED,
    SQLITE_WINDOW_HOLD,
    SQLITE_WINDOW_HOLDER,
)
from ..sql.gates import (
    SQLITE_DUE_WAITING,
    SQLITE_PRUNE_STARTS,
    SQLITE_RECORD_START,
    SQLITE_RUNNING,
    SQLITE_STARTED,
    SQLITE_STARTS,
    Gate,
    GateRoom,
    expand,
    gate_room,
    held_back_ms,
    needs_starts,
)
from ..sql.settle import (
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

T = TypeVar("T")
Row = tuple[Any, ...]
# What each held failure left its message in (pending, dead), by (seq, attempt).
FailedTo = dict[tuple[int, int], str]


class SettleRow(NamedTuple):
    """One outcome as the writer needs it (an `Outcome` with its `Claimed` flattened)."""

    seq: int
    attempts: int
    ok: bool
    message_id: str
    signal: str
    parent_run_id: str | None
    run_id: str
    flow: str
    started_at: int
    ended_at: int
    code: str | None
    message: str | None
    carried: str | None
    retry_in_ms: int | None
    traceback: str | None


def in_write_tx(raw: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """`fn(raw)` in one `BEGIN IMMEDIATE … COMMIT`."""
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


def insert_plain(raw: sqlite3.Connection, params: list[Row]) -> None:
    """Rows without time or order options (SQLITE_INSERT's parameters each)."""
    raw.executemany(SQLITE_INSERT, params).close()


def timed_params(row: Row, now: int) -> Row:
    """SQLITE_INSERT_TIMED's parameters for a timed row: SQLITE_INSERT's parameters followed by
    (delay_ms, run_at, priority, dedupe, dedupe_for_ms). A delay counts from `now`, this machine's
    clock (the claim's); the window is not a column of the row (see `insert_timed`)."""
    *plain, delay_ms, run_at, priority, dedupe, _window = row
    return (*plain, now + delay_ms if delay_ms is not None else run_at, priority, dedupe)


def insert_timed(raw: sqlite3.Connection, rows: list[Row]) -> str | None:
    """Rows with time or order options (see `timed_params`), one by one. Returns the first row's
    dedupe holder when its key is held (then nothing is stored), else None."""
    now = now_ms()
    holder = None
    for i, row in enumerate(rows):
        params = timed_params(row, now)
        queue, dedupe, window = params[2], params[-1], row[-1]
        if i == 0 and dedupe is not None:
            held = raw.execute(SQLITE_WINDOW_HOLDER, (queue, dedupe, now)).fetchone()
            if held is not None:
                return str(held[0])
        stored = raw.execute(SQLITE_INSERT_TIMED, params).rowcount
        if not stored and i == 0:
            holder = raw.execute(SQLITE_HOLDER, (queue, dedupe)).fetchone()[0]
        elif stored and window is not None:
            raw.execute(SQLITE_WINDOW_HOLD, (queue, dedupe, params[0], window))
    return holder


def claim_rows(
    raw: sqlite3.Connection, sql: str, queues: Sequence[str], worker_id: str, lease_ms: int, limit: int
) -> list[Row]:
    """The claim statement's rows (CLAIMED_COLUMNS each), in the statement's order."""
    now = now_ms()
    params: dict[str, Any] = {"worker": worker_id, "lease_until": now + lease_ms, "now": now, "limit": limit}
    params.update({f"q{i}": q for i, q in enumerate(queues)})
    return raw.execute(sql, params).fetchall()


def settle(raw: sqlite3.Connection, worker_id: str, rows: Sequence[Row]) -> tuple[list[bool], FailedTo]:
    """Fenced outcomes (`SettleRow`s as plain tuples), their failure records and runs, in the
    caller's write transaction: whether this worker still held each, and the status each held
    failure left its message in."""
    outcomes = [SettleRow(*row) for row in rows]
    now = now_ms()
    failed_to: FailedTo = {}
    # Held by (seq, attempt), not by seq: one batch may hold a late outcome of attempt 1 and the
    # outcome of attempt 2 of the same message (this worker reclaimed it); only the latter holds.
    held: set[tuple[int, int]] = set()
    oks = [(o.seq, o.attempts) for o in outcomes if o.ok]
    if len(oks) >= ACK_BATCH_FROM:
        _ack_batch(raw, worker_id, oks, now, held)
        one_by_one = [o for o in outcomes if not o.ok]
    else:
        one_by_one = list(outcomes)
    for out in one_by_one:
        _settle_one(raw, worker_id, out, now, held, failed_to)
    still = [(o.seq, o.attempts) in held for o in outcomes]
    _record_runs(raw, worker_id, outcomes, still)
    return still, failed_to


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
    raw: sqlite3.Connection, worker_id: str, out: SettleRow, now: int, held: set[tuple[int, int]], failed_to: FailedTo
) -> None:
    """One fenced ack, or one fenced failure and its failure record; held attempts join `held`
    (and a failure's new status `failed_to`)."""
    fence = {"seq": out.seq, "worker": worker_id, "attempts": out.attempts, "now": now}
    if out.ok:
        if raw.execute(SQLITE_ACK, fence).rowcount == 1:
            held.add((out.seq, out.attempts))
        return
    failed = raw.execute(SQLITE_FAIL, {**fence, "carried": out.carried, "retry_in": out.retry_in_ms}).fetchall()
    if failed:
        held.add((out.seq, out.attempts))
        failed_to[(out.seq, out.attempts)] = failed[0][0]
        raw.execute(
            SQLITE_FAILURE_ROW,
            {
                "message_id": out.message_id,
                "attempt": out.attempts,
                "code": out.code,
                "message": out.message,
                "at": out.ended_at,
                "run_id": out.run_id,
                "traceback": out.traceback,
            },
        )


def _record_runs(raw: sqlite3.Connection, worker_id: str, outcomes: Sequence[SettleRow], still: list[bool]) -> None:
    """A run row per outcome (succeeded, failed or lease_lost), many rows a statement."""
    for start in range(0, len(outcomes), RUN_ROWS_PER_STATEMENT):
        chunk = range(start, min(start + RUN_ROWS_PER_STATEMENT, len(outcomes)))
        params: list[Any] = []
        for i in chunk:
            out = outcomes[i]
            status = ("succeeded" if out.ok else "failed") if still[i] else "lease_lost"
            params += (
                out.run_id,
                out.flow,
                out.signal,
                out.signal,
                out.message_id,
                out.parent_run_id,
                status,
                out.attempts,
                worker_id,
                out.started_at,
                out.ended_at,
                None if out.ok else f"{out.code}: {out.message}",
            )
        raw.execute(sqlite_runs_statement(len(chunk)), params)


def settle_and_claim(
    raw: sqlite3.Connection,
    worker_id: str,
    outcomes: Sequence[Row],
    sql: str,
    queues: Sequence[str],
    lease_ms: int,
    limit: int,
) -> tuple[list[bool], FailedTo, list[Row]]:
    """Both in the caller's transaction: one fsync instead of two per claim cycle. The claim sees
    the settle (a failed attempt is claimable again in the same transaction)."""
    held, failed_to = settle(raw, worker_id, outcomes) if outcomes else ([], {})
    return held, failed_to, claim_rows(raw, sql, queues, worker_id, lease_ms, limit)


SQLITE_CLAIM_ONE = SQLITE_CLAIM.format(queues=":q0")


def claim_gated(
    raw: sqlite3.Connection,
    worker_id: str,
    outcomes: Sequence[Row],
    sql: str | None,
    queues: Sequence[str],
    gates: Sequence[Row],
    lease_ms: int,
    limit: int,
    gated_limit: int,
) -> tuple[list[bool], FailedTo, list[Row], int | None]:
    """Settle `outcomes`, then claim up to `gated_limit` messages from the gated queues (`Gate`s as
    plain tuples) within their limits, then up to `limit` less what they took from `queues` with
    the plain claim `sql` (None: no such queues), all in the caller's transaction: the store's one
    write lock makes the limits' counts exact (sql/gates.py). Also returns how long an idle lane
    may sleep before a gate that held messages back may let more through (None: none did)."""
    held, failed_to = settle(raw, worker_id, outcomes) if outcomes else ([], {})
    now = now_ms()
    rows: list[Row] = []
    rooms: list[tuple[GateRoom, bool]] = []
    for gate in sorted(Gate(*g) for g in gates):
        room = _gate_room(raw, gate, now, max(0, gated_limit - len(rows)))
        if room.allowed:
            taken = claim_rows(raw, SQLITE_CLAIM_ONE, [gate.queue], worker_id, lease_ms, room.allowed)
            _record_starts(raw, gate, now, len(taken))
            rows += taken
            rooms.append((room, len(taken) == room.allowed))
        elif room.limited_by is not None:
            waiting = raw.execute(SQLITE_DUE_WAITING, (gate.signal, gate.queue, now)).fetchone() is not None
            rooms.append((room, waiting))
    if sql is not None and limit > len(rows):
        rows += claim_rows(raw, sql, queues, worker_id, lease_ms, limit - len(rows))
    return held, failed_to, rows, held_back_ms(rooms, now)


def _gate_room(raw: sqlite3.Connection, gate: Gate, now: int, wanted: int) -> GateRoom:
    running = 0
    if gate.concurrency is not None:
        running = raw.execute(SQLITE_RUNNING, (gate.signal, gate.queue, now)).fetchone()[0]
    if gate.rate_window_ms is None:
        return gate_room(gate, now, wanted, running, [])
    since = now - gate.rate_window_ms
    started = raw.execute(SQLITE_STARTED, (gate.queue, since)).fetchone()[0]
    starts = (
        expand(raw.execute(SQLITE_STARTS, (gate.queue, since)).fetchall())
        if needs_starts(gate, started, wanted)
        else []
    )
    return gate_room(gate, now, wanted, running, starts, started)


def _record_starts(raw: sqlite3.Connection, gate: Gate, now: int, started: int) -> None:
    """Log the starts a rate-limited claim made, and forget the ones outside the window."""
    if gate.rate_window_ms is None or not started:
        return
    raw.execute(SQLITE_PRUNE_STARTS, (gate.queue, now - gate.rate_window_ms))
    raw.execute(SQLITE_RECORD_START, (gate.queue, now, started))


# The transactions a writer runs by name (the writer process gets the name and the arguments).
OPS: dict[str, Callable[..., Any]] = {
    "insert": insert_plain,
    "insert_timed": insert_timed,
    "claim": claim_rows,
    "settle": settle,
    "settle_and_claim": settle_and_claim,
    "claim_gated": claim_gated,
}


def run_op(op: str, args: Sequence[Any], raw: sqlite3.Connection) -> Any:
    """Transaction `op` of OPS with its arguments, whole."""
    fn = OPS[op]
    return in_write_tx(raw, lambda tx: fn(tx, *args))


def hands_over_early(op: str, result: Any) -> bool:
    """A claim that took messages is handed over once committed, while its sync runs (its handlers
    start meanwhile); an empty one, as every other call, once its commit is synced."""
    if op == "claim":
        return bool(result)
    if op in ("settle_and_claim", "claim_gated"):
        return bool(result[2])
    return False
