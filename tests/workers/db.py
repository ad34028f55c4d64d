"""Plain SQL against a test store, with the databases' own drivers (sqlite3, asyncpg).

Tests assert on the rows themselves, not through the engine's own read paths. Queries use
PostgreSQL `$n` placeholders; for SQLite they become `?` (arguments must appear in order).
"""
from __future__ import annotations

import re
import sqlite3
from typing import Any

import asyncpg

_PLACEHOLDER = re.compile(r"\$\d+")


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def sqlite_file(url: str) -> str:
    return url.split(":///", 1)[1]


def pg_dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def fetch(url: str, sql: str, *args: Any) -> list[tuple]:
    """All rows of one query, as tuples."""
    if is_sqlite(url):
        conn = sqlite3.connect(sqlite_file(url), timeout=30)
        try:
            return [tuple(r) for r in conn.execute(_PLACEHOLDER.sub("?", sql), args).fetchall()]
        finally:
            conn.close()
    conn = await asyncpg.connect(pg_dsn(url), timeout=10)
    try:
        return [tuple(r) for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()


async def scalar(url: str, sql: str, *args: Any) -> Any:
    rows = await fetch(url, sql, *args)
    return rows[0][0] if rows else None


async def execute(url: str, sql: str, *args: Any) -> None:
    if is_sqlite(url):
        conn = sqlite3.connect(sqlite_file(url), timeout=30)
        try:
            conn.execute(_PLACEHOLDER.sub("?", sql), args)
            conn.commit()
        finally:
            conn.close()
        return
    conn = await asyncpg.connect(pg_dsn(url), timeout=10)
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()


async def table_counts(url: str) -> dict[str, int]:
    """Rows in each table an emit could write (missing tables count as 0)."""
    out = {}
    for table in ("oke_messages", "oke_failures", "oke_runs", "oke_tape_events"):
        try:
            out[table] = await scalar(url, f"SELECT count(*) FROM {table}")
        except (sqlite3.OperationalError, asyncpg.UndefinedTableError):
            out[table] = 0
    return out
