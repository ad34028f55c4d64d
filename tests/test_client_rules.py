"""The seeds' client table for the Python client, against a real server on 127.0.0.1.

Each row (the `auto_resubscribe` default and both of its values, the back-off, `on_open`, `on_error`
on a drop and on a 410, the per-flow form, a frame that is not JSON) has a test here; the same rows
for the browser module are tests/test_browser_client.py. The back-off's 30 s cap is
tests/unit/test_client_backoff.py.
"""
from __future__ import annotations

import asyncio
import time

import pytest

import clientkit
from clientkit import SEEN, TOKEN, declare
from engine import oke
from engine.client import BadFrame, Client, LiveEvent, LiveResumeGap, StreamDropped
from livekit import free_port, serving


@pytest.fixture(autouse=True)
def _fresh():
    clientkit.reset()
    yield
    clientkit.reset()


async def until(check, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def test_by_default_a_drop_raises_StreamDropped_and_the_stream_ends(sqlite_url):
    status = declare()
    port = free_port()
    async with oke("shop", database_url=sqlite_url) as app:
        async with serving(app, port=port) as base:
            a1 = await app.emit(status, {"orderId": "a", "n": 1})
            stream = Client(base, token=TOKEN).stream(status, {"orderId": "a"})
            assert await asyncio.wait_for(anext(stream), 10) == LiveEvent(a1, {"orderId": "a", "n": 1})
            following = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0.2)
        # the server stopped: its stream ended with [DONE]
        with pytest.raises(StreamDropped) as caught:
            await asyncio.wait_for(following, 10)
        dropped = caught.value
        assert (dropped.signal, dropped.last_id, dropped.opened) == ("order-status", a1, True)
        assert str(dropped).startswith(f'live "order-status": the stream dropped after "{a1}" (')
        async with serving(app, port=port):
            await asyncio.sleep(1.0)  # longer than the first back-off: nothing reopens by itself
        assert [s.last_event_id for s in SEEN] == [None]


async def test_by_default_live_hands_a_drop_to_on_error_and_ends(sqlite_url):
    status = declare()
    port = free_port()
    events, errors, opened = [], [], []
    async with oke("shop", database_url=sqlite_url) as app:
        async with serving(app, port=port) as base:
            stop = Client(base, token=TOKEN).live(status, on_event=events.append, on_error=errors.append,
                                                  on_open=lambda: opened.append(1))
            first = await app.emit(status, {"orderId": "a"})
            await until(lambda: len(events) == 1)
        await until(lambda: errors)
        assert isinstance(errors[0], StreamDropped) and errors[0].last_id == first
        async with serving(app, port=port):
            await app.emit(status, {"orderId": "b"})
            await asyncio.sleep(1.0)
        stop()
        stop()  # twice: harmless
    assert [e.id for e in events] == [first] and len(errors) == 1 and opened == [1]
    assert len(SEEN) == 1


async def test_by_default_a_first_connection_that_fails_is_StreamDropped_not_retried(sqlite_url):
    status = declare()
    async with oke("shop", database_url=sqlite_url) as app, serving(app) as base:
        clientkit.BUSY["left"] = 1  # a 503, as while the store is away
        with pytest.raises(StreamDropped) as caught:
            await anext(Client(base, token=TOKEN).stream(status))
        assert caught.value.opened is False and "could not open" in str(caught.value)
        assert "HTTP 503 StoreUnavailable" in str(caught.value)
        assert len(SEEN) == 1


async def test_by_default_a_410_goes_to_on_error_and_ends(sqlite_url):
    status = declare(retention={"max_count": 3})
    async with oke("shop", database_url=sqlite_url) as app, serving(app) as base:
        ids = [await app.emit(status, {"n": i}) for i in range(6)]
        events, errors = [], []
        Client(base, token=TOKEN).live(status, on_event=events.append, on_error=errors.append,
                                       last_event_id=ids[0])
        await until(lambda: errors)
        await asyncio.sleep(1.0)
        assert isinstance(errors[0], LiveResumeGap) and errors[0].reason == "pruned"
        assert events == [] and [s.last_event_id for s in SEEN] == [ids[0]]


async def test_auto_resubscribe_reopens_after_500ms_doubling(sqlite_url):
    status = declare()
    async with oke("shop", database_url=sqlite_url) as app, serving(app) as base:
        first = await app.emit(status, {"n": 1})
        clientkit.BUSY["left"] = 3
        opened: list[float] = []
        stream = Client(base, token=TOKEN).stream(status, auto_resubscribe=True,
                                                  on_open=lambda: opened.append(time.monotonic()))
        try:
            assert (await asyncio.wait_for(anext(stream), 20)).id == first
        finally:
            await stream.aclose()
    waits = [b.at - a.at for a, b in zip(SEEN, SEEN[1:])]
    assert len(waits) == 3 and len(opened) == 1  # three 503s, then the one open
    # 500 ms, 1 s, 2 s: jitter only lengthens a wait (by up to a quarter); margin for a loaded machine
    for wait, base_s in zip(waits, (0.5, 1.0, 2.0)):
        assert base_s <= wait < base_s * 1.25 + 0.6, waits


async def test_auto_resubscribe_reopens_after_a_restart_with_on_open_each_time_and_no_duplicates(db_url):
    status = declare()
    port = free_port()
    events, errors, opens = [], [], []
    async with oke("shop", database_url=db_url) as app:
        async with serving(app, port=port) as base:
            stop = Client(base, token=TOKEN).live(status, {"orderId": "a"}, on_event=events.append,
                                                  on_error=errors.append, on_open=lambda: opens.append(1),
                                                  auto_resubscribe=True)
            before = await app.emit(status, {"orderId": "a", "n": 0})
            await until(lambda: len(events) == 1)
        missed = [await app.emit(status, {"orderId": "a", "n": i}) for i in (1, 2)]
        async with serving(app, port=port):
            await until(lambda: len(events) == 3)
            after = await app.emit(status, {"orderId": "a", "n": 3})
            await until(lambda: len(events) == 4)
            await asyncio.sleep(0.3)
            stop()
    assert [e.id for e in events] == [before, *missed, after]
    assert errors == [] and len(opens) == 2
    assert SEEN[0].last_event_id is None and SEEN[-1].last_event_id == before


async def test_client_flow_names_the_exposing_flow(sqlite_url):
    status = declare()
    async with oke("shop", database_url=sqlite_url) as app, serving(app) as base:
        await app.emit(status, {"orderId": "a", "status": "paid"})
        shipped = await app.emit(status, {"orderId": "b", "status": "shipped"})
        public = Client(base)  # orders.vip is public: no token
        stream = public.flow("orders.vip").stream()
        try:
            assert await asyncio.wait_for(anext(stream), 10) == LiveEvent(shipped, {"orderId": "b",
                                                                                    "status": "shipped"})
        finally:
            await stream.aclose()
        got: list[LiveEvent] = []
        stop = public.flow("orders.vip").live(on_event=got.append)
        await until(lambda: got)
        stop()
        assert [e.id for e in got] == [shipped]
        # a gated flow is not listed to a caller its gate refuses: the error names only what it may see
        with pytest.raises(ValueError, match=r'flow "orders.odd": no live exposure .*\(flows: orders.vip; '):
            await anext(public.flow("orders.odd").stream())
        with pytest.raises(ValueError, match=r"\(flows: orders.odd, orders.vip; "):
            await anext(Client(base, token=TOKEN).flow("nope").stream())
    assert SEEN == []  # the public flow's streams never asked the member gate


async def test_a_frame_that_is_not_json_reaches_on_error_and_the_stream_goes_on(sqlite_url):
    declare()
    async with oke("shop", database_url=sqlite_url) as app, serving(app) as base:
        api = Client(base, token=TOKEN)
        events, errors = [], []
        stop = api.flow("orders.odd").live(on_event=events.append, on_error=errors.append)
        await until(lambda: len(events) == 2)
        await asyncio.sleep(0.5)  # heartbeats keep coming; the stream is still open
        stop()
        assert [e.data for e in events] == [{"n": 1}, {"n": 3}]
        assert len(errors) == 1 and isinstance(errors[0], BadFrame) and errors[0].event_id == "x.2"
        assert "not JSON" in str(errors[0]) and "'not json {'" in str(errors[0])
        assert len(SEEN) == 1  # one connection: the bad frame did not end it
        stream = api.flow("orders.odd").stream()  # an iterator has nobody to hand it to: it raises
        try:
            assert (await anext(stream)).data == {"n": 1}
            with pytest.raises(BadFrame):
                await anext(stream)
        finally:
            await stream.aclose()
