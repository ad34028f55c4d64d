"""Message counts per signal and status, kept by the database itself (triggers).

Counting a million rows per status on every console refresh costs seconds; these counters make the
overview O(signals). Triggers keep them, so every writer (claim, settle, replay, purge, an operator's
SQL, an older process) is counted alike and nothing in the engine can forget to.

SQLite has one writer at a time, so row triggers update `oke_counts` directly. PostgreSQL has many
concurrent writers: updating one counter row per status would serialise every claim and settle on that
row's lock, so statement triggers append deltas to `oke_count_deltas` (insert-only, no contention) and
`compact` folds them into `oke_counts` now and then, under an advisory lock. A count is always
`oke_counts.n` plus its pending deltas, read in one statement, so it is exact at any moment.
"""

from __future__ import annotations

from sqlalchemy import Connection, func, select, union_all

from . import schema

COMPACT_LOCK = 0x6F6B6502  # advisory lock of the PostgreSQL compactor (one at a time)

_SQLITE_TRIGGERS = (
    """CREATE TRIGGER IF NOT EXISTS oke_count_insert AFTER INSERT ON oke_messages BEGIN
         INSERT INTO oke_counts (signal, status, n) VALUES (new.signal, new.status, 1)
           ON CONFLICT (signal, status) DO UPDATE SET n = n + 1;
       END""",
    """CREATE TRIGGER IF NOT EXISTS oke_count_update AFTER UPDATE OF status, signal ON oke_messages
       WHEN old.status IS NOT new.status OR old.signal IS NOT new.signal BEGIN
         UPDATE oke_counts SET n = n - 1 WHERE signal = old.signal AND status = old.status;
         INSERT INTO oke_counts (signal, status, n) VALUES (new.signal, new.status, 1)
           ON CONFLICT (signal, status) DO UPDATE SET n = n + 1;
       END""",
    """CREATE TRIGGER IF NOT EXISTS oke_count_delete AFTER DELETE ON oke_messages BEGIN
         UPDATE oke_counts SET n = n - 1 WHERE signal = old.signal AND status = old.status;
       END""",
)

_POSTGRES_FUNCTIONS = (
    """CREATE OR REPLACE FUNCTION oke_count_insert() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         INSERT INTO oke_count_deltas (signal, status, n)
         SELECT signal, status, count(*) FROM oke_new GROUP BY signal, status;
         RETURN NULL;
       END $$""",
    """CREATE OR REPLACE FUNCTION oke_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         INSERT INTO oke_count_deltas (signal, status, n)
         SELECT signal, status, sum(d) FROM (
           SELECT signal, status, -1 AS d FROM oke_old
           UNION ALL SELECT signal, status, 1 FROM oke_new) AS moved
         GROUP BY signal, status HAVING sum(d) <> 0;
         RETURN NULL;
       END $$""",
    """CREATE OR REPLACE FUNCTION oke_count_delete() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         INSERT INTO oke_count_deltas (signal, status, n)
         SELECT signal, status, -count(*) FROM oke_old GROUP BY signal, status;
         RETURN NULL;
       END $$""",
)

_POSTGRES_TRIGGERS = (
    """CREATE OR REPLACE TRIGGER oke_count_insert AFTER INSERT ON oke_messages
       REFERENCING NEW TABLE AS oke_new FOR EACH STATEMENT EXECUTE FUNCTION oke_count_insert()""",
    """CREATE OR REPLACE TRIGGER oke_count_update AFTER UPDATE ON oke_messages
       REFERENCING OLD TABLE AS oke_old NEW TABLE AS oke_new
       FOR EACH STATEMENT EXECUTE FUNCTION oke_count_update()""",
    """CREATE OR REPLACE TRIGGER oke_count_delete AFTER DELETE ON oke_messages
       REFERENCING OLD TABLE AS oke_old FOR EACH STATEMENT EXECUTE FUNCTION oke_count_delete()""",
)

# Run by PostgresStore every few seconds, under pg_try_advisory_xact_lock(COMPACT_LOCK).
COMPACT_SQL = """
WITH moved AS (DELETE FROM oke_count_deltas RETURNING signal, status, n)
INSERT INTO oke_counts (signal, status, n)
SELECT signal, status, sum(n) FROM moved GROUP BY signal, status ORDER BY signal, status
ON CONFLICT (signal, status) DO UPDATE SET n = oke_counts.n + excluded.n
"""

TRY_COMPACT_LOCK_SQL = "SELECT pg_try_advisory_xact_lock($1)"  # $1: COMPACT_LOCK

# The planner's statistics of oke_messages lag far behind its rows (a fresh store, a burst): more
# rows changed since the last ANALYZE than half the table. Autovacuum would get there within a
# minute or so; meanwhile the claim is planned for a near-empty table (a bitmap scan and a sort of
# every ready row, 15 ms at 20,000 rows instead of 0.5 ms), so the compactor analyzes it now.
STATS_STALE_SQL = """
SELECT n_mod_since_analyze > 1000 + n_live_tup / 2 FROM pg_stat_user_tables
 WHERE relid = 'oke_messages'::regclass
"""

ANALYZE_SQL = "ANALYZE oke_messages"


def install(conn: Connection) -> None:
    """Create the triggers, then count what is already stored (schema creation and upgrade).

    Triggers first: on PostgreSQL creating them locks out writers until this transaction commits,
    so the count that follows sees every row and every later write fires a trigger.
    """
    if conn.dialect.name == "postgresql":
        for ddl in (*_POSTGRES_FUNCTIONS, *_POSTGRES_TRIGGERS):
            conn.exec_driver_sql(ddl)
        conn.execute(schema.count_deltas.delete())
    else:
        for ddl in _SQLITE_TRIGGERS:
            conn.exec_driver_sql(ddl)
    m = schema.messages
    conn.execute(schema.counts.delete())
    conn.execute(
        schema.counts.insert().from_select(
            ["signal", "status", "n"], select(m.c.signal, m.c.status, func.count()).group_by(m.c.signal, m.c.status)
        )
    )


def status_counts(conn: Connection) -> dict[tuple[str, str], int]:
    """(signal, status) -> messages, exact as of this statement's snapshot (one statement reads
    the counters and the pending deltas, so a concurrent fold is seen whole or not at all)."""
    c, d = schema.counts, schema.count_deltas
    parts = union_all(select(c.c.signal, c.c.status, c.c.n), select(d.c.signal, d.c.status, d.c.n)).subquery()
    rows = conn.execute(
        select(parts.c.signal, parts.c.status, func.sum(parts.c.n)).group_by(parts.c.signal, parts.c.status)
    )
    return {(signal, status): int(n) for signal, status, n in rows if n}
