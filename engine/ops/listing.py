"""Message lists sorted by any listed column and searched, answered by the store over a whole signal.

Why keyset paging: an OFFSET page costs O(offset) and shifts when messages arrive; a cursor on
(sort value, seq) costs O(page) at any depth and never repeats or skips a row. A sort walks two
segments: the rows that have a value, ordered by (value, seq) on an index (signal, column, seq),
then (nullable columns only) the rows without one, ordered by seq: empty values come last in both
directions.

Why a scan budget: a search (or a status filter over another column's order) keeps an unknown
share of the rows it walks. A page therefore reads windows of SCAN_BUDGET index entries of its
segment (or SCAN_BUDGET seqs of the store on a seq-ordered walk) while another fits in
PAGE_TIME_S, then stops: it returns the matches found so far and a cursor after the last row it
read (`MessagePage.cut`), so every page answers in bounded time and the next one carries on over
the rest of the signal.

Indexes (engine/store/schema.py): seq → the per-status merge on oke_messages_signal_status (or
the primary key for a searched walk); status → oke_messages_signal_status; key →
oke_messages_signal_key; id, created_at, attempts → oke_messages_settled_{id,created,attempts}
(rows not inflight) merged with the inflight rows from (signal, status, seq); locked_by and
lease_expires_at (set on inflight rows only) → the inflight rows from (signal, status, seq);
parent_run_id → oke_messages_signal_parent.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Select, and_, func, literal_column, or_, select, tuple_, union_all

from ..store import schema
from .records import STATUSES

m = schema.messages
f = schema.failures
SCAN_BUDGET = 25_000  # index entries (or seqs) one window of a bounded walk reads
PAGE_TIME_S = 0.08  # a bounded page reads windows while one more fits in this time
# The message columns a list can be sorted by (MessageRow fields, plus seq: emit order).
SORTS: dict[str, Any] = {
    "seq": m.c.seq,
    "id": m.c.id,
    "status": m.c.status,
    "key": m.c.key,
    "attempts": m.c.attempts,
    "locked_by": m.c.locked_by,
    "lease_expires_at": m.c.lease_expires_at,
    "created_at": m.c.created_at,
    "parent_run_id": m.c.parent_run_id,
}
NULLABLE = ("key", "locked_by", "lease_expires_at", "parent_run_id")
SETTLED_INDEXED = ("id", "created_at", "attempts")  # indexed over rows not inflight on PostgreSQL (schema.SETTLED)
INFLIGHT_ONLY = ("locked_by", "lease_expires_at")  # set on inflight rows only, which are few
# schema.SETTLED as an expression: a literal, not a bound parameter, so SQLite matches the index's WHERE
_SETTLED: ColumnElement[bool] = m.c.status.op("<>", is_comparison=True)(literal_column("'inflight'"))
_INFLIGHT: ColumnElement[bool] = m.c.status == "inflight"
COLS = (
    m.c.seq,
    m.c.id,
    m.c.status,
    m.c.key,
    m.c.attempts,
    m.c.locked_by,
    m.c.lease_expires_at,
    m.c.created_at,
    m.c.parent_run_id,
    m.c.run_at,
    m.c.priority,
    m.c.dedupe,
)


@dataclass(frozen=True)
class Position:
    """Where a walk stands: its segment ("values" or "seq") and the last row read there."""

    segment: str
    value: Any
    seq: int

    def encode(self) -> str:
        return json.dumps([self.segment, self.value, self.seq], separators=(",", ":"))


def decode_cursor(cursor: str) -> Position:
    """A cursor from a previous page; ValueError (not a crash) for anything else."""
    try:
        segment, value, seq = json.loads(cursor)
        if segment not in ("values", "seq") or isinstance(seq, bool) or not isinstance(seq, int):
            raise ValueError
    except (ValueError, TypeError):
        raise ValueError(f"not a cursor of a message page: {cursor!r}") from None
    return Position(segment, value, seq)


def check_sort(sort: str) -> None:
    if sort not in SORTS:
        raise ValueError(f'cannot sort messages by "{sort}" (one of: {", ".join(SORTS)})')


def search_filter(text: str, per_row: bool = False) -> ColumnElement[bool]:
    """Payload, key or last failure message contains `text`, case-insensitively (ASCII case on
    SQLite, whose lower() folds ASCII only). The payload is JSON text, so the needle also matches
    in its JSON-escaped form (a quote is stored as \\").

    `per_row`: the last failure is looked up for each row the filter meets, instead of once for
    every failure of the store (which a planner turns into one scan of all failures: right for a
    walk over the signal, wasted on the few candidate rows a text index found)."""
    needle = text.lower()
    forms = dict.fromkeys([needle, json.dumps(needle, ensure_ascii=False)[1:-1]])
    if per_row:
        last = (
            select(f.c.message)
            .where(f.c.message_id == m.c.id, f.c.kind == "failure")
            .order_by(f.c.id.desc())
            .limit(1)
            .scalar_subquery()
        )
        return or_(
            *(func.lower(m.c.payload).contains(form, autoescape=True) for form in forms),
            func.lower(m.c.key).contains(needle, autoescape=True),
            func.lower(last).contains(needle, autoescape=True),
        )
    f2 = f.alias("f_latest")
    latest = (
        select(func.max(f2.c.id)).where(f2.c.message_id == f.c.message_id, f2.c.kind == "failure").scalar_subquery()
    )
    failing = select(f.c.message_id).where(
        f.c.kind == "failure", f.c.id == latest, func.lower(f.c.message).contains(needle, autoescape=True)
    )
    return or_(
        *(func.lower(m.c.payload).contains(form, autoescape=True) for form in forms),
        func.lower(m.c.key).contains(needle, autoescape=True),
        m.c.id.in_(failing),
    )


def unindexed(col: Any) -> Any:
    """The column's value as an expression no index serves (`+ 0`, `|| ''`): it keeps SQLite's
    planner, which has no statistics, off an index that looks selective but is not for this
    statement (an equality on signal beside a short primary-key range, say)."""
    return col + 0 if col.type.python_type is int else col.concat("")


class Walk:
    """One page's walk over the signal in the requested order."""

    def __init__(
        self,
        conn: Connection,
        signal: str,
        filters: list[ColumnElement[bool]],
        sort: str,
        descending: bool,
        windowed: bool,
    ) -> None:
        self.conn, self.signal, self.filters = conn, signal, filters
        self.sort, self.descending, self.windowed = sort, descending, windowed
        self.column = SORTS[sort]

    def segments(self) -> list[str]:
        if self.sort == "seq":
            return ["seq"]
        return ["values", "seq"] if self.sort in NULLABLE else ["values"]

    # -- order and keyset ------------------------------------------------------------------------
    def _order(self, segment: str) -> list[Any]:
        cols = [m.c.seq] if segment == "seq" else [self.column, m.c.seq]
        return [c.desc() if self.descending else c.asc() for c in cols]

    def _segment_cond(self, segment: str) -> list[ColumnElement[bool]]:
        conds = [m.c.signal == self.signal]
        if self.sort != "seq":
            conds.append(self.column.is_(None) if segment == "seq" else self.column.is_not(None))
        return conds

    def _after(self, segment: str, pos: Position, inclusive: bool = False) -> ColumnElement[bool]:
        """Rows strictly past `pos` in walk order (or up to and including it, for a window's end)."""
        left: ColumnElement[Any]
        right: object
        if segment == "seq":
            left, right = m.c.seq, pos.seq
        else:
            left, right = tuple_(self.column, m.c.seq), tuple_(pos.value, pos.seq)
        if inclusive:
            return left >= right if self.descending else left <= right
        return left < right if self.descending else left > right

    # -- a window's end ----------------------------------------------------------------------------
    def _window_end(self, segment: str, start: Position | None) -> Position | None:
        """The last row a bounded read of this segment may reach; None when the segment ends first."""
        if segment == "values":
            conds = self._segment_cond(segment) + ([self._after(segment, start)] if start else [])
            parts = [
                (select(self.column, m.c.seq).where(and_(*conds, *part)), self._part_order(segment, part))
                for part in self._parts(segment)
            ]
            row = self.conn.execute(self._merged(segment, parts, SCAN_BUDGET, offset=SCAN_BUDGET - 1, limit=1)).first()
            return Position(segment, row[0], row[1]) if row is not None else None
        # seq order: a range of SCAN_BUDGET seqs of the store (the primary key), from the walk's start
        bounds = self._seq_bounds()
        if bounds is None:
            return None
        first, last = bounds
        origin = start.seq if start else (last + 1 if self.descending else first - 1)
        end = origin - SCAN_BUDGET if self.descending else origin + SCAN_BUDGET
        if (self.descending and end <= first) or (not self.descending and end >= last):
            return None
        return Position(segment, None, end)

    def _seq_bounds(self) -> tuple[int, int] | None:
        """The signal's lowest and highest seq (index probes on (signal, status, seq)); None when it has none."""
        lows: list[int] = []
        highs: list[int] = []
        for st in STATUSES:
            base = select(m.c.seq).where(m.c.signal == self.signal, m.c.status == st)
            low = self.conn.execute(base.order_by(m.c.seq).limit(1)).scalar()
            if low is not None:
                lows.append(low)
                high = self.conn.execute(base.order_by(m.c.seq.desc()).limit(1)).scalar()
                highs.append(low if high is None else high)  # None: the row left between the two probes
        return (min(lows), max(highs)) if lows else None

    # -- reading ----------------------------------------------------------------------------------
    def _query(self, segment: str, start: Position | None, end: Position | None, limit: int) -> Select[Any]:
        conds = self._segment_cond(segment) + self.filters
        if start is not None:
            conds.append(self._after(segment, start))
        if end is not None:
            conds.append(self._after(segment, end, inclusive=True))
        if segment == "seq" and not self.windowed and end is None:
            # No index orders a whole signal by seq: merge the first limit of each status from
            # (signal, status, seq), so a page costs O(limit), not O(messages of the signal).
            order = self._order(segment)
            parts = [(select(*COLS).where(and_(*conds, m.c.status == st)), order) for st in STATUSES]
        else:
            parts = [
                (select(*COLS).where(and_(*conds, *part)), self._part_order(segment, part))
                for part in self._parts(segment)
            ]
        return self._merged(segment, parts, limit, offset=0, limit=limit)

    def _parts(self, segment: str) -> list[list[ColumnElement[bool]]]:
        """The row sets a segment is read from, each on one index (schema.SORT_INDEXES): the
        indexes of id, created_at and attempts leave inflight rows out (a claim then writes no entry
        in them; on SQLite only attempts' does), so those rows are read apart, from (signal, status,
        seq), and merged in; a lease and its holder exist only on inflight rows, read the same way."""
        if segment == "values" and self.sort in SETTLED_INDEXED:
            return [[_SETTLED], [_INFLIGHT]]
        if segment == "values" and self.sort in INFLIGHT_ONLY:
            return [[_INFLIGHT]]
        return [[]]

    def _part_order(self, segment: str, part: list[ColumnElement[bool]]) -> list[Any]:
        """The walk order within one part. SQLite's id and created_at indexes hold inflight rows
        too, and its planner would rather walk one over every row of the signal, keeping the few
        inflight ones, than sort those few: the inflight part of those sorts orders by an
        expression of the column that no index serves, so it reads (signal, status, seq)."""
        if part and part[0] is _INFLIGHT and self.sort in SETTLED_INDEXED and self.conn.dialect.name == "sqlite":
            cols = [unindexed(self.column), m.c.seq]
            return [c.desc() if self.descending else c.asc() for c in cols]
        return self._order(segment)

    def _merged(
        self, segment: str, parts: list[tuple[Select[Any], list[Any]]], each: int, *, offset: int, limit: int
    ) -> Select[Any]:
        """Rows of `parts` (each a statement and its order) in walk order: each part ordered and
        cut to `each` on its own index, then merged (one part is read as it is)."""
        if len(parts) == 1:
            query, order = parts[0]
            return query.order_by(*order).offset(offset or None).limit(limit)
        merged = union_all(*(select(*q.order_by(*order).limit(each).subquery().c) for q, order in parts)).subquery()
        keys = [merged.c.seq] if segment == "seq" else [merged.c[self.column.key], merged.c.seq]
        return (
            select(*merged.c)
            .order_by(*(k.desc() if self.descending else k.asc() for k in keys))
            .offset(offset or None)
            .limit(limit)
        )

    def page(self, limit: int, cursor: Position | None) -> tuple[list[Any], Position | None, bool]:
        """Up to `limit` rows in walk order, the position the next page starts after (None at the
        end), and whether the page stopped at its scan budget rather than at `limit`."""
        segments = self.segments()
        start_at = segments.index(cursor.segment) if cursor is not None else 0
        got: list[tuple[str, Any]] = []
        began = time.monotonic()
        i, start = start_at, cursor
        while i < len(segments):
            segment = segments[i]
            window_began = time.monotonic()
            end = self._window_end(segment, start) if self.windowed else None
            want = limit + 1 - len(got)
            got += [(segment, r) for r in self.conn.execute(self._query(segment, start, end, want)).all()]
            if len(got) > limit:
                seg, row = got[limit - 1]
                return [r for _, r in got[:limit]], self._position(seg, row), False
            if end is None:
                i, start = i + 1, None
                continue
            # The window ended inside this segment: read another while one more still fits the
            # page's time; else stop here and let the next page carry on after its end.
            now = time.monotonic()
            if now - began + (now - window_began) >= PAGE_TIME_S:
                return [r for _, r in got], end, True
            start = end
        return [r for _, r in got], None, False

    def _position(self, segment: str, row: Any) -> Position:
        value = None if segment == "seq" else getattr(row, self.sort)
        return Position(segment, value, row.seq)
