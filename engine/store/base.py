"""What every store offers the engine, and the records that cross that line.

Operator reads and writes are plain functions of a synchronous SQLAlchemy
`Connection` (`read(fn)` / `write(fn)`), so `engine.ops` is written once for
both backends. The hot path (enqueue, claim, settle) is per dialect.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

from sqlalchemy import Connection, Update, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ..errors import SchemaTooNew
from ..ids import now_ms
from . import counts, limits, migrations, pauses, schema, search_index
from .history import HistoryTally
from .sql.claim import POSTGRES_LEASE_CLOCK
from .sql.gates import Gate
from .sql.notify import notify_queues
from .wake import CANCELS, PauseNotices, Waker, wake_local

T = TypeVar("T")


class NewMessage(NamedTuple):
    """A row to enqueue: one per once message, one per flow for a broadcast. (A named tuple, as
    Claimed: emit_many builds one per message, and a named tuple builds several times faster than a
    frozen dataclass.)"""

    id: str
    signal: str
    queue: str
    flow: str | None
    key: str | None
    payload: str
    retries: int
    dead_letter: bool
    parent_run_id: str | None
    created_at: int
    traceparent: str | None = None  # the emitting span's W3C context (engine/telemetry/tracing.py)
    # The time and order options: due `delay_ms` after the store's clock at the write,
    # or at `run_at`; claimed by `priority` among due rows; one live row per (queue, dedupe).
    delay_ms: int | None = None
    run_at: int | None = None
    priority: int = 0
    dedupe: str | None = None
    # `dedupe_for`: the key stays held this long after the message finished (oke_dedupe_holds).
    dedupe_for_ms: int | None = None

    @property
    def plain(self) -> bool:
        """No time or order option: the hot path's statement stores it as the seeds did."""
        return self.delay_ms is None and self.run_at is None and self.priority == 0 and self.dedupe is None


class Claimed(NamedTuple):
    """A message a worker now holds under a lease. (Named tuples, not frozen dataclasses, for the
    two records made per message on the hot path: they build several times faster.)"""

    seq: int
    id: str
    signal: str
    queue: str
    flow: str | None
    key: str | None
    payload: str
    attempts: int
    parent_run_id: str | None
    traceparent: str | None = None  # the span contexts it carries (engine/telemetry/tracing.py)
    priority: int = 0


class GatedClaim(NamedTuple):
    """A claim over gated (limited) queues besides plain ones: whether this worker still held each
    outcome settled with it, the messages claimed, and how long an idle lane may sleep before a
    limit that held messages back may let more through (None: no limit held any back)."""

    held: list[bool]
    claimed: list[Claimed]
    held_back_ms: int | None


class Outcome(NamedTuple):
    """How one claimed attempt ended; settled fenced by (seq, locked_by, attempts)."""

    claimed: Claimed
    run_id: str
    flow: str
    ok: bool
    started_at: int
    ended_at: int
    code: str | None = None
    message: str | None = None
    carried: str | None = None  # after a traced failure: the traceparent column's new value
    retry_in_ms: int | None = None  # a failure under a back-off: due again this long after it
    traceback: str | None = None  # a failure: the handler's traceback, its last 8 KiB


# Keys are indexed beside the queue name (up to 401 characters) and PostgreSQL's btree rows hold
# at most 2704 bytes: 1000 bytes of key keeps the worst case (4-byte characters everywhere) inside.
MAX_KEY_BYTES = 1000


def check_key(signal: str, key: str | None) -> None:
    """Refuse a key no backend can store alike: NUL (PostgreSQL text cannot hold it), lone
    surrogates (not UTF-8) and more than MAX_KEY_BYTES of UTF-8 (too big to index)."""
    if key is None:
        return
    if "\x00" in key:
        raise ValueError(f'emit("{signal}", key=...): a key may not contain NUL characters')
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as err:
        raise ValueError(f'emit("{signal}", key=...): a key must be valid Unicode text ({err.reason})') from None
    if size > MAX_KEY_BYTES:
        raise ValueError(
            f'emit("{signal}", key=...): a key has at most {MAX_KEY_BYTES} bytes in UTF-8, this one has {size}'
        )


def check_keys(rows: Sequence[NewMessage]) -> None:
    """`check_key` for every row, before any write, so a bad key stores nothing on either backend."""
    for row in rows:
        check_key(row.signal, row.key)


def queue_name(signal: str, flow: str | None, kind: str) -> str:
    """Once messages queue by signal; each broadcast copy queues by signal and flow."""
    return signal if kind == "once" else f"{signal}\x1f{flow}"


def ensure_schema(conn: Connection) -> None:
    """Create missing tables and indexes and record the schema version (idempotent)."""
    schema.metadata.create_all(conn, checkfirst=True)
    for index in schema.SORT_INDEXES:  # create_all adds indexes with new tables only
        index.create(conn, checkfirst=True)
    for name in schema.RETIRED_SORT_INDEXES[conn.dialect.name]:
        conn.execute(text(f"DROP INDEX IF EXISTS {name}"))
    row = conn.execute(select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")).first()
    if row is None:
        counts.install(conn)
        conn.execute(schema.meta.insert().values(key="schema_version", value=str(schema.SCHEMA_VERSION)))
        search_index.install(conn)
        return
    found = int(row[0])
    if found > schema.SCHEMA_VERSION:
        raise SchemaTooNew(
            f"the store's schema is version {found}; this okengine knows up to "
            f"{schema.SCHEMA_VERSION}: upgrade okengine"
        )
    for version in range(found, schema.SCHEMA_VERSION):
        MIGRATIONS[version](conn)
    if found == schema.SCHEMA_VERSION and not search_index.available(conn):
        search_index.install(conn)  # pg_trgm may have been made available since the store was made
    if found < schema.SCHEMA_VERSION:
        conn.execute(
            schema.meta.update().where(schema.meta.c.key == "schema_version").values(value=str(schema.SCHEMA_VERSION))
        )


# from_version -> step that upgrades it by one (new tables come from create_all above).
MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    1: counts.install,  # 1 -> 2: message counters kept by triggers
    2: migrations.add_binding_activity,  # 2 -> 3: binding activity (binding_ttl, unbind), JSON Schemas
    3: migrations.add_message_timing,  # 3 -> 4: run_at, priority, dedupe (time and order options)
    4: migrations.collate_names_bytewise,  # 4 -> 5: names and ids compare bytewise on PostgreSQL
    5: migrations.add_audit_source,  # 5 -> 6: where an audited write came from (okconsole web)
    6: migrations.add_failure_traceback,  # 6 -> 7: each failure's traceback
    7: migrations.add_search_index,  # 7 -> 8: the text index behind search, filled in the background
    8: migrations.add_cancel_requests,  # 8 -> 9: operators' requests to stop a running handler
    9: migrations.add_windows_and_clocks,  # 9 -> 10: dedupe windows and clock triggers (new tables)
    10: migrations.add_flow_limits,  # 10 -> 11: flow limits: declared, overridden, and the rate log
}


class Store(abc.ABC):
    """One database, opened by one process. Thread- and task-safe."""

    dialect: str
    url: str
    # What this process's enqueues and settles counted for history since the last flush (each
    # store sets its own in __init__; the app's background pass writes it, engine/history.py).
    tally: HistoryTally

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def read(self, fn: Callable[[Connection], T]) -> T:
        """Run `fn` in a read transaction."""

    @abc.abstractmethod
    async def write(self, fn: Callable[[Connection], T]) -> T:
        """Run `fn` in a write transaction that commits whole or not at all."""

    @abc.abstractmethod
    async def enqueue(self, rows: Sequence[NewMessage]) -> str | None:
        """Store the rows in one transaction (many in chunks) and wake the workers of their queues.
        With a dedupe key held by a pending or inflight message (or by one finished within its
        `dedupe_for` window), nothing is stored and that message's id is returned (else None)."""

    @abc.abstractmethod
    async def enqueue_on(self, conn: AsyncConnection, rows: Sequence[NewMessage]) -> str | None:
        """Store the rows in the caller's open transaction (checked by store/caller.py): they exist
        iff it commits, and this process's workers are woken once it has. Dedupe as `enqueue`."""

    @abc.abstractmethod
    async def claim(self, queues: Sequence[str], worker_id: str, lease_ms: int, limit: int) -> list[Claimed]:
        """Take up to `limit` eligible messages (pending, or inflight past their lease), in seq order."""

    @abc.abstractmethod
    async def settle(self, worker_id: str, outcomes: Sequence[Outcome]) -> list[bool]:
        """Record outcomes and runs; returns, per outcome, whether this worker still held the lease."""

    @abc.abstractmethod
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
        """Settle `outcomes`, then claim up to `gated_limit` messages of the gated queues within
        their limits (exact across processes: counted in the claim's transaction, sql/gates.py),
        then up to `limit` less those from the plain `queues` as `claim` does."""

    # Claims one worker may have in flight at once, each on its own connection. More than one lets
    # a worker claim ahead of its free slots (engine/worker/claim_ahead.py); claims that would only
    # queue on one writer thread (SQLite's, when it is not a process of its own) keep one.
    concurrent_claims: int = 1

    # The most rows one claim asks for when a worker claims ahead (engine/worker/claim_ahead.py).
    claim_rows_max: int = 64

    # True where settling and claiming in one transaction saves a commit without losing overlap:
    # SQLite runs both on its one writer thread anyway, so one fsync replaces two.
    settles_with_claims: bool = False

    async def settle_and_claim(
        self, worker_id: str, outcomes: Sequence[Outcome], queues: Sequence[str], lease_ms: int, limit: int
    ) -> tuple[list[bool], list[Claimed]]:
        """`settle(outcomes)` then `claim(...)`; atomic (one commit) where `settles_with_claims`."""
        held = await self.settle(worker_id, outcomes) if outcomes else []
        return held, await self.claim(queues, worker_id, lease_ms, limit)

    async def paused_signals(self) -> frozenset[str]:
        """Every signal paused now: a worker reads it before a claim when its copy is stale."""
        return await self.read(pauses.paused_signals)

    async def limit_overrides(self) -> dict[str, limits.Override]:
        """Every operator override of a signal's flow limits: a worker reads them as it reads the
        paused set (engine/worker/limiting.py)."""
        return await self.read(limits.overrides)

    def pause_notices(self) -> PauseNotices | None:
        """Where this process hears of pause changes as they commit; None where it cannot (SQLite:
        its workers re-read the paused set every PAUSE_REFRESH_S)."""
        return None

    async def cancel_requests(self) -> dict[str, str]:
        """The standing requests to stop a handler (message id → note): a worker holding messages
        reads them now and then (engine/worker/cancelling.py), never on a claim or a settle."""
        from . import cancels  # it builds on this module's records

        return await self.read(cancels.requested)

    async def confirm_cancelled(self, worker_id: str, outcomes: Sequence[Outcome]) -> list[bool]:
        """End the messages of these stopped attempts dead (code Cancelled), fenced like a settle;
        per outcome, whether this worker still held it."""
        from . import cancels

        return await self.write(lambda conn: cancels.confirm(conn, worker_id, outcomes))

    def cancel_notices(self) -> PauseNotices | None:
        """Where this process hears of cancel requests as they commit (PostgreSQL's LISTEN); None
        where it cannot: its workers re-read the requests every CANCEL_POLL_S while they hold any."""
        return None

    def cancel_waker(self) -> Waker:
        """Woken by a cancel request committed in this process (and, on PostgreSQL, in any other)."""
        return Waker(self.url, CANCELS)

    # Where an emit may hand its message straight to an idle worker of any process, which then
    # skips its claim (PostgreSQL: engine/store/sql/handoff.py). Elsewhere the methods below do nothing.
    hands_off: bool = False

    def on_handed(self, worker_id: str, take: Callable[[int], None]) -> Callable[[], None]:
        """Call `take(seq)` for each message handed to this worker; returns the unsubscribe."""
        return lambda: None

    async def offer_idle(self, worker_id: str, queues: Sequence[str], lease_ms: int, hold_ms: int) -> bool:
        """Offer this idle worker to emits of `queues` for `hold_ms`, under leases of `lease_ms`;
        False where it is not offered (the store hands nothing off, or could not tell it now)."""
        return False

    async def withdraw_idle(self, worker_id: str) -> None:
        """Take this worker's offer back: no emit hands it anything after this returns."""
        return None

    async def handed(self, worker_id: str, seq: int) -> tuple[list[Claimed], int | None]:
        """The message `seq` handed to this worker, as a claim returns it ([] if it holds it no
        more), and the ms its lease has left by the store's lease clock (None with no message)."""
        return [], None

    async def renew_lease(self, worker_id: str, claimed: Claimed, lease_ms: int) -> bool:
        """Run a held lease again from now, fenced like a settle. A message claimed ahead that
        waited long for a slot starts on a whole lease; False if this worker lost it meanwhile."""

        def renew(conn: Connection) -> bool:
            now = lease_clock_ms(conn)
            held = conn.execute(_still_held(worker_id, claimed).values(lease_expires_at=now + lease_ms, updated_at=now))
            return held.rowcount == 1

        return await self.write(renew)

    async def hand_back(self, worker_id: str, unstarted: Sequence[Claimed]) -> int:
        """Messages this worker claimed ahead and never started, back to pending at a clean stop:
        due at once, the attempt their claim counted taken back, so another worker takes them now
        instead of after the lease. Fenced like a settle (one taken over meanwhile is left alone);
        returns how many went back."""
        attempts = schema.messages.c.attempts

        def release(conn: Connection) -> int:
            now = lease_clock_ms(conn)
            back = 0
            for claimed in unstarted:
                back += conn.execute(
                    _still_held(worker_id, claimed).values(
                        status="pending", locked_by=None, lease_expires_at=None, attempts=attempts - 1, updated_at=now
                    )
                ).rowcount
            if back:
                notify_queues(conn, sorted({claimed.queue for claimed in unstarted}))
            return back

        back = await self.write(release)
        if back:
            wake_local(self.url)  # this process's other workers (another app on the same store)
        return back

    async def next_due_in_ms(self, queues: Sequence[str]) -> int | None:
        """How long until the earliest pending message of `queues` that is not due yet becomes due,
        by the lease clock (None: none waits). An idle worker sleeps that long at most."""
        m = schema.messages

        def read(conn: Connection) -> int | None:
            now = lease_clock_ms(conn)
            earliest = conn.execute(
                select(func.min(m.c.run_at)).where(
                    m.c.status == "pending", m.c.run_at.is_not(None), m.c.run_at > now, m.c.queue.in_(list(queues))
                )
            ).scalar()
            return None if earliest is None else int(earliest) - now

        return await self.read(read)

    @abc.abstractmethod
    def waker(self) -> Waker:
        """A wake-up source for one worker loop: set when new work may be ready."""

    @abc.abstractmethod
    def tape_waker(self, signal: str) -> Waker:
        """A wake-up source for the readers of one live tape: set when it may have new events."""


def _still_held(worker_id: str, claimed: Claimed) -> Update:
    """An update of `claimed`'s row only while this worker holds that attempt (the settle's fence)."""
    m = schema.messages
    return update(m).where(
        m.c.seq == claimed.seq, m.c.attempts == claimed.attempts, m.c.locked_by == worker_id, m.c.status == "inflight"
    )


def lease_clock_ms(conn: Connection) -> int:
    """Now, by the clock leases are judged by: PostgreSQL's own (claims on many machines share it),
    this machine's on SQLite (its workers share this machine)."""
    if conn.dialect.name == "postgresql":
        return int(conn.execute(text(POSTGRES_LEASE_CLOCK)).scalar_one())
    return now_ms()
