"""engine.ops.message_page sorted by any column and searched, over the whole signal, on SQLite
and PostgreSQL: the store's answer is compared with the same order computed here in Python from
every row, page by page (keyset cursors), so a skipped, repeated or string-compared row fails."""
from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from engine import flow, oke, on, ops, signal
from engine.ops import listing, queries
from engine.store import make_store, search_index
from vmstepkit import BigSignal

SORTS = ["seq", "id", "status", "key", "attempts", "locked_by", "lease_expires_at", "created_at",
         "parent_run_id"]


class Boom(Exception):
    code = "E_BOOM"


async def sql_write(store, statement: str) -> None:
    await store.write(lambda conn: conn.execute(text(statement)))


async def all_rows(store, signal_name: str) -> list[tuple[int, ops.MessageRow]]:
    """Every message of the signal with its seq (plain SQL), in no particular order."""
    def read(conn):
        seqs = dict(conn.execute(text("SELECT id, seq FROM oke_messages WHERE signal = :s"), {"s": signal_name}).all())
        return seqs
    seqs = await store.read(read)
    page = await ops.message_page(store, signal_name, limit=1000)
    assert page.next_cursor is None
    return [(seqs[r.id], r) for r in page.items]


def expected(rows: list[tuple[int, ops.MessageRow]], sort: str, descending: bool,
             keep: Any = None) -> list[str]:
    """The order the store must give: by value then seq, in the direction asked; empty last."""
    rows = [(seq, r) for seq, r in rows if keep is None or keep(r)]
    value = (lambda seq, r: seq) if sort == "seq" else (lambda seq, r: getattr(r, sort))
    present = [(value(s, r), s, r.id) for s, r in rows if value(s, r) is not None]
    empty = [(s, r.id) for s, r in rows if value(s, r) is None]
    present.sort(reverse=descending)
    empty.sort(reverse=descending)
    return [i for _, _, i in present] + [i for _, i in empty]


async def walk(store, signal_name: str, limit: int, **kw: Any) -> tuple[list[str], int]:
    """Every page of a listing, following next_cursor; returns the ids in order and the page count."""
    ids: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await ops.message_page(store, signal_name, limit=limit, cursor=cursor, **kw)
        pages += 1
        assert len(page.items) <= limit
        ids += [r.id for r in page.items]
        cursor = page.next_cursor
        if cursor is None:
            return ids, pages
        assert pages < 500, "the walk does not end"


@pytest.fixture
async def store_with_messages(db_url):
    jobs = signal.once("t.sort", retries=0)

    @on(jobs)
    @flow("w.sort")
    async def handle(payload, fx):
        if payload.get("fail"):
            raise Boom(payload["fail"])

    async with oke("t", database_url=db_url) as app:
        ids = []
        for n in range(13):
            payload: dict[str, Any] = {"n": n, "note": f"Order #{n}"}
            if n % 4 == 0:
                payload["fail"] = f"SMTP 550 Mailbox-{n} unavailable"
            if n == 5:
                payload["quote"] = 'say "Hi"'
            ids.append(await app.emit(jobs, payload, key=None if n % 3 == 0 else f"Key-{n % 5}"))
        await app.drain()
        store = app.store
        # Values a string comparison orders wrongly, and leases/parents on some rows only.
        attempts = [1, 2, 10, 100, 3, 2, 10, 1, 100, 20, 2, 1, 3]
        for n, msg in enumerate(ids):
            extra = ""
            if n in (2, 7, 9):
                extra = f", status = 'inflight', locked_by = 'host:{9 - n}', lease_expires_at = {10 ** (n % 4 + 1)}"
            if n in (1, 4, 8, 11):
                extra += f", parent_run_id = 'run_{(n * 7) % 10}'"
            created = [5, 10, 100, 2, 50, 5, 1000, 3, 20, 5, 200, 9, 30][n]
            await sql_write(store, f"UPDATE oke_messages SET attempts = {attempts[n]}, "
                                   f"created_at = {created}{extra} WHERE id = '{msg}'")
        yield store, ids


@pytest.mark.parametrize("descending", [True, False], ids=["desc", "asc"])
async def test_every_sort_orders_the_whole_signal_by_value_across_pages(store_with_messages, descending):
    store, ids = store_with_messages
    rows = await all_rows(store, "t.sort")
    assert len(rows) == 13
    for sort in SORTS:
        want = expected(rows, sort, descending)
        got, pages = await walk(store, "t.sort", 4, sort=sort, descending=descending)
        assert got == want, sort
        assert pages == 4  # 13 rows by 4: 4 pages, the last one short, no empty extra page
    by_attempts, _ = await walk(store, "t.sort", 50, sort="attempts", descending=descending)
    numeric = [r.attempts for _, r in sorted(rows, key=lambda sr: by_attempts.index(sr[1].id))]
    assert numeric == sorted(numeric, reverse=descending)  # 100 > 20 > 10 > 3 > 2, not "3" > "20"


async def test_filters_combine_with_a_sort(store_with_messages):
    store, ids = store_with_messages
    rows = await all_rows(store, "t.sort")
    dead, _ = await walk(store, "t.sort", 2, sort="created_at", status="dead")
    assert dead == expected(rows, "created_at", True, keep=lambda r: r.status == "dead")
    assert dead  # the failing payloads went dead
    keyed, _ = await walk(store, "t.sort", 2, sort="attempts", descending=False, key="Key-1")
    assert keyed == expected(rows, "attempts", False, keep=lambda r: r.key == "Key-1")


async def test_search_matches_payload_key_and_last_failure_case_insensitively(store_with_messages):
    store, ids = store_with_messages
    found = lambda page: [r.id for r in page.items]  # noqa: E731
    by_payload = await ops.message_page(store, "t.sort", search="order #7")
    assert found(by_payload) == [ids[7]]
    by_key = await ops.message_page(store, "t.sort", search="key-4")
    assert set(found(by_key)) == {ids[n] for n in range(13) if n % 3 and n % 5 == 4}
    by_failure = await ops.message_page(store, "t.sort", search="mailbox-8 UNAVAILABLE")
    assert found(by_failure) == [ids[8]]  # the payload holds "fail": ... too, so check a text only the failure has:
    only_failure = await ops.message_page(store, "t.sort", search="smtp 550 mailbox-4")
    assert found(only_failure) == [ids[4]]
    quoted = await ops.message_page(store, "t.sort", search='say "hi"')
    assert found(quoted) == [ids[5]]
    like_chars = await ops.message_page(store, "t.sort", search="%")
    assert found(like_chars) == []  # LIKE wildcards are text, not patterns
    none = await ops.message_page(store, "t.sort", search="nothing like this")
    assert none.items == [] and none.next_cursor is None
    assert [r.id for r in await ops.messages(store, "t.sort", search="ORDER #1")] == [ids[12], ids[11], ids[10], ids[1]]


async def test_a_search_past_its_scan_budget_carries_on_over_the_whole_signal(store_with_messages, monkeypatch):
    store, ids = store_with_messages
    rows = await all_rows(store, "t.sort")
    monkeypatch.setattr(listing, "SCAN_BUDGET", 3)
    monkeypatch.setattr(listing, "PAGE_TIME_S", 0.0)  # one window a page
    monkeypatch.setattr(search_index, "TAIL_MAX", -1)  # a text index that has not caught up: windows
    keep = lambda r: r.key is not None  # noqa: E731  ("key-" is in every keyed row)
    for sort, descending in (("seq", True), ("seq", False), ("attempts", True), ("key", False)):
        got, pages = await walk(store, "t.sort", 50, search="KEY-", sort=sort, descending=descending)
        assert got == expected(rows, sort, descending, keep=keep), (sort, descending)
        assert pages > 1
    page = await ops.message_page(store, "t.sort", search="order #", sort="created_at")
    assert page.cut and len(page.items) <= 3 and page.next_cursor is not None


async def test_bad_sort_or_cursor_is_a_clear_error(store_with_messages):
    store, _ = store_with_messages
    with pytest.raises(ValueError, match='cannot sort messages by "payload"'):
        await ops.message_page(store, "t.sort", sort="payload")
    for bad in ("nope", "[1, 2]", '["values", 1, "x"]', "null"):
        with pytest.raises(ValueError, match="not a cursor"):
            await ops.message_page(store, "t.sort", cursor=bad)
    with pytest.raises(ValueError, match="before_seq"):
        await ops.message_page(store, "t.sort", sort="id", before_seq=5)


async def test_sort_indexes_are_added_to_an_existing_store_and_serve_the_sorts(db_url):
    async with oke("t", database_url=db_url, bindings=[]):
        pass
    store = make_store(db_url)
    await store.open()
    try:
        created = "oke_messages_settled_created" if store.dialect == "postgresql" else "oke_messages_signal_created"
        await sql_write(store, f"DROP INDEX {created}")
        # an earlier okengine's full-row index, which costs every claim an entry
        await sql_write(store, "CREATE INDEX oke_messages_signal_owner ON oke_messages (signal, locked_by, seq)")
        # the other store's kind of id index, which costs this store's claims an entry
        other_id = "oke_messages_signal_id" if store.dialect == "postgresql" else "oke_messages_settled_id"
        await sql_write(store, f"CREATE INDEX {other_id} ON oke_messages (signal, id)")
    finally:
        await store.close()
    store = make_store(db_url)
    await store.open()  # no schema version step: ensure_schema adds what is missing, drops what retired
    try:
        def plans(conn):
            pg = conn.dialect.name == "postgresql"
            if pg:
                conn.execute(text("SET LOCAL enable_seqscan = off"))
                conn.execute(text("SET LOCAL enable_sort = off"))
            explain = "EXPLAIN " if pg else "EXPLAIN QUERY PLAN "
            out = {}
            own = "settled" if pg else "signal"  # PostgreSQL's leave inflight rows out (schema.SORT_INDEXES)
            for name, column, rows in ((f"oke_messages_{own}_created", "created_at", "status <> 'inflight'"),
                                       ("oke_messages_settled_attempts", "attempts", "status <> 'inflight'"),
                                       (f"oke_messages_{own}_id", "id", "status <> 'inflight'"),
                                       ("oke_messages_signal_status", "locked_by", "status = 'inflight'"),
                                       ("oke_messages_signal_status", "lease_expires_at", "status = 'inflight'"),
                                       ("oke_messages_signal_parent", "parent_run_id", "true")):
                q = (f"SELECT seq FROM oke_messages WHERE signal = 's' AND {column} IS NOT NULL AND {rows} "
                     f"ORDER BY {column} DESC, seq DESC LIMIT 5")
                out[column] = (name, " ".join(str(c) for row in conn.execute(text(explain + q)) for c in row))
            if pg:
                names = [r[0] for r in conn.execute(text("SELECT indexname FROM pg_indexes WHERE tablename = 'oke_messages'"))]
            else:
                names = [r[0] for r in conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'index'"))]
            return out, names
        out, names = await store.read(plans)
        for column, (name, plan) in out.items():
            assert name in plan, (column, plan)
        assert created in names and "oke_messages_signal_owner" not in names
        assert other_id not in names
    finally:
        await store.close()



@pytest.mark.parametrize("sort", ["id", "created_at", "attempts"])
async def test_sqlite_sort_page_costs_the_page_not_the_signal(tmp_path, sort):
    """The inflight rows of a sort whose index also holds them are read from (signal, status,
    seq): a first page costs about the same work at 2,000 and 20,000 messages, the newest of them
    inflight, where walking the sort's index to them would cost ten times it."""
    async with oke("t", database_url=f"sqlite+aiosqlite:///{tmp_path}/oke.db", bindings=[]):
        pass
    big = BigSignal(tmp_path / "oke.db", "t.big")

    def first_page(conn):
        return queries.message_page(conn, "t.big", None, None, 50, None, sort=sort, descending=False)

    try:
        big.grow_to(2_000)
        small, page = big.steps(first_page)
        assert len(page.items) == 50
        big.grow_to(20_000)
        large, page = big.steps(first_page)
        assert len(page.items) == 50
    finally:
        big.close()
    assert large < small * 2, (small, large)
