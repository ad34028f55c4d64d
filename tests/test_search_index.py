"""Search from the text index (SQLite FTS5, PostgreSQL pg_trgm), on a real SQLite file and a real
PostgreSQL: the index is filled by the background pass, not by emits; a search finds what a scan
finds before and after that pass ran, a failure message that came after the message was indexed,
never a purged message, and pages with a cursor. The windowed walk is squeezed to a few rows per
page here, so a search that still scanned windows would come back cut, page after page."""

from __future__ import annotations

from typing import Any

import pytest

from engine import flow, oke, on, ops, search_indexing, signal
from engine.ops import listing, queries
from engine.search_indexing import SearchIndexer
from engine.store import schema as schema_mod
from engine.store import search_index
from vmstepkit import BigSignal
from workers.db import execute, is_sqlite, scalar

N = 60  # messages; the squeezed window reads 5


class Boom(Exception):
    code = "E_BOOM"


@pytest.fixture(autouse=True)
def squeezed(monkeypatch):
    monkeypatch.setattr(listing, "SCAN_BUDGET", 5)
    monkeypatch.setattr(listing, "PAGE_TIME_S", 0.0)
    monkeypatch.setattr(search_indexing, "PASS_EVERY_S", 3600.0)  # the app's own pass never runs here


async def index_now(store) -> int:
    """The background pass, run by hand (twice: on PostgreSQL the first one only sights the newest rows)."""
    indexer = SearchIndexer(store)
    return await indexer.pass_once() + await indexer.pass_once()


def index_rows_sql(url: str) -> str:
    return "SELECT count(*) FROM oke_search_fts" if is_sqlite(url) else "SELECT count(*) FROM oke_search"


async def emitted(db_url: str) -> tuple[list[str], Any]:
    """N messages of t.search, one in ten with a rare word; the first rare one fails (dead)."""
    jobs = signal.once("t.search", retries=0)

    @on(jobs)
    @flow("w.search")
    async def handle(payload, fx):
        if payload.get("fail"):
            raise Boom("SMTP 550 Mailbox Unavailable for Zebra-7")

    payloads: list[dict[str, Any]] = [{"n": n, "note": f"Zebra-{n}" if n % 10 == 7 else f"plain {n}"} for n in range(N)]
    payloads[7]["fail"] = True
    async with oke("t", database_url=db_url) as app:
        ids = await app.emit_many(jobs, payloads, keys=[f"k{n % 3}" for n in range(N)])
        await app.drain()
    return ids, jobs


async def test_search_answers_from_the_index_before_and_after_the_pass(db_url):
    ids, _ = await emitted(db_url)
    rare = [ids[n] for n in reversed(range(N)) if n % 10 == 7]
    store = await ops.open_store(db_url)
    try:
        assert int(await scalar(db_url, index_rows_sql(db_url))) == 0  # emits wrote nothing to the index
        before = await ops.message_page(store, "t.search", search="zebra-")
        assert [r.id for r in before.items] == rare and not before.cut and before.next_cursor is None
        assert await index_now(store) >= N
        assert int(await scalar(db_url, index_rows_sql(db_url))) == N
        marks = await store.read(search_index.marks)
        assert marks is not None and marks.seq == marks.newest_seq
        after = await ops.message_page(store, "t.search", search="ZEBRA-")
        assert [r.id for r in after.items] == rare and not after.cut
        assert (await ops.message_page(store, "t.search", search="zebra-99")).items == []
        by_key = await ops.message_page(store, "t.search", search="k2", limit=100)  # short: windows, in full
        assert len(by_key.items) < 100
    finally:
        await store.close()


async def test_a_failure_after_indexing_is_found_before_and_after_the_next_pass(db_url):
    jobs = signal.once("t.search", retries=0)

    @on(jobs)
    @flow("w.search")
    async def handle(payload, fx):
        raise Boom(f"gateway Quokka timeout {payload['n']}")

    async with oke("t", database_url=db_url) as app:
        ids = await app.emit_many(jobs, [{"n": n} for n in range(N)])
    store = await ops.open_store(db_url)
    try:
        await index_now(store)  # indexed with no failure yet
    finally:
        await store.close()
    async with oke("t", database_url=db_url) as app:
        await app.drain()  # every message fails now, after it was indexed
    store = await ops.open_store(db_url)
    try:
        for phase in ("before the pass", "after the pass"):
            page = await ops.message_page(store, "t.search", search="QUOKKA TIMEOUT 42")
            assert [r.id for r in page.items] == [ids[42]], phase
            assert not page.cut, phase
            await index_now(store)
        marks = await store.read(search_index.marks)
        assert marks is not None and marks.failure_id == marks.newest_failure_id
    finally:
        await store.close()


async def test_purged_and_deleted_messages_leave_the_index(db_url):
    ids, _ = await emitted(db_url)
    store = await ops.open_store(db_url)
    try:
        await index_now(store)
        assert [r.id for r in (await ops.message_page(store, "t.search", search="zebra-7")).items] == [ids[7]]
        await ops.purge(store, "t.search", "dead", actor="t", reason="test")  # ids[7] is the dead one
        await ops.delete(store, "t.search", [ids[17]], actor="t", reason="test")
        assert (await ops.message_page(store, "t.search", search="zebra-7")).items == []
        assert (await ops.message_page(store, "t.search", search="zebra-17")).items == []
        assert int(await scalar(db_url, index_rows_sql(db_url))) == N - 2
    finally:
        await store.close()


@pytest.mark.parametrize(("sort", "descending"), [("seq", True), ("seq", False), ("attempts", False), ("key", True)])
async def test_an_indexed_search_pages_with_a_cursor(db_url, sort, descending):
    ids, _ = await emitted(db_url)
    store = await ops.open_store(db_url)
    try:
        await index_now(store)
        everything = (await ops.message_page(store, "t.search", limit=1000, sort=sort, descending=descending)).items
        want = [r.id for r in everything if "plain 1" in _payload_note(ids, r.id)]
        got: list[str] = []
        cursor = None
        while True:
            page = await ops.message_page(
                store, "t.search", search="PLAIN 1", limit=3, sort=sort, descending=descending, cursor=cursor
            )
            assert not page.cut and len(page.items) <= 3
            got += [r.id for r in page.items]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert got == want and len(want) > 6
    finally:
        await store.close()


def _payload_note(ids: list[str], msg: str) -> str:
    n = ids.index(msg)
    return f"Zebra-{n}".lower() if n % 10 == 7 else f"plain {n}"


async def test_a_version_7_store_gains_the_index_and_the_pass_fills_it(db_url):
    ids, _ = await emitted(db_url)
    drop = ["DROP TABLE oke_search_fts"] if is_sqlite(db_url) else ["DROP TABLE oke_search"]
    for statement in [*drop, "DELETE FROM oke_meta WHERE key LIKE 'search_%'"]:
        await execute(db_url, statement)
    await execute(db_url, "UPDATE oke_meta SET value = '7' WHERE key = 'schema_version'")
    store = await ops.open_store(db_url)  # upgrades in place
    try:
        version = int(await scalar(db_url, "SELECT value FROM oke_meta WHERE key = 'schema_version'"))
        assert version == schema_mod.SCHEMA_VERSION
        marks = await store.read(search_index.marks)
        assert marks is not None and marks.seq == 0 and marks.newest_seq > 0
        await index_now(store)
        assert int(await scalar(db_url, index_rows_sql(db_url))) == N
        assert [r.id for r in (await ops.message_page(store, "t.search", search="zebra-57")).items] == [ids[57]]
    finally:
        await store.close()


async def test_doctor_says_whether_search_answers_from_the_index(db_url, monkeypatch):
    await emitted(db_url)
    store = await ops.open_store(db_url)
    try:
        monkeypatch.setattr(search_index, "TAIL_MAX", 10)  # a store far bigger than the index has reached
        [behind] = [c for c in await ops.doctor(store) if c.check == "search_index"]
        assert behind.status == "warn" and f"{N + 1} row(s) behind" in behind.detail  # N messages, 1 failure
        await index_now(store)
        [caught_up] = [c for c in await ops.doctor(store) if c.check == "search_index"]
        assert caught_up.status == "ok"
        await execute(db_url, "DROP TABLE oke_search_fts" if is_sqlite(db_url) else "DROP TABLE oke_search")
        [missing] = [c for c in await ops.doctor(store) if c.check == "search_index"]
        assert missing.status == "warn" and "scan each signal in windows" in missing.detail
        assert ("pg_trgm" in missing.detail) != is_sqlite(db_url)
        page = await ops.message_page(store, "t.search", search="zebra-57")  # still found, in windows
        assert len(page.items) <= 1 and (page.items or page.cut)
    finally:
        await store.close()


@pytest.mark.parametrize("needle", ["zebra-", "nowhere at all"])
async def test_an_indexed_search_costs_its_hits_not_the_signal(tmp_path, needle):
    """SQLite, caught up: a first searched page reads its candidates by seq and the rows past the
    marks by the primary key, never by walking the signal's index to them: with the same hits (one
    in seven of the first 2,000), it costs about the same work at 2,000 and 20,000 messages."""
    url = f"sqlite+aiosqlite:///{tmp_path}/oke.db"
    async with oke("t", database_url=url, bindings=[]):
        pass
    big = BigSignal(tmp_path / "oke.db", "t.big")

    def payload(i: int) -> str:
        return f'{{"note": "zebra-{i}"}}' if i % 7 == 0 and i < 2_000 else f'{{"note": "plain {i}"}}'

    def first_page(conn):
        return queries.message_page(conn, "t.big", None, None, 5, None, search=needle)

    async def indexed() -> None:
        store = await ops.open_store(url)
        try:
            await index_now(store)
        finally:
            await store.close()

    try:
        big.grow_to(2_000, payload)
        await indexed()
        small, page = big.steps(first_page)
        found_small = len(page.items)
        big.grow_to(20_000, payload)
        await indexed()
        large, page = big.steps(first_page)
        assert len(page.items) == found_small == (5 if needle == "zebra-" else 0) and not page.cut
    finally:
        big.close()
    assert large < small * 2, (small, large)


async def test_a_walked_search_reads_failure_messages_from_their_index(pg_url):
    """PostgreSQL: a needle too common for the index is searched by walking the signal, and its
    failure-message test reads oke_failures through the trigram index on their text (where a
    seq scan of every failure would cost the store's size): the plan of that test names it."""
    await emitted(pg_url)
    store = await ops.open_store(pg_url)
    try:
        def plan(conn) -> str:
            from sqlalchemy import select, text

            conn.execute(text("SET LOCAL enable_seqscan = off"))
            query = select(schema_mod.messages.c.seq).where(
                schema_mod.messages.c.signal == "t.search", listing.search_filter("mailbox unavailable")
            )
            compiled = query.compile(conn, compile_kwargs={"literal_binds": True})
            return "\n".join(r[0] for r in conn.execute(text(f"EXPLAIN {compiled}")))

        got = await store.read(plan)
        assert search_index.FAILURES_INDEX in got, got
        found = await ops.message_page(store, "t.search", search="mailbox unavailable")
        assert len(found.items) == 1  # the one dead message, found by its failure
    finally:
        await store.close()
