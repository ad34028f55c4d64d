"""The text index behind the console's search: SQLite FTS5 (trigram) or PostgreSQL pg_trgm (GIN).

Why a separate index, filled in the background: an index over oke_messages' payload would be
written by every emit (and, on PostgreSQL, by every claim and settle, which are never HOT updates).
Here emits and claims write nothing; the app's background pass (engine/search_indexing.py) copies
new rows into the index in batches and moves two high-water marks kept in oke_meta:

- `search_seq`: every message with seq ≤ it is in the index;
- `search_failure_id`: every failure row with id ≤ it has been applied: the message it belongs to
  was indexed again with its latest failure message (and payload: a replay with an edited payload
  writes such a row too).

A search reads the index for candidates and scans directly the rows past the marks (the newest
messages, and the messages with failure rows not applied yet), then checks every candidate with the
exact filter (engine/ops/listing.py): the index only narrows, so the answer is what a scan gives.
Deleting a message deletes its entry (`forget`) in the same transaction.

On PostgreSQL sequence values commit out of order: a mark moves only up to a seq (or failure id)
seen while every transaction that could still write a lower one has finished (`Horizon`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, text

from . import schema

MESSAGES_MARK = "search_seq"
FAILURES_MARK = "search_failure_id"
MIN_NEEDLE = 3  # a trigram index finds nothing shorter: such a search scans, as it always did
TAIL_MAX = 50_000  # rows past a mark a search still scans directly; further behind, it scans windows
SQLITE_TABLE = "oke_search_fts"
PG_TABLE = "oke_search"
FAILURES_INDEX = "oke_failures_message_trgm"  # PostgreSQL only: failure messages, for the walk's search
log = logging.getLogger("engine.search")

_LAST_FAILURE = (
    "(SELECT f.message FROM oke_failures f WHERE f.message_id = m.id AND f.kind = 'failure' ORDER BY f.id DESC LIMIT 1)"
)
# What one message puts in the index: its payload (JSON text), key and latest failure message.
_SQLITE_ROWS = (
    f"INSERT OR REPLACE INTO {SQLITE_TABLE} (rowid, signal, payload, key, failure) "
    f"SELECT m.seq, m.signal, m.payload, coalesce(m.key, ''), coalesce({_LAST_FAILURE}, '') FROM oke_messages m "
)
# PostgreSQL keeps one lowered document: the search's `lower(column) LIKE` then holds for it too.
_PG_ROWS = (
    f"INSERT INTO {PG_TABLE} (seq, signal, doc) "
    "SELECT m.seq, m.signal, lower(m.payload) || chr(10) || lower(coalesce(m.key, '')) || chr(10) || "
    f"lower(coalesce({_LAST_FAILURE}, '')) FROM oke_messages m "
)
_PG_UPSERT = " ON CONFLICT (seq) DO UPDATE SET doc = excluded.doc"


# -- the index's tables ---------------------------------------------------------------------------
def install(conn: Connection) -> bool:
    """Create the index where the store can have one (idempotent, run at every boot); False when it
    cannot (SQLite without FTS5's trigram tokenizer, PostgreSQL without pg_trgm): search then scans."""
    try:
        with conn.begin_nested():
            if conn.dialect.name == "postgresql":
                _install_postgres(conn)
            else:
                conn.execute(
                    text(
                        f"CREATE VIRTUAL TABLE IF NOT EXISTS {SQLITE_TABLE} "
                        "USING fts5(signal UNINDEXED, payload, key, failure, tokenize='trigram')"
                    )
                )
    except Exception as err:  # a missing extension or module: the store works, search scans
        log.warning("no text index for search (%s): searches scan the signal in windows", err)
        return False
    for mark in (MESSAGES_MARK, FAILURES_MARK):
        if conn.execute(schema.meta.select().where(schema.meta.c.key == mark)).first() is None:
            conn.execute(schema.meta.insert().values(key=mark, value="0"))
    return True


def _install_postgres(conn: Connection) -> None:
    """pg_trgm is a trusted extension: the database's owner may create it."""
    conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_trgm"))
    conn.execute(
        text(f"CREATE TABLE IF NOT EXISTS {PG_TABLE} (seq BIGINT PRIMARY KEY, signal TEXT NOT NULL, doc TEXT NOT NULL)")
    )
    conn.execute(text(f"CREATE INDEX IF NOT EXISTS {PG_TABLE}_doc ON {PG_TABLE} USING gin (doc gin_trgm_ops)"))
    # A common needle is searched by walking the signal, and its failure-message test is one hashed
    # subquery over oke_failures: with this index it reads the matching failures, not every one.
    # Only failed attempts write it, never the emit, claim or settle of a message that succeeds.
    conn.execute(
        text(f"CREATE INDEX IF NOT EXISTS {FAILURES_INDEX} ON oke_failures USING gin (lower(message) gin_trgm_ops)")
    )


def available(conn: Connection) -> bool:
    """Whether this store has the index (install succeeded once)."""
    if conn.dialect.name == "postgresql":
        found = conn.execute(text(f"SELECT to_regclass('{PG_TABLE}_doc') IS NOT NULL")).scalar()
    else:
        found = conn.execute(
            text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :n"), {"n": SQLITE_TABLE}
        ).first()
    return bool(found)


def forget(conn: Connection, seqs: Sequence[int]) -> None:
    """Deleted messages leave the index (in the deleting transaction)."""
    if not seqs or not available(conn):
        return
    table, key = (PG_TABLE, "seq") if conn.dialect.name == "postgresql" else (SQLITE_TABLE, "rowid")
    for start in range(0, len(seqs), 500):
        chunk = [int(s) for s in seqs[start : start + 500]]
        conn.execute(text(f"DELETE FROM {table} WHERE {key} IN ({', '.join(map(str, chunk))})"))


# -- where the index stands ---------------------------------------------------------------------
@dataclass(frozen=True)
class Marks:
    """The two high-water marks and the newest seq and failure id: what a search scans directly."""

    seq: int
    failure_id: int
    newest_seq: int
    newest_failure_id: int

    @property
    def caught_up(self) -> bool:
        """Few enough rows past the marks for a search to scan them on every page."""
        return self.newest_seq - self.seq <= TAIL_MAX and self.newest_failure_id - self.failure_id <= TAIL_MAX


def marks(conn: Connection) -> Marks | None:
    """The index's marks; None without an index."""
    if not available(conn):
        return None
    got = dict(
        conn.execute(
            schema.meta.select()
            .with_only_columns(schema.meta.c.key, schema.meta.c.value)
            .where(schema.meta.c.key.in_((MESSAGES_MARK, FAILURES_MARK)))
        ).all()
    )
    newest_seq = conn.execute(text("SELECT max(seq) FROM oke_messages")).scalar() or 0
    newest_failure = conn.execute(text("SELECT max(id) FROM oke_failures")).scalar() or 0
    return Marks(int(got.get(MESSAGES_MARK, 0)), int(got.get(FAILURES_MARK, 0)), int(newest_seq), int(newest_failure))


def usable_needle(needle: str) -> bool:
    """A trigram index answers substrings of three characters or more (and no NUL)."""
    return len(needle) >= MIN_NEEDLE and "\x00" not in needle


# -- a safe place for a mark ----------------------------------------------------------------------
@dataclass(frozen=True)
class Sighting:
    """The newest id visible, and the snapshot's xmax when it was read (PostgreSQL)."""

    through: int
    xmax: int


class Horizon:
    """How far a mark may move. On SQLite one writer commits in seq order: what is visible is final.
    On PostgreSQL a transaction may commit seq 100 after another committed 101; once every
    transaction running when 101 was seen has ended (the snapshot's xmin has passed that sighting's
    xmax), nothing at or below 101 can still appear."""

    def __init__(self) -> None:
        self._seen: Sighting | None = None

    def settled(self, through: int, xmin: int | None, xmax: int | None) -> int | None:
        """The highest id no later commit can go below, from a new reading; None: none yet."""
        if xmin is None or xmax is None:
            return through
        done = self._seen.through if self._seen is not None and xmin >= self._seen.xmax else None
        if self._seen is None or done is not None:
            self._seen = Sighting(through, xmax)
        return done


def newest(conn: Connection) -> tuple[int, int, int | None, int | None]:
    """The newest seq and failure id visible, with the snapshot's xmin and xmax (None on SQLite)."""
    if conn.dialect.name == "postgresql":
        row = conn.execute(
            text(
                "SELECT (SELECT max(seq) FROM oke_messages), (SELECT max(id) FROM oke_failures), "
                "pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint FROM pg_current_snapshot() s"
            )
        ).one()
        return int(row[0] or 0), int(row[1] or 0), int(row[2]), int(row[3])
    row = conn.execute(text("SELECT (SELECT max(seq) FROM oke_messages), (SELECT max(id) FROM oke_failures)")).one()
    return int(row[0] or 0), int(row[1] or 0), None, None


# -- indexing -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """What one batch did: rows indexed (new, and again after a failure), and whether more wait."""

    indexed: int
    reindexed: int
    more: bool


def next_range(mark: int, settled: int, batch: int) -> tuple[int, int] | None:
    """The ids (low exclusive, high inclusive) the next batch takes; None when nothing waits."""
    if settled <= mark:
        return None
    return mark, min(mark + batch, settled)


def index_batch(conn: Connection, settled_seq: int, settled_failure: int, batch: int) -> Step:
    """One batch, in the caller's write transaction: failure rows first (their messages indexed
    again), then new messages, each up to `batch` ids past its mark and no further than settled."""
    seq_mark, failure_mark = _locked_marks(conn)
    postgres = conn.dialect.name == "postgresql"
    insert, upsert = (_PG_ROWS, _PG_UPSERT) if postgres else (_SQLITE_ROWS, "")
    reindexed = indexed = 0
    failures = next_range(failure_mark, settled_failure, batch)
    if failures is not None:
        lo, hi = failures
        reindexed = conn.execute(
            text(
                insert + "WHERE m.seq <= :seq_mark AND m.id IN "
                "(SELECT message_id FROM oke_failures WHERE id > :lo AND id <= :hi)" + upsert
            ),
            {"seq_mark": seq_mark, "lo": lo, "hi": hi},
        ).rowcount
        _set_mark(conn, FAILURES_MARK, hi)
    messages = next_range(seq_mark, settled_seq, batch)
    if messages is not None:
        lo, hi = messages
        indexed = conn.execute(
            text(insert + "WHERE m.seq > :lo AND m.seq <= :hi" + upsert), {"lo": lo, "hi": hi}
        ).rowcount
        _set_mark(conn, MESSAGES_MARK, hi)
    more = (failures is not None and failures[1] < settled_failure) or (
        messages is not None and messages[1] < settled_seq
    )
    return Step(max(indexed, 0), max(reindexed, 0), more)


def _locked_marks(conn: Connection) -> tuple[int, int]:
    """Both marks, locked until the transaction ends on PostgreSQL (two indexers take turns)."""
    lock = " FOR UPDATE" if conn.dialect.name == "postgresql" else ""
    rows: dict[str, str] = dict(
        conn.execute(
            text(f"SELECT key, value FROM oke_meta WHERE key IN (:a, :b){lock}"),
            {"a": MESSAGES_MARK, "b": FAILURES_MARK},
        ).all()
    )
    return int(rows.get(MESSAGES_MARK, 0)), int(rows.get(FAILURES_MARK, 0))


def _set_mark(conn: Connection, key: str, value: int) -> None:
    conn.execute(schema.meta.update().where(schema.meta.c.key == key).values(value=str(value)))


# -- matching -------------------------------------------------------------------------------------
def needle_forms(needle: str) -> list[str]:
    """The lowered needle and its JSON-escaped form (payloads are JSON text: a quote is stored as \\")."""
    low = needle.lower()
    return list(dict.fromkeys([low, json.dumps(low, ensure_ascii=False)[1:-1]]))


def fts_query(needle: str) -> str:
    """An FTS5 query for any form of `needle` as a substring (each a quoted phrase)."""
    return " OR ".join('"' + form.replace('"', '""') + '"' for form in needle_forms(needle))


def like_pattern(form: str) -> str:
    """`form` as a LIKE pattern that matches it anywhere (escape character: backslash)."""
    escaped = form.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"
