"""Names and ids compare bytewise on PostgreSQL whatever the database's locale (schema 5).

On a database created under en_US.UTF-8 (the official Docker image's default) a text column's
index places every entry with strcoll(); the store's name, id and status columns collate "C"
instead (engine/store/schema.py `Name`), as SQLite's BINARY does. These tests make such a database
in the session's cluster (the en_US.UTF-8 locale must exist on the machine: .ci/run generates it)
and check the columns, their indexes, the order a reader sees, and the upgrade of a version 4
store, whose columns followed the database.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest
from pgcluster import fresh_database_name
from sqlalchemy import text

from engine import flow, oke, on, signal
from engine.store import schema as schema_mod

LOCALE = "en_US.UTF-8"


def _locale_exists() -> bool:
    found = subprocess.run(["locale", "-a"], capture_output=True, text=True, check=False).stdout.lower().split()
    return "en_us.utf8" in found or "en_us.utf-8" in found


@pytest.fixture
def en_us_url(pg_cluster) -> Iterator[str]:
    if not _locale_exists():
        message = f"the {LOCALE} locale is not installed (apt-get install locales; locale-gen {LOCALE})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    name = fresh_database_name()
    pg_cluster.fetch(
        f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE '{LOCALE}' LC_CTYPE '{LOCALE}'"
    )
    try:
        yield pg_cluster.sqlalchemy_url(name)
    finally:
        pg_cluster.drop_database(name)


def _name_columns() -> dict[str, list[str]]:
    """table -> the columns the schema declares as names (collated "C" on PostgreSQL)."""
    from sqlalchemy.dialects import postgresql

    return {
        table.name: [c.name for c in columns]
        for table in schema_mod.metadata.sorted_tables
        if (columns := schema_mod.name_columns(table, postgresql.dialect()))
    }


def _collations(conn) -> dict[tuple[str, str], str]:
    rows = conn.execute(text(
        "SELECT table_name, column_name, coalesce(collation_name, 'default') FROM information_schema.columns "
        "WHERE table_schema = 'public' AND table_name LIKE 'oke_%' AND data_type IN ('character varying', 'text')"))
    return {(table, column): collation for table, column, collation in rows}


def _index_collations(conn) -> set[str]:
    """The collations of every text column of every index on oke_messages."""
    rows = conn.execute(text(
        "SELECT DISTINCT coll.collname FROM pg_index AS i "
        "JOIN pg_class AS t ON t.oid = i.indrelid AND t.relname = 'oke_messages' "
        "CROSS JOIN LATERAL unnest(i.indcollation::oid[]) AS c(oid) "
        "JOIN pg_collation AS coll ON coll.oid = c.oid"))
    return {name for (name,) in rows}


async def test_names_ids_and_statuses_collate_bytewise_on_a_database_that_sorts_by_locale(en_us_url):
    tasks = signal.once("tasks")

    @on(tasks)
    @flow("work")
    async def handle(payload, fx):
        pass

    async with oke("c", database_url=en_us_url) as app:
        await app.emit(tasks, 1, key="B-key")
        await app.emit(tasks, 2, key="a-key")
        assert await app.store.read(lambda c: c.execute(text("SHOW lc_collate")).scalar()) == LOCALE
        collations = await app.store.read(_collations)
        names = _name_columns()
        assert names["oke_messages"] == [
            "id", "signal", "queue", "flow", "status", "locked_by", "parent_run_id", "dedupe"]
        for table, columns in names.items():
            for column in columns:
                assert collations[(table, column)] == "C", (table, column)
        # free text and keys follow the database: the console's search folds their case with it
        assert collations[("oke_messages", "payload")] == "default"
        assert collations[("oke_messages", "key")] == "default"
        assert await app.store.read(_index_collations) == {"C", "default"}  # "default": the key indexes

        # what a reader sees: names in byte order ("U" < "t"; en_US puts "tasks" first), keys in
        # the locale's ("a-key" < "B-key"; bytewise "B" comes first)
        def orders(c) -> tuple[list[str], list[str]]:
            signals = [r[0] for r in c.execute(text(
                "SELECT s FROM (SELECT signal AS s FROM oke_messages UNION ALL SELECT 'U.x') AS t ORDER BY s"))]
            keys = [r[0] for r in c.execute(text("SELECT key FROM oke_messages ORDER BY key"))]
            return signals, keys

        signal_order, key_order = await app.store.read(orders)
        assert signal_order == ["U.x", "tasks", "tasks"]
        assert key_order == ["a-key", "B-key"]
        await app.drain()
        assert await app.store.read(lambda c: c.execute(text(
            "SELECT count(*) FROM oke_messages WHERE status = 'delivered'")).scalar()) == 2


def _downgrade_to_version_4(conn) -> None:
    """Version 4's columns: every text column in the database's collation."""
    for table, columns in _name_columns().items():
        types = dict(conn.execute(text(
            "SELECT column_name, CASE WHEN data_type = 'text' THEN 'text' "
            "ELSE 'varchar(' || character_maximum_length || ')' END "
            "FROM information_schema.columns WHERE table_name = :t"), {"t": table}).all())
        alters = ", ".join(f'ALTER COLUMN "{c}" TYPE {types[c]} COLLATE "default"' for c in columns)
        conn.execute(text(f"ALTER TABLE {table} {alters}"))
    conn.execute(text("UPDATE oke_meta SET value = '4' WHERE key = 'schema_version'"))


async def test_a_version_4_store_is_upgraded_to_bytewise_names_and_keeps_working(en_us_url):
    tasks = signal.once("tasks", retries=0)
    seen: list[int] = []

    @on(tasks)
    @flow("work")
    async def handle(payload, fx):
        seen.append(payload)

    async with oke("c", database_url=en_us_url) as app:
        await app.emit(tasks, 1, dedupe="d-1")
        await app.emit(tasks, 2, key="k")
        await app.store.write(_downgrade_to_version_4)
        assert set((await app.store.read(_collations)).values()) == {"default"}

    async with oke("c", database_url=en_us_url) as app:
        version = await app.store.read(lambda c: c.execute(text(
            "SELECT value FROM oke_meta WHERE key = 'schema_version'")).scalar())
        assert int(version) == schema_mod.SCHEMA_VERSION == 11
        collations = await app.store.read(_collations)
        assert {collations[(t, c)] for t, cols in _name_columns().items() for c in cols} == {"C"}
        # the rebuilt dedupe index still answers the emit's ON CONFLICT: the held key returns its holder
        first_again = await app.emit(tasks, 3, dedupe="d-1")
        held = await app.store.read(lambda c: c.execute(text(
            "SELECT id FROM oke_messages WHERE dedupe = 'd-1'")).scalar())
        assert first_again == held
        await app.drain()
    assert sorted(seen) == [1, 2]
