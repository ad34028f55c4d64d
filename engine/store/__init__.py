"""Open the store a database url names: SQLite (default) or PostgreSQL."""

from __future__ import annotations

import os

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from ..errors import StoreUnavailable
from .base import Claimed, NewMessage, Outcome, Store, queue_name
from .sqlite.file import BUSY_TIMEOUT_MS

# Where a SQLite store writes its hot path (engine/store/sqlite/process.py): the default first.
SQLITE_WRITERS = ("process", "thread")

DEFAULT_URL = "sqlite+aiosqlite:///.oke/oke.db"

__all__ = [
    "SQLITE_WRITERS",
    "Claimed",
    "NewMessage",
    "Outcome",
    "Store",
    "check_sqlite_writer",
    "make_store",
    "queue_name",
    "resolve_url",
]


def resolve_url(database_url: str | None) -> str:
    """The explicit url, else env OKE_DATABASE_URL, else the embedded SQLite default."""
    return database_url or os.environ.get("OKE_DATABASE_URL") or DEFAULT_URL


def check_sqlite_writer(writer: object, where: str) -> None:
    """ValueError naming `where` unless `writer` is one of SQLITE_WRITERS."""
    if writer not in SQLITE_WRITERS:
        raise ValueError(f"{where}: {' or '.join(map(repr, SQLITE_WRITERS))}, got {writer!r}")


def make_store(
    database_url: str | None = None,
    *,
    busy_timeout_ms: int | None = None,
    sqlite_writer: str = SQLITE_WRITERS[0],
    listen_url: str | None = None,
) -> Store:
    """A closed store for the url; `await store.open()` connects and creates the schema.

    SQLite only: `busy_timeout_ms` is how long a write waits for another process's lock before
    failing as an outage (default 30 s); `sqlite_writer` is where emits, claims and settles are
    written: "process" (a writer process the store starts) or "thread" (a thread of this process).
    PostgreSQL only: `listen_url`, a direct connection for LISTEN when the url is a pooler's.
    """
    check_sqlite_writer(sqlite_writer, "sqlite_writer")
    url = resolve_url(database_url)
    try:
        parsed = make_url(url)
    except ArgumentError as err:
        raise StoreUnavailable(
            f"not a database url: {url!r} (expected sqlite+aiosqlite:///path or postgresql+asyncpg://user@host/db)"
        ) from err
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        from .sqlite.store import SqliteStore

        try:
            return SqliteStore(url, BUSY_TIMEOUT_MS if busy_timeout_ms is None else busy_timeout_ms, sqlite_writer)
        except ValueError as err:
            raise StoreUnavailable(str(err)) from err
    if backend == "postgresql":
        from .postgres.store import PostgresStore

        if parsed.drivername not in ("postgresql", "postgresql+asyncpg"):
            raise StoreUnavailable(
                f"okengine speaks to PostgreSQL through asyncpg: use postgresql+asyncpg://… (got {parsed.drivername})"
            )
        try:
            return PostgresStore(
                url.replace("postgresql://", "postgresql+asyncpg://", 1) if parsed.drivername == "postgresql" else url,
                listen_url=listen_url,
            )
        except ValueError as err:
            raise StoreUnavailable(str(err)) from err
    raise StoreUnavailable(f"unsupported database {backend!r} in {url!r}: use SQLite or PostgreSQL")
