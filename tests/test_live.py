"""Live tapes over real HTTP on 127.0.0.1: ids, replay, resume, 410 reasons, filters, gates."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from engine import Unauthorized, gate, http, oke, on, signal
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
    assert status.name == bare.name
