"""Every table and index of the store, in one place (SQLAlchemy Core).

Times are integers of epoch milliseconds. Payloads are JSON text (not jsonb)
so any JSON string survives both backends byte for byte, NUL escapes included.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Boolean, Column, Index, Integer, MetaData, String, Table, Text, text
from sqlalchemy.engine import Dialect

# 2: per-status message counters kept by triggers (store/counts.py)
# 3: bindings' last_seen / ttl_ms / retired_at (binding_ttl, unbind) and each signal's JSON Schema
# 4: messages' run_at / priority / dedupe (delay, at, back-off, priority, dedupe) and traceparent
#    (OpenTelemetry context), the ready index ordered by priority, the dedupe and scheduled indexes;
#    paused signals; new tables (create_all adds them): the workers' heartbeats (oke_workers) and
#    per signal and minute history (oke_history, store/history.py)
# 5: names and ids compare bytewise on PostgreSQL (COLLATE "C"), whatever the database's locale
# 6: the audit's source (where a write came from: `okconsole web` records the browser's address)
# 7: failures' traceback (the handler's, its last 8 KiB)
# 8: the text index behind the console's search (store/search_index.py: FTS5 or pg_trgm), outside
#    this metadata, and its high-water marks in oke_meta
# 9: operators' requests to stop a running handler (oke_cancels, a new table: store/cancels.py)
# 10: dedupe keys held for a window after their message finished (oke_dedupe_holds) and the clock
#    triggers each app declared (oke_clocks); new tables only (create_all adds them)
# 11: flow limits: each signal's declared concurrency and rate (oke_signals), an operator's
#    overrides (oke_limits) and the rate-limited starts of the last window (oke_rate_starts)
SCHEMA_VERSION = 11
READY = "status IN ('pending', 'inflight')"

metadata = MetaData()


def Name(length: int | None = None) -> Any:
    """A name, id or status: compared bytewise on PostgreSQL (`COLLATE "C"`) as on SQLite (BINARY).

    Under a database locale such as en_US.UTF-8 (the default of the official Docker image) every
    index entry of a text column is placed by strcoll(), which doubles index upkeep on the hot path
    (docs/design/sort-indexes.md). Free text
    (payloads, messages, reasons) and message keys keep the database's collation: the console's
    search folds their case with it, and sorts keys by it."""
    plain = String(length) if length else Text()
    return plain.with_variant(String(length, collation="C") if length else Text(collation="C"), "postgresql")


def name_columns(table: Table, postgres: Dialect) -> list[Column[Any]]:
    """The columns of `table` made with `Name` (what schema 5 collated "C" on PostgreSQL), as
    `postgres`, a PostgreSQL dialect, spells their types."""
    return [c for c in table.columns if c.type.compile(dialect=postgres).endswith('COLLATE "C"')]


# An auto-increment 64-bit key; on SQLite it must be INTEGER to alias the rowid.
Seq = BigInteger().with_variant(Integer(), "sqlite")

meta = Table(
    "oke_meta",
    metadata,
    Column("key", Name(100), primary_key=True),
    Column("value", Text, nullable=False),
)

signals = Table(
    "oke_signals",
    metadata,
    Column("name", Name(200), primary_key=True),
    Column("kind", Name(20), nullable=False),
    Column("retries", Integer, nullable=False),
    Column("dead_letter", Boolean, nullable=False),
    Column("optional", Boolean, nullable=False),
    Column("retention", Text),  # JSON {"max_age": "7d", "max_count": N} or NULL
    Column("description", Text, nullable=False),
    Column("app", Name(200)),
    Column("updated_at", BigInteger, nullable=False),
    # The payload schema as JSON Schema text ("{}" without a schema); NULL when the schema is a
    # plain callable (or was never recorded): a console then cannot check a replacement payload.
    Column("json_schema", Text),
    # The flow limits the app declared (signal.once(..., concurrency=N, rate="N/1m")), NULL: none.
    Column("concurrency", Integer),
    Column("rate", Text),
)

bindings = Table(
    "oke_bindings",
    metadata,
    Column("signal", Name(200), primary_key=True),
    Column("flow", Name(200), primary_key=True),
    Column("kind", Name(20), nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    # When a process last ran with this binding (boot, then its heartbeat), and for how long after
    # that the binding stays active (the binding_ttl of that process): broadcast copies go only to
    # active bindings. retired_at: an operator's `unbind` (NULL while bound).
    Column("last_seen", BigInteger),
    Column("ttl_ms", BigInteger),
    Column("retired_at", BigInteger),
)

messages = Table(
    "oke_messages",
    metadata,
    Column("seq", Seq, primary_key=True, autoincrement=True),
    Column("id", Name(40), nullable=False, unique=True),
    Column("signal", Name(200), nullable=False),
    # What workers claim from: the signal for once, "signal\x1fflow" for a broadcast copy.
    Column("queue", Name(401), nullable=False),
    Column("flow", Name(200)),
    Column("key", Text),
    Column("payload", Text, nullable=False),
    Column("status", Name(10), nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("retries", Integer, nullable=False),
    Column("dead_letter", Boolean, nullable=False),
    Column("locked_by", Name(200)),
    Column("lease_expires_at", BigInteger),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    Column("finished_at", BigInteger),
    Column("parent_run_id", Name(40)),
    Column("replays", Integer, nullable=False, server_default=text("0")),
    # Not claimed before this time (a delay, an `at`, a back-off); NULL: due since it was stored.
    Column("run_at", BigInteger),
    # Among due messages of a queue, higher is claimed first (emit order still wins within a key).
    Column("priority", Integer, nullable=False, server_default=text("0")),
    # The emit's dedupe key: one pending or inflight message per (signal, dedupe).
    Column("dedupe", Name()),
    # W3C traceparent of the span that emitted it; after a traced failure also the failed attempt's
    # (`<emitting>;<failed>`, engine/telemetry/tracing.py). NULL without OpenTelemetry.
    Column("traceparent", Text),
)

# A dedupe key held for a window after its message finished (`emit(dedupe=K, dedupe_for=D)`):
# held while the message `msg_id` is pending or inflight, then until its finished_at + window_ms.
# `until` is set when retention deletes the message, so the key stays held without it.
dedupe_holds = Table(
    "oke_dedupe_holds",
    metadata,
    Column("queue", Name(401), primary_key=True),
    Column("dedupe", Name(), primary_key=True),
    Column("msg_id", Name(40), nullable=False, index=True),
    Column("window_ms", BigInteger, nullable=False),
    Column("until", BigInteger, index=True),
)

# The clock triggers apps declared (`on(clock.every(...) / clock.cron(...), flow)`), upserted at
# boot: what the console lists beside each clock's implicit signal's last message.
clocks = Table(
    "oke_clocks",
    metadata,
    Column("flow", Name(200), primary_key=True),
    Column("signal", Name(200), nullable=False),
    Column("spec", Text, nullable=False),
    Column("tz", Name(100), nullable=False),
    Column("catch_up", Boolean, nullable=False),
    Column("app", Name(200)),
    Column("updated_at", BigInteger, nullable=False),
)

# Signals an operator paused: no process claims their messages while a row is here. A table of
# its own, so the boot's upsert of oke_signals never clears a pause.
pauses = Table(
    "oke_pauses",
    metadata,
    Column("signal", Name(200), primary_key=True),
    Column("paused_at", BigInteger, nullable=False),
    Column("actor", Name(200), nullable=False),
    Column("reason", Text),
)


# An operator's request to stop a message's running handler (engine/store/cancels.py): the holder's
# worker cancels the handler and ends the message dead, deleting the row in that transaction. A
# row stands while the message is pending or inflight; `cancel` prunes the rest.
cancels = Table(
    "oke_cancels",
    metadata,
    Column("message_id", Name(40), primary_key=True),
    Column("signal", Name(200), nullable=False),
    Column("requested_at", BigInteger, nullable=False),
    Column("actor", Name(200), nullable=False),
    Column("reason", Text),
)


# An operator's overrides of a signal's declared flow limits (`okconsole limit`), until a reset
# deletes the row. Per limit: NULL follows the declaration, 0 / "none" lifts it, else the value.
limits = Table(
    "oke_limits",
    metadata,
    Column("signal", Name(200), primary_key=True),
    Column("concurrency", Integer),
    Column("rate", Text),
    Column("set_at", BigInteger, nullable=False),
    Column("actor", Name(200), nullable=False),
    Column("reason", Text),
)

# The handler starts of rate-limited queues inside their window (engine/store/sql/gates.py): a
# gated claim logs one row for the `n` starts it made at `at` and deletes the ones older than the
# window (a row a claim, not a start: a generous limit's window holds its claims, not its messages).
rate_starts = Table(
    "oke_rate_starts",
    metadata,
    Column("id", Seq, primary_key=True, autoincrement=True),
    Column("queue", Name(401), nullable=False),
    Column("at", BigInteger, nullable=False),
    Column("n", Integer, nullable=False, server_default=text("1")),
)
Index("oke_rate_starts_queue", rate_starts.c.queue, rate_starts.c.at)


# Every running worker pool, upserted at its start and by its heartbeat (engine/heartbeat.py); times by
# the store's lease clock. A clean stop sets stopped_at; rows not seen for an hour are deleted.
workers = Table(
    "oke_workers",
    metadata,
    Column("worker_id", Name(200), primary_key=True),
    Column("app", Name(200), nullable=False),
    Column("host", Name(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", BigInteger, nullable=False),
    Column("last_seen", BigInteger, nullable=False),
    Column("stopped_at", BigInteger),
    Column("concurrency", Integer, nullable=False),
    Column("held", Integer, nullable=False),  # leases the pool held at its last beat
)


def _partial_index(name: str, *columns: Any, where: str, unique: bool = False) -> Index:
    """An index over only the rows where `where` holds, the same on SQLite and PostgreSQL."""
    return Index(name, *columns, unique=unique, sqlite_where=text(where), postgresql_where=text(where))


# The claim scans only ready rows, higher priority first, then in emit order (partial: delivered
# rows cost nothing). Every row has priority 0 unless an emit asked otherwise, so without the
# option the scan is the seq order it always was.
READY_INDEX = _partial_index("oke_messages_ready", messages.c.priority.desc(), messages.c.seq, where=READY)
# One pending or inflight message per (queue, dedupe key): an emit's INSERT … ON CONFLICT DO
# NOTHING names this index's columns and predicate, so concurrent emits store exactly one. A queue
# is the signal for a once message, so this is one per (signal, key); each broadcast copy has its own.
DEDUPE_LIVE = "dedupe IS NOT NULL AND " + READY
DEDUPE_INDEX = _partial_index(
    "oke_messages_dedupe", messages.c.queue, messages.c.dedupe, where=DEDUPE_LIVE, unique=True
)
# Pending messages with a due time, by queue: an idle worker reads the next run_at here to sleep
# until then. Partial: rows due since they were stored are not in it.
SCHEDULED = "status = 'pending' AND run_at IS NOT NULL"
SCHEDULED_INDEX = _partial_index("oke_messages_scheduled", messages.c.queue, messages.c.run_at, where=SCHEDULED)
TIME_INDEXES = (READY_INDEX, DEDUPE_INDEX, SCHEDULED_INDEX)
# Per-key FIFO: the head of a key among ready rows.
_partial_index(
    "oke_messages_ready_key",
    messages.c.queue,
    messages.c.key,
    messages.c.seq,
    where=READY + " AND key IS NOT NULL",
)
# Lists by status newest first (and dead letters).
Index("oke_messages_signal_status", messages.c.signal, messages.c.status, messages.c.seq)
# Keyed lists and trace children. Partial: a status change rewrites every index entry of its row
# on PostgreSQL (never a HOT update), so unkeyed and parentless messages are kept out of these two
# (docs/design/sort-indexes.md). Queries by key = / parent = ... still use them.
# Stores created before schema 2 keep their full indexes of the same names (same answers).
_KEYED = "key IS NOT NULL"
_CHILD = "parent_run_id IS NOT NULL"
_partial_index(
    "oke_messages_signal_key",
    messages.c.signal,
    messages.c.key,
    messages.c.seq,
    where=_KEYED,
)
_partial_index("oke_messages_parent", messages.c.parent_run_id, where=_CHILD)

# The console's sorted lists (engine/ops/listing.py): one (signal, column, seq) index per sortable
# column that no index above orders (status and key have theirs). The lease and its holder exist
# only on inflight rows, so their sorts read those rows from (signal, status, seq) and need no index.
# Each store keeps the hot path's cost of these indexes low in its own way (docs/design/sort-indexes.md):
# - PostgreSQL gives a row new entries in every index on each claim and settle (an update of a
#   status is never HOT), so its indexes leave inflight rows out: a claim writes none of their entries, a
#   settle one per index. The few inflight rows are read apart and merged in.
# - SQLite touches only the indexes whose columns (or partial WHERE) an update changes, so an index
#   over every row on a column no claim or settle writes (id, created_at) costs them nothing, while
#   a `status <> 'inflight'` one costs a delete and an insert per message. attempts changes on each
#   claim either way: it leaves inflight rows out.
# Added to existing stores by ensure_schema (IF NOT EXISTS), which also drops the store's
# RETIRED_SORT_INDEXES, so no schema version step.
SETTLED = "status <> 'inflight'"


def _settled_on_postgres(name: str, *columns: Any) -> Index:
    return _partial_index(name, *columns, where=SETTLED).ddl_if(dialect="postgresql")


def _full_on_sqlite(name: str, *columns: Any) -> Index:
    return Index(name, *columns).ddl_if(dialect="sqlite")


SORT_INDEXES = (
    _settled_on_postgres("oke_messages_settled_id", messages.c.signal, messages.c.id),
    _full_on_sqlite("oke_messages_signal_id", messages.c.signal, messages.c.id),
    _settled_on_postgres("oke_messages_settled_created", messages.c.signal, messages.c.created_at, messages.c.seq),
    _full_on_sqlite("oke_messages_signal_created", messages.c.signal, messages.c.created_at, messages.c.seq),
    _partial_index(
        "oke_messages_settled_attempts", messages.c.signal, messages.c.attempts, messages.c.seq, where=SETTLED
    ),
    _partial_index(
        "oke_messages_signal_parent",
        messages.c.signal,
        messages.c.parent_run_id,
        messages.c.seq,
        where=_CHILD,
    ),
)
# Sort indexes an earlier okengine created, per store: dropped at boot (the ones above replace them).
_RETIRED_EVERYWHERE = ("oke_messages_signal_attempts", "oke_messages_signal_owner", "oke_messages_signal_lease")
RETIRED_SORT_INDEXES = {
    "postgresql": ("oke_messages_signal_id", "oke_messages_signal_created", *_RETIRED_EVERYWHERE),
    "sqlite": ("oke_messages_settled_id", "oke_messages_settled_created", *_RETIRED_EVERYWHERE),
}

# Messages per signal and status, kept by triggers (store/counts.py): the overview reads these,
# not the messages. PostgreSQL's triggers append to count_deltas, folded into counts now and then.
counts = Table(
    "oke_counts",
    metadata,
    Column("signal", Name(200), primary_key=True),
    Column("status", Name(10), primary_key=True),
    Column("n", BigInteger, nullable=False),
)

count_deltas = Table(
    "oke_count_deltas",
    metadata,
    Column("signal", Name(200), nullable=False),
    Column("status", Name(10), nullable=False),
    Column("n", BigInteger, nullable=False),
)

failures = Table(
    "oke_failures",
    metadata,
    Column("id", Seq, primary_key=True, autoincrement=True),
    Column("message_id", Name(40), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("code", Text, nullable=False),
    Column("message", Text, nullable=False),
    Column("at", BigInteger, nullable=False),
    Column("run_id", Name(40)),
    # "failure" for a failed attempt, "replayed" for an operator's replay marker.
    Column("kind", Name(10), nullable=False, server_default=text("'failure'")),
    # The handler's traceback, its last 8 KiB (engine/failures.py); NULL for a failure no
    # handler raised (a cancel, an unbind, a replay marker) and for rows written before schema 7.
    Column("traceback", Text),
)
Index("oke_failures_message", failures.c.message_id, failures.c.id)

runs = Table(
    "oke_runs",
    metadata,
    Column("run_id", Name(40), primary_key=True),
    Column("flow", Name(200)),
    Column("trigger", Name(200)),
    Column("signal", Name(200)),
    Column("message_id", Name(40)),
    Column("parent_run_id", Name(40)),
    Column("status", Name(12), nullable=False),
    Column("attempt", Integer),
    Column("worker_id", Name(200)),
    Column("started_at", BigInteger, nullable=False),
    Column("ended_at", BigInteger),
    Column("error", Text),
)
_partial_index("oke_runs_parent", runs.c.parent_run_id, where=_CHILD)
Index("oke_runs_message", runs.c.message_id)

steps = Table(
    "oke_steps",
    metadata,
    Column("message_id", Name(40), primary_key=True),
    Column("name", Name(200), primary_key=True),
    Column("result", Text, nullable=False),
    Column("run_id", Name(40)),
    Column("at", BigInteger, nullable=False),
)

audit = Table(
    "oke_audit",
    metadata,
    Column("id", Seq, primary_key=True, autoincrement=True),
    Column("at", BigInteger, nullable=False),
    Column("actor", Name(200), nullable=False),
    Column("action", Name(40), nullable=False),
    Column("signal", Name(200)),
    Column("count", Integer, nullable=False),
    Column("ids", Text, nullable=False),  # JSON list
    Column("reason", Text),
    Column("source", Text),  # e.g. "web 203.0.113.7:51234"; NULL: not made from a browser
)

tapes = Table(
    "oke_tapes",
    metadata,
    Column("signal", Name(200), primary_key=True),
    Column("epoch", Name(40), nullable=False),
    Column("head", BigInteger, nullable=False),
    Column("pruned_through", BigInteger, nullable=False),
    Column("pruned_count", BigInteger, nullable=False, server_default=text("0")),
    Column("created_at", BigInteger, nullable=False),
)

tape_events = Table(
    "oke_tape_events",
    metadata,
    Column("signal", Name(200), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("payload", Text, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("parent_run_id", Name(40)),
)
Index("oke_tape_events_age", tape_events.c.signal, tape_events.c.created_at)

# Per signal and minute (epoch ms of its start): messages emitted (one per broadcast copy),
# delivered, failed (an attempt that failed and was retried), dead, and deleted by retention
# (`pruned` messages, `pruned_runs` runs). Written by store/history.py, kept for history_ttl.
history = Table(
    "oke_history",
    metadata,
    Column("signal", Name(200), primary_key=True),
    Column("minute", BigInteger, primary_key=True),
    *(
        Column(name, BigInteger, nullable=False, server_default=text("0"))
        for name in ("emitted", "delivered", "failed", "dead", "pruned", "pruned_runs")
    ),
)
