"""The heads of keys: per key, the oldest unfinished message, what it failed, who waits behind it.

Messages of one key run in emit order (per-key FIFO), so a head that keeps failing holds every later
message of its key. `okconsole keys`, `okconsole why` and doctor's `blocked_keys` check read the
heads here, so they agree on what a head is, what it has failed and how many wait behind it.

Every read goes through the partial index of ready keyed rows (queue, key, seq): a page of keys
walks that index in key order and stops after `limit` keys (or, for blocked keys only, after
SCAN_KEYS keys), so a signal with a million keys costs a page, not a scan. The statements are
written as text with the index's own predicate, so SQLite sees the partial index applies.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from sqlalchemy import Connection, select, text

from ..store import schema
from . import pausing, queries
from .records import Failure, KeyHead, KeyPage

m = schema.messages
f = schema.failures
BATCH = 500  # keys read per statement while walking
SCAN_KEYS = 10_000  # keys a `blocked_only` page looks at before it stops and says where it got to
MAX_LIMIT = 10_000

READY_KEYED = f"{schema.READY} AND key IS NOT NULL"
_GROUPS = text(
    f"SELECT key, min(seq) AS head_seq, count(*) AS n FROM oke_messages WHERE {READY_KEYED} "
    "AND queue = :queue AND key > :after GROUP BY key ORDER BY key LIMIT :limit"
)
_GROUPS_FROM_START = text(
    f"SELECT key, min(seq) AS head_seq, count(*) AS n FROM oke_messages WHERE {READY_KEYED} "
    "AND queue = :queue GROUP BY key ORDER BY key LIMIT :limit"
)
_SAME_KEY = f"FROM oke_messages WHERE {READY_KEYED} AND queue = :queue AND key = :key"
_AHEAD = text(f"SELECT 1 {_SAME_KEY} AND seq < :seq LIMIT 1")
_BEHIND = text(f"SELECT count(*) {_SAME_KEY} AND seq > :seq")


def failed_attempts(status: str, attempts: int) -> int:
    """Attempts that failed: every counted attempt but a running one (a claim counts it up front)."""
    return max(0, int(attempts) - (1 if status == "inflight" else 0))


def is_head(conn: Connection, queue: str, key: str, seq: int) -> bool:
    """Whether no unfinished message of the same queue and key is older than `seq`."""
    return conn.execute(_AHEAD, {"queue": queue, "key": key, "seq": seq}).first() is None


def waiting_behind(conn: Connection, queue: str, key: str, seq: int) -> int:
    """Unfinished messages of the same queue and key newer than `seq`."""
    return int(conn.execute(_BEHIND, {"queue": queue, "key": key, "seq": seq}).scalar_one())


def last_failure(conn: Connection, message_id: str) -> Failure | None:
    """The newest failure of a message (a replay marker is not one)."""
    row = conn.execute(
        select(f.c.code, f.c.message, f.c.at, f.c.attempt)
        .where(f.c.message_id == message_id, f.c.kind == "failure")
        .order_by(f.c.id.desc())
        .limit(1)
    ).first()
    return None if row is None else Failure(code=row.code, message=row.message, at=row.at, attempt=row.attempt)


# -- a page of keys ----------------------------------------------------------------------------
def encode_after(queue: str, key: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([queue, key]).encode()).decode().rstrip("=")


def decode_after(cursor: str) -> tuple[str, str]:
    try:
        queue, key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, TypeError) as err:
        raise ValueError(f"not a keys cursor: {cursor!r} (pass the one a page printed)") from err
    if not isinstance(queue, str) or not isinstance(key, str):
        raise ValueError(f"not a keys cursor: {cursor!r} (pass the one a page printed)")
    return queue, key


def _groups(conn: Connection, queue: str, after: str | None, limit: int) -> list[Any]:
    if after is None:
        return list(conn.execute(_GROUPS_FROM_START, {"queue": queue, "limit": limit}))
    return list(conn.execute(_GROUPS, {"queue": queue, "after": after, "limit": limit}))


def _heads(conn: Connection, queue: str, groups: list[Any]) -> list[KeyHead]:
    """The head rows of a batch of (key, head_seq, n) groups, with their last failures."""
    rows = {
        r.seq: r
        for r in conn.execute(
            select(m.c.seq, m.c.id, m.c.status, m.c.attempts, m.c.flow).where(m.c.seq.in_([g.head_seq for g in groups]))
        )
    }
    out = []
    for g in groups:
        head = rows.get(g.head_seq)
        if head is None:
            continue
        failed = failed_attempts(head.status, head.attempts)
        out.append(
            KeyHead(
                key=g.key,
                flow=head.flow if "\x1f" in queue else None,
                head_id=head.id,
                head_status=head.status,
                head_attempts=failed,
                head_last_failure=last_failure(conn, head.id) if failed else None,
                waiting=int(g.n) - 1,
            )
        )
    return out


def blocks(head: KeyHead) -> bool:
    """A blocked key (`keys --blocked`): its head failed at least once and messages wait behind it."""
    return head.head_attempts >= 1 and head.waiting >= 1


class _Walk:
    """One page's walk over the heads of a signal's queues, in (queue, key) order."""

    def __init__(self, conn: Connection, blocked_only: bool, limit: int) -> None:
        self.conn, self.blocked_only, self.limit = conn, blocked_only, limit
        self.found: list[KeyHead] = []
        self.last: tuple[str, str] | None = None  # the (queue, key) of the last found head
        self.scanned = 0

    def page(self, next_after: tuple[str, str] | None) -> KeyPage:
        after = encode_after(*next_after) if next_after is not None else None
        return KeyPage(items=self.found, next_after=after, scanned=self.scanned)

    def queue(self, queue: str, cursor: str | None) -> KeyPage | None:
        """Walk one queue from after `cursor`; a page when it is full (or out of budget), else None."""
        while True:
            want = BATCH if self.blocked_only else min(BATCH, self.limit - len(self.found) + 1)
            groups = _groups(self.conn, queue, cursor, want)
            self.scanned += len(groups)
            for head in _heads(self.conn, queue, groups):
                if self.blocked_only and not blocks(head):
                    continue
                if len(self.found) == self.limit:  # one more than the page: there are more
                    return self.page(self.last)
                self.found.append(head)
                self.last = (queue, head.key)
            if len(groups) < want:
                return None
            cursor = groups[-1].key
            if self.blocked_only and self.scanned >= SCAN_KEYS:
                return self.page((queue, cursor))


def keys(
    conn: Connection, signal: str, blocked_only: bool = False, limit: int = 100, after: str | None = None
) -> KeyPage:
    """Keys of `signal` with unfinished messages, in (queue, key) order, at most `limit`, from
    after the cursor `after`; `blocked_only`: those `blocks` keeps, looking at SCAN_KEYS keys at most
    (the page then ends early with a `next_after` that walks on)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
    queries.require_signal(conn, signal)
    start = decode_after(after) if after is not None else None
    walk = _Walk(conn, blocked_only, limit)
    for queue in pausing.queues_of(conn, signal):
        if start is not None and queue < start[0]:
            continue
        done = walk.queue(queue, start[1] if start is not None and queue == start[0] else None)
        if done is not None:
            return done
    return walk.page(None)
