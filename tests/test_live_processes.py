"""Across processes, on SQLite and PostgreSQL: live tapes served by another process, resume after a
server restart, and broadcast copies delivered once per flow by two worker processes.

The servers and workers are real child processes (tests/live_workers/*.py) sharing the test's store.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import httpx

from engine import oke
from engine.client import Client
from live_workers.apps import AUTH, declare_catalog, declare_shop
from live_workers.kit import Proc, sql, sse
from livekit import free_port, wait_listening


async def start_server(db_url: str, port: int, *args: str) -> Proc:
    proc = Proc("serve_app.py", db_url, str(port), *args)
    try:
        await proc.wait_line("booted")
        await wait_listening(port, timeout=20)
    except BaseException:
        proc.kill()
        raise
    return proc


async def test_an_emit_in_one_process_reaches_a_stream_served_by_another(db_url):
    status = declare_shop()
    port = free_port()
    server = await start_server(db_url, port)
    try:
        base = f"http://127.0.0.1:{port}"
        async with oke("shop-emitter", database_url=db_url) as app, httpx.AsyncClient() as c:
            async with sse(c, f"{base}/_oke/live/order-status", AUTH) as hose, \
                    sse(c, f"{base}/orders/a/events", AUTH) as only_a:
                assert hose.response.status_code == 200 and only_a.response.status_code == 200
                assert await hose.silent_for(0.2)
                # woken by NOTIFY on PostgreSQL, by the WAL watch on SQLite, not by the 1 s fallback poll:
                # the median of a few emit-to-receive latencies (one scheduling hiccup cannot decide it)
                latencies, warmups = [], []
                for n in range(5):
                    warmups.append(await app.emit(status, {"orderId": "w", "n": n}))
                    committed = time.monotonic()
                    [frame] = await hose.events(1)
                    latencies.append(time.monotonic() - committed)
                    assert frame.id == warmups[-1] and frame.value == {"orderId": "w", "n": n}
                    await asyncio.sleep(0.05)
                assert sorted(latencies)[2] < 0.5, latencies
                first = await app.emit(status, {"orderId": "a", "n": 0})
                assert [f.id for f in await hose.events(1)] == [first]

                async def emit_many(tag: str) -> list[str]:
                    return [await app.emit(status, {"orderId": tag, "n": i}) for i in range(40)]

                a_ids, b_ids = await asyncio.gather(emit_many("a"), emit_many("b"))
                got = await hose.events(80)
                assert sorted(a_ids + b_ids, key=lambda i: int(i.split(".")[1])) == [f.id for f in got]
                assert [f.id for f in await only_a.events(40)] == [first] + a_ids[:39]
                assert [f.id for f in await only_a.events(1)] == [a_ids[39]]
                # the server process stops: its open streams end with [DONE]
                server.terminate()
                for s in (hose, only_a):
                    rest = await s.rest(10)
                    assert [f.raw for f in rest if not f.comment] == [b"data: [DONE]\n\n"], rest
        assert await server.wait(15) in (0, -15)
    finally:
        server.kill()


async def test_resume_after_a_server_restart_gets_exactly_the_missed_events(db_url):
    status = declare_shop()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = await start_server(db_url, port)
    try:
        async with oke("shop-emitter", database_url=db_url) as app, httpx.AsyncClient() as c:
            before = [await app.emit(status, {"orderId": "a", "n": i}) for i in range(3)]
            # a Python client that reconnects by itself, beside a raw stream that resumes by hand
            api = Client(base, token="s3cret")
            followed: list = []

            async def follow() -> None:
                async for event in api.stream(status, auto_resubscribe=True):
                    followed.append(event)

            follower = asyncio.create_task(follow())
            async with sse(c, f"{base}/_oke/live/order-status", AUTH) as s:
                assert [f.id for f in await s.events(3)] == before
                server.kill()  # a crash: no [DONE], the connection just drops
                await server.wait()
                rest = await s.rest(10)  # the connection drops without [DONE]
                assert s.ended and [f.raw for f in rest if not f.comment] == []
            missed = [await app.emit(status, {"orderId": "a", "n": i}) for i in range(3, 7)]
            server = await start_server(db_url, port)
            async with sse(c, f"{base}/_oke/live/order-status", {**AUTH, "Last-Event-ID": before[-1]}) as s:
                assert s.response.status_code == 200
                assert [f.id for f in await s.events(4)] == missed
                assert await s.silent_for(0.3)
                after = await app.emit(status, {"orderId": "a", "n": 7})
                assert [f.id for f in await s.events(1)] == [after]
            deadline = time.monotonic() + 15
            while len(followed) < 8 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            assert [e.id for e in followed] == before + missed + [after]
    finally:
        server.kill()


# ------------------------------------------------------------------------------------ broadcast

async def _copies(db_url: str) -> list[tuple]:
    return await sql(db_url, "SELECT flow, payload, status, attempts, id FROM oke_messages "
                             "WHERE signal = $1 ORDER BY seq", "catalog.changed")


async def test_broadcast_gives_every_flow_its_own_copy_with_its_own_retries(db_url):
    calls: list[tuple[str, int, int]] = []
    changed = declare_catalog(lambda flow, payload, attempt: calls.append((flow, payload["n"], attempt)))
    async with oke("catalog", database_url=db_url) as app:
        first = await app.emit(changed, {"n": 1})
        await app.emit(changed, {"n": 2, "fail": True})
        await app.drain()
        dead = await app.store.read(lambda conn: conn.exec_driver_sql(
            "SELECT count(*) FROM oke_messages WHERE status = 'dead'").scalar())
    assert first.startswith("msg_")
    assert sorted(calls) == sorted([("search.index", 1, 1), ("cache.purge", 1, 1), ("search.index", 2, 1),
                                    ("cache.purge", 2, 1), ("cache.purge", 2, 2)])
    rows = await _copies(db_url)
    assert len({r[4] for r in rows}) == 4  # each copy has its own id
    state = {(flow, json.loads(payload)["n"]): (status, attempts) for flow, payload, status, attempts, _ in rows}
    assert state == {("search.index", 1): ("delivered", 1), ("cache.purge", 1): ("delivered", 1),
                     ("search.index", 2): ("delivered", 1), ("cache.purge", 2): ("dead", 2)}
    assert dead == 1
    [dead_id] = [r[4] for r in rows if r[2] == "dead"]
    failures = await sql(db_url, "SELECT attempt, code, message FROM oke_failures WHERE message_id = $1 "
                                 "ORDER BY id", dead_id)
    assert failures == [(1, "E_PURGE", "purge 2 failed on attempt 1"), (2, "E_PURGE", "purge 2 failed on attempt 2")]


async def test_two_worker_processes_deliver_each_copy_once_per_flow(db_url, tmp_path):
    logs = [tmp_path / "worker-1.jsonl", tmp_path / "worker-2.jsonl"]
    workers = [Proc("broadcast_worker.py", db_url, str(log)) for log in logs]
    try:
        for w in workers:
            await w.wait_line("ready")
        changed = declare_catalog()  # the emitter declares the signal; its flows run elsewhere
        total, failing = 60, {n for n in range(60) if n % 10 == 3}
        async with oke("catalog-emitter", database_url=db_url, bindings=[]) as app:
            await asyncio.gather(*(app.emit(changed, {"n": n, "fail": n in failing}) for n in range(total)))
        deadline = time.monotonic() + 60
        while True:
            open_rows = await sql(db_url, "SELECT count(*) FROM oke_messages WHERE signal = $1 "
                                          "AND status IN ('pending', 'inflight')", "catalog.changed")
            if open_rows[0][0] == 0:
                break
            assert time.monotonic() < deadline, f"{open_rows[0][0]} copies still open"
            await asyncio.sleep(0.1)
        for w in workers:
            w.terminate()
        for w in workers:
            assert await w.wait(20) == 0, w.stderr()
    finally:
        for w in workers:
            w.kill()
    calls = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    per_copy = Counter((c["flow"], c["n"]) for c in calls)
    for n in range(total):
        assert per_copy[("search.index", n)] == 1, n
        assert per_copy[("cache.purge", n)] == (2 if n in failing else 1), n
    attempts = {(c["flow"], c["n"]): sorted(x["attempt"] for x in calls if (x["flow"], x["n"]) == (c["flow"], c["n"]))
                for c in calls}
    assert all(a == list(range(1, len(a) + 1)) for a in attempts.values())
    # (which process took which copy is up to the claims; under load one may take nearly all)
    rows = await _copies(db_url)
    assert len(rows) == 2 * total
    state = Counter((flow, status) for flow, _p, status, _a, _id in rows)
    assert state == {("search.index", "delivered"): total, ("cache.purge", "delivered"): total - len(failing),
                     ("cache.purge", "dead"): len(failing)}
