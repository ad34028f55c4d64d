"""Upgrade steps for stores made by an older schema version (new tables come from create_all)."""

from __future__ import annotations

from sqlalchemy import Connection, inspect, text

from . import schema, search_index

# table -> columns version 3 added (all nullable: older rows read as "never recorded")
_V3_COLUMNS = {
    "oke_bindings": {"last_seen": "BIGINT", "ttl_ms": "BIGINT", "retired_at": "BIGINT"},
    "oke_signals": {"json_schema": "TEXT"},
}


# columns version 4 added to oke_messages (run_at / dedupe / traceparent NULL and priority 0: as before)
_V4_COLUMNS = {
    "oke_messages": {
        "run_at": "BIGINT",
        "priority": "INTEGER NOT NULL DEFAULT 0",
        "dedupe": "TEXT",
        "traceparent": "TEXT",
    },
}


# the column version 6 added to oke_audit (NULL: a write not made from `okconsole web`)
_V6_COLUMNS = {"oke_audit": {"source": "TEXT"}}

# the column version 7 added to oke_failures (NULL: no traceback recorded)
_V7_COLUMNS = {"oke_failures": {"traceback": "TEXT"}}

# the columns version 11 added to oke_signals (NULL: no limit declared)
_V11_COLUMNS = {"oke_signals": {"concurrency": "INTEGER", "rate": "TEXT"}}


def _add_columns(conn: Connection, tables: dict[str, dict[str, str]]) -> None:
    found = inspect(conn)
    for table, columns in tables.items():
        have = {c["name"] for c in found.get_columns(table)}
        for name, sql_type in columns.items():
            if name not in have:
                conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {name} {sql_type}"))


def add_binding_activity(conn: Connection) -> None:
    """2 -> 3: bindings' last_seen / ttl_ms / retired_at and signals' json_schema, added in place.

    A binding recorded before has no last_seen: readers fall back to its updated_at (when it was
    last recorded), which is what last_seen would have said."""
    _add_columns(conn, _V3_COLUMNS)


def add_message_timing(conn: Connection) -> None:
    """3 -> 4: messages' run_at, priority, dedupe and traceparent, added in place (the pauses and
    workers tables are new and come from create_all). Existing messages are due, of priority 0,
    without a dedupe key, untraced. The claim's ready index is rebuilt ordered by priority, and the
    dedupe and scheduled indexes added."""
    _add_columns(conn, _V4_COLUMNS)
    conn.execute(text("DROP INDEX IF EXISTS oke_messages_ready"))
    for index in schema.TIME_INDEXES:
        index.create(conn, checkfirst=True)


def collate_names_bytewise(conn: Connection) -> None:
    """4 -> 5: on PostgreSQL, every name, id and status column (schema.Name) collates "C", one
    ALTER TABLE a table: no table is rewritten, the indexes on those columns are rebuilt (on a
    large store this step takes as long as building them). SQLite compares them bytewise already."""
    if conn.dialect.name != "postgresql":
        return
    quote = conn.dialect.identifier_preparer.quote
    for table in schema.metadata.sorted_tables:
        alters = [
            f"ALTER COLUMN {quote(c.name)} TYPE {c.type.compile(dialect=conn.dialect)}"
            for c in schema.name_columns(table, conn.dialect)
        ]
        if alters:
            conn.execute(text(f"ALTER TABLE {table.name} {', '.join(alters)}"))


def add_audit_source(conn: Connection) -> None:
    """5 -> 6: the audit's `source`, added in place; rows written before read as NULL (not recorded)."""
    _add_columns(conn, _V6_COLUMNS)


def add_failure_traceback(conn: Connection) -> None:
    """6 -> 7: failures' `traceback`, added in place (no table rewrite on either store); failures
    recorded before read as NULL (no traceback kept)."""
    _add_columns(conn, _V7_COLUMNS)


def add_search_index(conn: Connection) -> None:
    """7 -> 8: the text index for search (store/search_index.py), empty: the app's background pass
    fills it from the existing messages in batches, and searches scan in windows until it has
    caught up. A store that cannot have one (no pg_trgm) keeps working and searching as before."""
    search_index.install(conn)


def add_cancel_requests(conn: Connection) -> None:
    """8 -> 9: the table of requests to stop a running handler (oke_cancels), empty. create_all
    makes it before the steps run; this step makes it again only where it is missing."""
    schema.cancels.create(conn, checkfirst=True)


def add_windows_and_clocks(conn: Connection) -> None:
    """9 -> 10: dedupe keys held for a window (oke_dedupe_holds) and the clocks apps declared
    (oke_clocks). Both are new tables, which create_all has made before this step runs; nothing
    of an older store changes."""
    del conn


def add_flow_limits(conn: Connection) -> None:
    """10 -> 11: signals' declared concurrency and rate (the overrides and the rate log are new
    tables from create_all). A signal recorded before declares no limit until its app boots again."""
    _add_columns(conn, _V11_COLUMNS)
