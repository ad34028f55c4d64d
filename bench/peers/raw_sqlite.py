"""The ceiling on SQLite: a raw stdlib sqlite3 claim loop (the peer figures' raw loop, its "rewritten" variant).

One connection, journal_mode=WAL, busy_timeout 5 s, and every commit fsynced, as in the engine:
either synchronous=FULL, or (own_sync) NORMAL + an fdatasync of the WAL after each COMMIT, which is
how the engine does it (the same system call FULL makes, on the same file, once a commit).
Loop: BEGIN IMMEDIATE; UPDATE … WHERE id IN (SELECT … ORDER BY id LIMIT batch) RETURNING; COMMIT;
json.loads + no-op handler per row; BEGIN IMMEDIATE; mark the batch delivered; COMMIT; stop on an
empty claim. The claim repeats the partial index's WHERE term so SQLite uses it; no ANALYZE.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time

from common import Window, payload, proc_io_written

LEASE_S = 30.0
SCHEMA = """
CREATE TABLE messages (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    signal           TEXT    NOT NULL,
    key              TEXT    NULL,
    status           TEXT    NOT NULL DEFAULT 'pending',
    attempts         INTEGER NOT NULL DEFAULT 0,
    locked_by        TEXT    NULL,
    lease_expires_at REAL    NULL,
    payload          TEXT    NOT NULL DEFAULT '{}',
    created_at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX messages_ready_idx ON messages(id) WHERE status IN ('pending', 'inflight');
"""
CLAIM_SQL = """
UPDATE messages
   SET status = 'inflight', locked_by = ?, attempts = attempts + 1, lease_expires_at = ?
 WHERE id IN (SELECT id FROM messages
               WHERE status IN ('pending', 'inflight') AND (status = 'pending' OR lease_expires_at < ?)
               ORDER BY id LIMIT ?)
RETURNING id, signal, key, payload, attempts
"""


def _ack_sql(k: int) -> str:
    return ("UPDATE messages SET status = 'delivered', locked_by = NULL, lease_expires_at = NULL "
            f"WHERE id IN ({','.join('?' * k)}) AND locked_by = ? AND status = 'inflight'")


def _connect(path: str, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL").fetchall()
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


def _fill(path: str, n: int, synchronous: str) -> None:
    for suf in ("", "-wal", "-shm"):
        try:
            os.remove(path + suf)
        except FileNotFoundError:
            pass
    conn = _connect(path, synchronous)
    conn.executescript(SCHEMA)
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO messages (signal, key, status, payload) VALUES ('bench.noop', NULL, 'pending', ?)",
                     ((json.dumps(payload(i)),) for i in range(n)))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.close()


def _noop(signal, key, value):
    return None


def run(path: str, n: int, batch: int, synchronous: str = "FULL", own_sync: bool = False) -> dict:
    """`own_sync`: fdatasync the WAL after each COMMIT from Python, the engine's way of making each
    commit durable (run with synchronous="NORMAL"); the same disk work as FULL, shown side by side."""
    _fill(path, n, synchronous)
    conn = _connect(path, synchronous)
    wal_fd = os.open(path + "-wal", os.O_RDONLY) if own_sync else None

    def commit() -> None:
        conn.execute("COMMIT")
        if wal_fd is not None:
            os.fdatasync(wal_fd)

    name, processed = "w0", 0
    io0, win = proc_io_written(), Window().start()
    while True:
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(CLAIM_SQL, (name, now + LEASE_S, now, batch)).fetchall()
        commit()
        if not rows:
            break
        for (_id, signal, key, text, _attempts) in rows:
            _noop(signal, key, json.loads(text))
        ids = [r[0] for r in rows]
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_ack_sql(len(ids)), (*ids, name))
        commit()
        processed += len(rows)
    win.stop()
    written = proc_io_written() - io0
    if wal_fd is not None:
        os.close(wal_fd)
    conn.close()
    chk_conn = sqlite3.connect(path)
    d, total, a, m = chk_conn.execute("SELECT sum(status = 'delivered'), count(*), coalesce(sum(attempts), 0), "
                                      "coalesce(max(attempts), 0) FROM messages").fetchone()
    chk_conn.close()
    ok = d == n and total == n and a == n and m == 1
    return {"bench": "sqlite_raw", "batch": batch, "synchronous": synchronous, "own_sync": own_sync, "messages": n,
            **win.fields(n), "written_bytes_per_msg": round(written / n), "processed": processed, "verified": ok,
            "check": {"delivered": d, "total": total, "attempts": a, "max_attempts": m},
            "sqlite_version": sqlite3.sqlite_version}
