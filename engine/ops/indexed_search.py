"""A searched message page answered from the text index (engine/store/search_index.py).

Why three sources: the index holds the messages up to its marks; the newest messages (seq past
the mark) and the messages whose failure rows are not applied yet are read directly. Each
candidate is checked with the exact filter (listing.search_filter), so the page is what a scan
of the whole signal gives, at the cost of the matches rather than of the signal.

The index's hits are read first, at most CANDIDATES_MAX of them (a needle found more often than
that fills its pages from the windowed walk); newest (or oldest) first they are checked in that
order until the page is full, in another order every candidate is sorted.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Connection, Select, bindparam, column, func, literal_column, or_, select, table

from ..store import schema, search_index
from . import listing

m = schema.messages
f = schema.failures
CANDIDATES_MAX = 20_000
CHECK_BATCH = 200  # candidates checked against the exact filter per statement, newest first
_fts = table(search_index.SQLITE_TABLE, column("rowid"), column("signal"))
_trgm = table(search_index.PG_TABLE, column("seq"), column("signal"), column("doc"))


class IndexedSearch:
    """One searched page of `signal` from the index, the rows past its marks, and the exact filter."""

    def __init__(
        self,
        conn: Connection,
        signal: str,
        needle: str,
        filters: list[ColumnElement[bool]],
        marks: search_index.Marks,
    ) -> None:
        self.conn, self.signal, self.needle, self.marks = conn, signal, needle, marks
        self.filters = filters  # they include the exact search filter
        # the signal compared so no index on it serves a statement: candidates are read by seq (or
        # id), never by walking the signal's index to them, which a planner without statistics picks
        self.same_signal = listing.unindexed(m.c.signal) == signal
        self.postgres = conn.dialect.name == "postgresql"
        self._pending: list[str] | None = None

    # -- the sources ----------------------------------------------------------------------------
    def _index_key(self) -> Any:
        return _trgm.c.seq if self.postgres else _fts.c.rowid

    def _index_match(self) -> list[ColumnElement[bool]]:
        if self.postgres:
            likes = [
                _trgm.c.doc.like(search_index.like_pattern(form), escape="\\")
                for form in search_index.needle_forms(self.needle)
            ]
            return [_trgm.c.signal == self.signal, or_(*likes)]
        query: Any = bindparam("fts_query", search_index.fts_query(self.needle))
        return [literal_column(search_index.SQLITE_TABLE).op("MATCH")(query), _fts.c.signal == self.signal]

    def _index_table(self) -> Any:
        return _trgm if self.postgres else _fts

    def _past_marks(self) -> list[ColumnElement[bool]]:
        """The rows the index does not answer for yet: past its seq mark, and those with failure
        rows not applied (read first and named: as a subquery a planner may walk the whole signal
        to test each row against it)."""
        if self._pending is None:
            rows = self.conn.execute(select(f.c.message_id).where(f.c.id > self.marks.failure_id).distinct())
            self._pending = [r[0] for r in rows]
        past = [m.c.seq > self.marks.seq]
        if self._pending:
            past.append(m.c.id.in_(bindparam("pending", self._pending, expanding=True, literal_execute=True)))
        return past

    def candidate_seqs(self) -> Select[Any]:
        """Seqs of every message that may match: index hits and the rows past the marks."""
        hits = select(self._index_key().label("seq")).where(*self._index_match())
        past = select(m.c.seq).where(m.c.signal == self.signal, or_(*self._past_marks()))
        return hits.union(past)  # type: ignore[return-value]

    def too_many(self) -> bool:
        hits = select(self._index_key()).where(*self._index_match()).limit(CANDIDATES_MAX + 1).subquery()
        return int(self.conn.execute(select(func.count()).select_from(hits)).scalar_one()) > CANDIDATES_MAX

    # -- a page ---------------------------------------------------------------------------------
    def seq_page(
        self, limit: int, descending: bool, cursor: listing.Position | None
    ) -> tuple[list[Any], listing.Position | None] | None:
        """A page in seq order: the index's hits (all of them, read through the text index, never
        by walking its seq order: a planner that expects few hits would walk past millions to find
        them), checked row by row from the newest (or oldest) until the page is full, merged with
        the rows past the marks. None when there are more hits than CANDIDATES_MAX: a needle that
        common fills its pages quickly from the windowed walk."""
        after: list[ColumnElement[bool]] = []
        if cursor is not None:
            after.append(m.c.seq < cursor.seq if descending else m.c.seq > cursor.seq)
        key = self._index_key()
        hits_query = select(key).where(*self._index_match())
        if cursor is not None:
            hits_query = hits_query.where(key < cursor.seq if descending else key > cursor.seq)
        hits = [r[0] for r in self.conn.execute(hits_query.limit(CANDIDATES_MAX + 1))]
        if len(hits) > CANDIDATES_MAX:
            return None
        hits.sort(reverse=descending)
        rows: list[Any] = []
        for start in range(0, len(hits), CHECK_BATCH):
            batch = hits[start : start + CHECK_BATCH]
            within = m.c.seq.in_(bindparam("batch", batch, expanding=True, literal_execute=True))
            rows += self.conn.execute(select(*listing.COLS).where(within, self.same_signal, *self.filters)).all()
            if len(rows) > limit:
                break
        for past in self._past_marks():
            direct = select(*listing.COLS).where(past, self.same_signal, *self.filters, *after)
            rows += self.conn.execute(direct.order_by(m.c.seq.desc() if descending else m.c.seq).limit(limit + 1)).all()
        merged = sorted({r.seq: r for r in rows}.values(), key=lambda r: r.seq, reverse=descending)
        if len(merged) > limit:
            return merged[:limit], listing.Position("seq", None, merged[limit - 1].seq)
        return merged, None

    def sorted_page(
        self, limit: int, sort: str, descending: bool, cursor: listing.Position | None
    ) -> tuple[list[Any], listing.Position | None] | None:
        """A page in another order, over every candidate; None when there are too many to sort."""
        if self.too_many():
            return None
        within = m.c.seq.in_(self.candidate_seqs())
        walk = listing.Walk(self.conn, self.signal, [*self.filters, within], sort, descending, windowed=False)
        rows, nxt, _cut = walk.page(limit, cursor)
        return rows, nxt
