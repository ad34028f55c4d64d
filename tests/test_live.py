"""Live tapes over real HTTP on 127.0.0.1: ids, replay, resume, 410 reasons, filters, gates."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from sqlalchemy import select

from engine import Unauthorized, gate, http, oke, on, signal
from engine.live import tape as live
from engine.store import schema
from livekit import data_of, read_frames, serving


def bearer(request):
    if request.headers.get("authorization") != "Bearer s3cret":
        raise Unauthorized("missing or wrong token")
    return {"user": "ops"}


def declare(retention=None):
    status = signal.live("order-status", retention=retention)
    member = gate("member", bearer)
    on(http.live(status).gate(member))
    on(http.get("/orders/:orderId/events").gate(member).live(status))
    return status


AUTH = {"Authorization": "Bearer s3cret"}


async def test_firehose_replays_then_follows_live(db_url):
    status = declare()
    app = oke("shop", database_url=db_url)
    async with app, serving(app) as base, httpx.AsyncClient(timeout=10) as client:
        ids = [await app.emit(status, {"orderId": f"o{i}", "status": "paid"}) for i in range(3)]
        epoch = ids[0].split(".")[0]
        assert ids == [f"{epoch}.{n}" for n in (1, 2, 3)]

        async def later():
            await asyncio.sleep(0.3)
            await app.emit(status, {"orderId": "o9", "status": "shipped"})

        emitter = asyncio.create_task(later())
        response, frames = await read_frames(client, f"{base}/_oke/live/order-status", 4, AUTH)
        await emitter
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        assert [f["id"] for f in frames] == ids + [f"{epoch}.4"]
        assert data_of(frames)[-1] == {"orderId": "o9", "status": "shipped"}


async def test_resume_after_cursor_and_410_reasons(db_url):
    status = declare(retention={"max_count": 3})
    app = oke("shop", database_url=db_url)
    async with app, serving(app) as base, httpx.AsyncClient(timeout=10) as client:
        ids = [await app.emit(status, {"orderId": "o1", "n": i}) for i in range(6)]
        epoch = ids[0].split(".")[0]
        # retained: 4, 5, 6; pruned through 3. Resuming exactly at 3 is fine.
        _r, frames = await read_frames(client, f"{base}/_oke/live/order-status", 3,
                                       {**AUTH, "Last-Event-ID": f"{epoch}.3"})
        assert [f["id"] for f in frames] == ids[3:]
        # ?lastEventId= for clients that cannot set headers; the header wins over it.
        _r, frames = await read_frames(client, f"{base}/_oke/live/order-status?lastEventId={epoch}.4", 2, AUTH)
        assert [f["id"] for f in frames] == ids[4:]
        _r, frames = await read_frames(client, f"{base}/_oke/live/order-status?lastEventId=garbage", 1,
                                       {**AUTH, "Last-Event-ID": f"{epoch}.5"})
        assert [f["id"] for f in frames] == ids[5:]
        cases = {"garbage": "malformed", "zzzz.1": "reset", f"{epoch}.99": "unknown", f"{epoch}.1": "pruned"}
        for cursor, reason in cases.items():
            response, _ = await read_frames(client, f"{base}/_oke/live/order-status", 1,
                                            {**AUTH, "Last-Event-ID": cursor})
            assert response.status_code == 410, cursor
            body = response.json()
            assert body["data"] is None
            error = body["error"]
            assert error["code"] == "LiveResumeGap" and error["oke"] == 1210
            assert error["message"] == f'Cursor "{cursor}" missing on "order-status".'
            assert error["data"]["signal"] == "order-status" and error["data"]["afterId"] == cursor
            assert error["data"]["reason"] == reason
            assert error["data"]["firstId"] == f"{epoch}.4"
            if reason == "pruned":
                assert error["data"]["missed"] == 2


async def test_path_params_filter_and_gates(db_url):
    status = declare()
    app = oke("shop", database_url=db_url)
    async with app, serving(app) as base, httpx.AsyncClient(timeout=10) as client:
        await app.emit(status, {"orderId": "a", "status": "paid"})
        await app.emit(status, {"orderId": "b", "status": "paid"})
        await app.emit(status, {"status": "maintenance"})  # no orderId: the param is skipped
        await app.emit(status, {"orderId": "a", "status": "shipped"})
        _r, frames = await read_frames(client, f"{base}/orders/a/events", 3, AUTH)
        assert data_of(frames) == [{"orderId": "a", "status": "paid"}, {"status": "maintenance"},
                                   {"orderId": "a", "status": "shipped"}]
        response, _ = await read_frames(client, f"{base}/orders/a/events", 1)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "Unauthorized"
        response = await client.get(f"{base}/nowhere")
        assert response.status_code == 404 and response.text == "Not Found"
        response = await client.get(f"{base}/_oke/live/nope", headers=AUTH)
        assert response.status_code == 404


async def test_an_emitter_without_the_exposure_finds_the_one_another_process_recorded(db_url):
    import engine

    status = declare()
    async with oke("server", database_url=db_url):
        pass  # boots once: records the exposures of order-status
    engine.reset()
    bare = signal.live("order-status")  # declared, not exposed, not optional, in this "process"
    async with oke("producer", database_url=db_url, bindings=[]) as producer:
        event_id = await producer.emit(bare, {"orderId": "o1", "status": "paid"})
        assert event_id.endswith(".1")
        lonely = signal.live("nobody-listens")
        with pytest.raises(engine.OkeError) as err:
            await producer.emit(lonely, {"x": 1})
        assert err.value.code == 1240
        # a live signal's subscribers are exposures (on(signal, flow) is refused at boot): say so
        assert str(err.value) == (
            'OKE1240: Flow "producer" emits signal "nobody-listens" with no subscriber. Fix: Mount an exposure '
            'with on(http.live(signal).gate(...)) or on(http.get("/path").gate(...).live(signal)) or declare '
            "the signal with optional=True.")
    assert status.name == bare.name


# ------------------------------------------------------------------ group commit of live appends

class CountingWrites:
    """Counts store.write calls (one per transaction) on one app's store instance."""

    def __init__(self, app) -> None:
        self.count = 0
        original = app.store.write

        async def write(fn):
            self.count += 1
            return await original(fn)

        app.store.write = write


def seq_of(event_id: str) -> int:
    return int(event_id.split(".")[1])


async def test_concurrent_emits_share_a_transaction_and_stream_once_in_order(db_url):
    status = declare()
    app = oke("shop", database_url=db_url)
    async with app, serving(app) as base, httpx.AsyncClient(timeout=30) as client:
        first = await app.emit(status, {"orderId": "o", "n": -1})
        epoch = first.split(".")[0]
        reader = asyncio.create_task(read_frames(client, f"{base}/_oke/live/order-status", 201, AUTH,
                                                 timeout=30))
        while not any(h.subscribers and h.ready.is_set() for h in app.asgi.hubs().hubs.values()):
            await asyncio.sleep(0.01)  # the stream is live: what follows comes through the hub
        writes = CountingWrites(app)
        ids = await asyncio.gather(*(app.emit(status, {"orderId": "o", "n": n}) for n in range(200)))
        assert writes.count < 20, f"{writes.count} transactions for 200 concurrent emits"
        assert len(set(ids)) == 200
        assert [seq_of(i) for i in ids] == list(range(2, 202)), "ids follow emit order"
        _response, frames = await reader
        tape = await app.store.read(lambda c: live.read_after(c, "order-status", 0, 1000))
    assert [e.seq for e in tape] == list(range(1, 202))
    assert [json.loads(e.payload)["n"] for e in tape] == list(range(-1, 200))  # tape order = emit order
    assert [f["id"] for f in frames] == [first] + ids  # every event exactly once, in order
    assert [d["n"] for d in data_of(frames)] == list(range(-1, 200))
    assert all(i.startswith(f"{epoch}.") for i in ids)


async def test_a_batch_keeps_each_emits_parent_run_id(db_url):
    status = signal.live("ticks", optional=True)
    async with oke("shop", database_url=db_url) as app:
        await app.emit(status, {"i": -1}, parent_run_id="run_0")  # caches the bindings
        writes = CountingWrites(app)
        parents = [None, "run_a", "run_a", "run_b", None, "run_c"]
        ids = await asyncio.gather(*(app.emit(status, {"i": i}, parent_run_id=p) for i, p in enumerate(parents)))
        assert writes.count < len(parents)
        rows = await app.store.read(lambda c: c.execute(
            select(schema.tape_events.c.seq, schema.tape_events.c.parent_run_id)
            .where(schema.tape_events.c.signal == "ticks").order_by(schema.tape_events.c.seq)).all())
    assert [seq_of(i) for i in ids] == [r[0] for r in rows][1:] == list(range(2, 8))
    assert [r[1] for r in rows] == ["run_0"] + parents


async def test_a_store_error_reaches_every_caller_of_its_batch(db_url):
    status = signal.live("ticks", optional=True)
    async with oke("shop", database_url=db_url) as app:
        await app.emit(status, {"i": -1})  # the bindings are read and cached: the next emits queue at once
        original = app.store.write
        failures = 1

        async def write(fn):
            nonlocal failures
            if failures:
                failures -= 1
                raise ValueError("not an outage")
            return await original(fn)

        app.store.write = write
        results = await asyncio.gather(*(app.emit(status, {"i": i}) for i in range(10)), return_exceptions=True)
        assert all(isinstance(r, ValueError) for r in results), results
        ids = await asyncio.gather(*(app.emit(status, {"i": i}) for i in range(10)))  # the next batch commits
        assert [seq_of(i) for i in ids] == list(range(2, 12))


async def test_a_caller_cancelled_while_queued_is_left_out(db_url):
    status = signal.live("ticks", optional=True)
    async with oke("shop", database_url=db_url) as app:
        await app.emit(status, {"i": -1})  # the bindings are read and cached: the next emits queue at once
        tasks = [asyncio.create_task(app.emit(status, {"i": i})) for i in range(10)]
        await asyncio.sleep(0)  # every emit is queued; the flusher has not run yet
        tasks[3].cancel()
        tasks[5].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[3], asyncio.CancelledError) and isinstance(done[5], asyncio.CancelledError)
        kept = [d for d in done if isinstance(d, str)]
        assert [seq_of(i) for i in kept] == list(range(2, 10))
        tape = await app.store.read(lambda c: live.read_after(c, "ticks", 0, 100))
    assert [json.loads(e.payload)["i"] for e in tape] == [-1, 0, 1, 2, 4, 6, 7, 8, 9]


async def test_close_flushes_pending_appends_and_leaves_no_task(db_url):
    status = signal.live("ticks", optional=True)
    app = oke("shop", database_url=db_url)
    await app.start()
    await app.emit(status, {"i": -1})
    tasks = [asyncio.create_task(app.emit(status, {"i": i})) for i in range(50)]
    await asyncio.sleep(0)  # queued, the first transaction about to start
    await app.close()
    assert all(t.done() for t in tasks)
    ids = [t.result() for t in tasks]  # flushed before the store closed, none dropped
    assert [seq_of(i) for i in ids] == list(range(2, 52))
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("oke-append")]
    with pytest.raises(RuntimeError):
        await app.emit(status, {"i": "late"})
    async with oke("shop", database_url=db_url) as again:
        tape = await again.store.read(lambda c: live.read_after(c, "ticks", 0, 100))
    assert [json.loads(e.payload)["i"] for e in tape] == list(range(-1, 50))


async def test_a_hub_with_many_subscribers_paces_its_reads_and_loses_nothing(db_url):
    """With 1,000 streams each read costs 1,000 writes: the hub spaces its reads (≤ 20 ms), so a
    steady trickle of emits reaches each subscriber in fewer, fuller batches, all events in order."""
    from engine.live.hub import PACE_MAX_S, HubRegistry

    ticks = signal.live("ticks", optional=True)
    async with oke("shop", database_url=db_url) as app:
        hubs = HubRegistry(app.store)
        hub = hubs.hub("ticks")
        subs = [hub.subscribe() for _ in range(1000)]
        assert hub.pace_s() == PACE_MAX_S
        await asyncio.wait_for(hub.ready.wait(), 10)
        ids = []
        began = time.monotonic()
        for n in range(40):  # one emit every 2 ms: unpaced, nearly every read would carry one event
            ids.append(await app.emit(ticks, {"n": n}))
            hubs.wake("ticks")
            await asyncio.sleep(0.002)
        async with asyncio.timeout(10):
            while sum(len(b) for b in list(subs[0].queue._queue)) < 40:
                await asyncio.sleep(0.01)
        # paced: at most one read per PACE_MAX_S from the first emit until the last event was read (on
        # a loaded machine the emits, and the hub's last reads after them, take longer)
        most_reads = max(20, int((time.monotonic() - began) / PACE_MAX_S) + 2)
        for sub in (subs[0], subs[-1]):
            batches = list(sub.queue._queue)
            assert [item.id for batch in batches for item in batch] == ids
            assert len(batches) <= most_reads, f"{len(batches)} reads for 40 events (at most {most_reads})"
        few = hubs.hub("other")
        few.subscribe()
        assert few.pace_s() < 0.0001  # a handful of streams is not held back
        hubs.close()
