"""app.emit_many: many messages of one signal in one transaction, all or none, in order."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from engine import OkeError, flow, oke, on, ops, signal
from engine.store.sql.enqueue import COPY_FROM_ROWS, ENQUEUE_CHUNK
from workers.db import fetch, scalar


class Order(BaseModel):
    n: int


async def test_many_messages_are_stored_in_the_order_given_and_delivered(db_url):
    orders = signal.once("orders", schema=Order)
    handled: list[int] = []
    on(orders, flow("w.orders", do=lambda p, fx: handled.append(p.n)))
    count = ENQUEUE_CHUNK * 2 + 17  # more than two chunks, written in one transaction
    async with oke("shop", database_url=db_url) as app:
        ids = await app.emit_many(orders, ({"n": n} for n in range(count)))  # a generator
        assert len(ids) == len(set(ids)) == count
        rows = await fetch(db_url, "SELECT id, payload, status FROM oke_messages ORDER BY seq")
        assert [r[0] for r in rows] == ids
        assert [r[1] for r in rows[:3]] == ['{"n":0}', '{"n":1}', '{"n":2}']
        assert {r[2] for r in rows} == {"pending"}
        # the counts the overview reads follow rows written in bulk (COPY on PostgreSQL) too
        [stats] = [st for st in await ops.stats(app.store) if st.signal == "orders"]
        assert (stats.pending, stats.delivered) == (count, 0)
        await app.drain()
        [stats] = [st for st in await ops.stats(app.store) if st.signal == "orders"]
        assert (stats.pending, stats.delivered) == (0, count)
    assert sorted(handled) == list(range(count))


async def test_a_large_keyed_batch_keeps_each_keys_order_for_a_running_worker(db_url):
    jobs = signal.once("jobs")
    seen: list[tuple[str, int]] = []
    done = asyncio.Event()
    count = COPY_FROM_ROWS + 3  # large enough to be written in bulk

    def handle(p, fx):
        seen.append((p["k"], p["n"]))
        if len(seen) == count:
            done.set()

    on(jobs, flow("w.jobs", do=handle))
    keys = [f"k{n % 50}" for n in range(count)]
    async with oke("shop", database_url=db_url) as app:
        worker = asyncio.create_task(app.run(concurrency=8))
        await asyncio.sleep(0.5)  # the worker is up and idle
        await app.emit_many(jobs, [{"k": k, "n": n} for n, k in enumerate(keys)], keys=keys)
        await asyncio.wait_for(done.wait(), 90)
        await app.stop()
        await worker
    for key in set(keys):
        assert [n for k, n in seen if k == key] == [n for n, k in enumerate(keys) if k == key]


async def test_keys_give_one_key_per_payload_and_keep_each_keys_order(db_url):
    jobs = signal.once("jobs")
    seen: list[tuple[str | None, int]] = []
    on(jobs, flow("w.jobs", do=lambda p, fx: seen.append((p["k"], p["n"]))))
    keys = ["a", "b", None, "a", "b", "a"]
    async with oke("shop", database_url=db_url) as app:
        ids = await app.emit_many(jobs, [{"k": k, "n": n} for n, k in enumerate(keys)], keys=iter(keys))
        rows = await fetch(db_url, "SELECT id, key FROM oke_messages ORDER BY seq")
        assert rows == list(zip(ids, keys, strict=True))
        await app.drain(concurrency=4)
    for key in ("a", "b"):
        assert [n for k, n in seen if k == key] == [n for n, k in enumerate(keys) if k == key]


async def test_one_bad_payload_names_its_index_and_nothing_is_stored(db_url):
    orders = signal.once("orders", schema=Order)
    on(orders, flow("w.orders", do=lambda p, fx: None))
    async with oke("shop", database_url=db_url) as app:
        payloads = [{"n": n} for n in range(ENQUEUE_CHUNK + 10)]
        payloads[ENQUEUE_CHUNK + 3] = {"n": "not a number"}
        with pytest.raises(OkeError) as caught:
            await app.emit_many(orders, payloads)
        assert caught.value.code == 1250
        assert f"payload {ENQUEUE_CHUNK + 3}:" in str(caught.value)
        assert str(caught.value).startswith('OKE1250: "orders": payload')
        with pytest.raises(ValueError, match=r"a key has 1 to 1000 characters \(payload 1\)"):
            await app.emit_many(orders, [{"n": 1}, {"n": 2}], keys=["ok", ""])
        with pytest.raises(TypeError, match=r"a key is a string, got int \(payload 0\)"):
            await app.emit_many(orders, [{"n": 1}], keys=[7])
    assert await scalar(db_url, "SELECT count(*) FROM oke_messages") == 0


async def test_keys_of_another_length_and_other_bad_arguments_are_refused(db_url):
    orders = signal.once("orders", optional=True)
    tape = signal.live("tape", optional=True)
    async with oke("shop", database_url=db_url) as app:
        with pytest.raises(ValueError, match="more payloads than keys"):
            await app.emit_many(orders, [1, 2, 3], keys=["a", "b"])
        with pytest.raises(ValueError, match="more keys than payloads"):
            await app.emit_many(orders, [1], keys=["a", "b"])
        with pytest.raises(TypeError, match="an iterable of payloads"):
            await app.emit_many(orders, 42)
        with pytest.raises(TypeError, match="an iterable of payloads"):
            await app.emit_many(orders, {"n": 1})  # one payload, not many
        with pytest.raises(TypeError, match="one key"):
            await app.emit_many(orders, [1, 2], keys="ab")
        with pytest.raises(TypeError, match="live signal"):
            await app.emit_many(tape, [1])
        with pytest.raises(OkeError, match="OKE1240"):
            await app.emit_many(signal.once("nobody"), [1])
        for option, error in (({"delay": "-1s"}, ValueError), ({"priority": "5"}, TypeError),
                              ({"delay": "1s", "at": 1_900_000_000_000}, TypeError)):
            with pytest.raises(error, match="emit_many"):
                await app.emit_many(orders, [1], **option)
        assert await app.emit_many(orders, []) == []
    assert await scalar(db_url, "SELECT count(*) FROM oke_messages") == 0


async def test_broadcast_gets_a_copy_per_flow_of_every_payload(db_url):
    news = signal.broadcast("news")
    on(news, flow("w.mail", do=lambda p, fx: None))
    on(news, flow("w.feed", do=lambda p, fx: None))
    async with oke("shop", database_url=db_url) as app:
        ids = await app.emit_many(news, ["a", "b"])
        rows = await fetch(db_url, "SELECT id, payload, flow FROM oke_messages ORDER BY seq")
    assert len(rows) == 4 and ids[0] == rows[0][0] and ids[1] == rows[2][0]
    assert [(r[1], r[2]) for r in rows] == [('"a"', "w.feed"), ('"a"', "w.mail"), ('"b"', "w.feed"), ('"b"', "w.mail")]


async def test_emit_many_in_the_callers_transaction_commits_or_rolls_back_with_it(db_url):
    orders = signal.once("orders", optional=True)
    async with oke("shop", database_url=db_url) as app:
        sa = create_async_engine(db_url)
        try:
            with pytest.raises(LookupError):
                async with sa.begin() as conn:
                    await app.emit_many(orders, range(ENQUEUE_CHUNK + 1), keys=[f"k{n % 7}" for n in range(5001)],
                                        conn=conn)
                    raise LookupError("changed my mind")
            assert await scalar(db_url, "SELECT count(*) FROM oke_messages") == 0
            async with sa.begin() as conn:
                await conn.execute(text("SELECT 1"))
                ids = await app.emit_many(orders, range(3), conn=conn)
        finally:
            await sa.dispose()
    assert [r[0] for r in await fetch(db_url, "SELECT id FROM oke_messages ORDER BY seq")] == ids


async def test_delay_and_priority_apply_to_every_message_of_the_call(db_url):
    orders = signal.once("orders")
    on(orders, flow("w.orders", do=lambda p, fx: None))
    async with oke("shop", database_url=db_url) as app:
        later = await app.emit_many(orders, [1, 2, 3], delay="1h", priority=7)
        now = await app.emit_many(orders, [4])
        rows = await fetch(db_url, "SELECT id, run_at, priority, created_at FROM oke_messages ORDER BY seq")
        await app.drain()  # only the due one runs
        states = {r[0]: r[1] for r in await fetch(db_url, "SELECT id, status FROM oke_messages")}
    by_id = {r[0]: r for r in rows}
    for msg_id in later:
        _, run_at, priority, created_at = by_id[msg_id]
        assert priority == 7 and 3_590_000 <= run_at - created_at <= 3_610_000
        assert states[msg_id] == "pending"
    assert by_id[now[0]][1:3] == (None, 0) and states[now[0]] == "delivered"
