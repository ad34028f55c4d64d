"""A SQLite signal grown by plain SQL to any size, and the work one console read costs on it, in
SQLite VM steps: a read that walks the whole signal costs ten times more at ten times the rows,
one that costs its page does not. Steps, unlike seconds, do not vary with the machine's load."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, create_engine

STEP = 100  # VM instructions per progress-handler call


class BigSignal:
    """Messages of one signal on a real SQLite store file, added by SQL (no app: thousands in ms)."""

    def __init__(self, db: Path, signal: str) -> None:
        self.db, self.signal = db, signal
        self.raw = sqlite3.connect(db)
        self.raw.execute(
            "INSERT INTO oke_signals (name, kind, retries, dead_letter, optional, description, updated_at)"
            " VALUES (?, 'once', 0, 1, 0, '', 0)",
            (signal,),
        )
        self.raw.commit()

    def grow_to(self, total: int, payload: Callable[[int], str] = lambda i: "{}", inflight: int = 5) -> None:
        """Delivered messages up to `total` in all; the newest `inflight` are inflight (the rest are not)."""
        have = self.raw.execute("SELECT count(*) FROM oke_messages").fetchone()[0]
        self.raw.executemany(
            "INSERT INTO oke_messages (id, signal, queue, payload, status, attempts, retries, dead_letter,"
            " created_at, updated_at, priority) VALUES (?, ?, ?, ?, 'delivered', 1, 0, 0, ?, ?, 0)",
            [(f"msg_{i:08d}", self.signal, self.signal, payload(i), i, i) for i in range(have, total)],
        )
        self.raw.execute("UPDATE oke_messages SET status = 'delivered', locked_by = NULL WHERE status = 'inflight'")
        self.raw.execute(
            "UPDATE oke_messages SET status = 'inflight', locked_by = 'w', lease_expires_at = 1 "
            "WHERE seq IN (SELECT seq FROM oke_messages ORDER BY seq DESC LIMIT ?)",
            (inflight,),
        )
        self.raw.commit()

    def steps(self, read: Callable[[Connection], Any]) -> tuple[int, Any]:
        """The VM steps `read` costs on a fresh connection, and what it returned."""
        engine = create_engine(f"sqlite:///{self.db}")
        count = [0]

        def tick() -> int:
            count[0] += 1
            return 0

        try:
            with engine.connect() as conn:
                driver = conn.connection.driver_connection
                assert driver is not None
                driver.set_progress_handler(tick, STEP)
                got = read(conn)
                driver.set_progress_handler(None, STEP)
        finally:
            engine.dispose()
        return count[0], got

    def close(self) -> None:
        self.raw.close()
