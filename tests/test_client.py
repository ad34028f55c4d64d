"""The Python client against a real server on 127.0.0.1, on SQLite and PostgreSQL.

`stream()` and `live()`, the exposure choice by path params (and `via` for ties), resume with the
last id received (id-only heartbeats included) across a server restart, 410 as LiveResumeGap,
auto_resubscribe with its back-off, and httpx-sse's empty events (DESIGN's known trap) ignored.
The server's gate records the Last-Event-ID of every stream request, so the tests see exactly
what the client sent.
"""
from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from httpx_sse import aconnect_sse

from engine import OkeError, Unauthorized, flow, gate, http, oke, on, signal
from engine.client import Client, ClientError, LiveEvent, LiveResumeGap
from livekit import free_port, serving

SEEN: list[str | None] = []  # Last-Event-ID of each stream request, as the server received it
SEEN_AT: list[float] = []  # and when


def bearer(request):
    if request.url.path != "/_oke/exposures":  # the listing asks the gate too, to filter what it shows
        SEEN.append(request.headers.get("last-event-id"))
        SEEN_AT.append(time.monotonic())
    if request.headers.get("authorization") != "Bearer s3cret":
        raise Unauthorized("missing or wrong token")
    return {"user": "ops"}


@pytest.fixture(autouse=True)
def _seen():
    SEEN.clear()
    SEEN_AT.clear()
    yield
    SEEN.clear()


def declare(retention=None):
    status = signal.live("order-status", retention=retention)
    member = gate("member", bearer)
    on(http.live(status).gate(member))
    on(http.get("/orders/:orderId/events").gate(member).live(status))
    return status


async def consume(agen, into: asyncio.Queue) -> None:
    async for event in agen:
        await into.put(event)


async def take(queue: asyncio.Queue, count: int, timeout: float = 10.0) -> list:
    out = []
    async with asyncio.timeout(timeout):
        while len(out) < count:
            out.append(await queue.get())
    return out


async def stays_empty(queue: asyncio.Queue, seconds: float) -> bool:
    try:
        got = await asyncio.wait_for(queue.get(), seconds)
    except TimeoutError:
        return True
    raise AssertionError(f"unexpected event {got!r}")


async def test_stream_yields_live_events_from_the_exposure_its_params_fit(db_url):
    status = declare()
    async with oke("shop", database_url=db_url) as app, serving(app) as base:
        a1 = await app.emit(status, {"orderId": "a", "n": 1})
        b1 = await app.emit(status, {"orderId": "b", "n": 1})
        api = Client(base, token="s3cret")
        by_order, everything = asyncio.Queue(), asyncio.Queue()
        tasks = [asyncio.create_task(consume(api.stream(status, {"orderId": "a"}), by_order)),
                 asyncio.create_task(consume(api.stream("order-status"), everything))]
        try:
            assert await take(by_order, 1) == [LiveEvent(a1, {"orderId": "a", "n": 1})]
            assert await take(everything, 2) == [LiveEvent(a1, {"orderId": "a", "n": 1}),
                                                 LiveEvent(b1, {"orderId": "b", "n": 1})]
            a2 = await app.emit(status, {"orderId": "a", "n": 2})
            b2 = await app.emit(status, {"orderId": "b", "n": 2})
            [event] = await take(by_order, 1)
            assert isinstance(event, LiveEvent) and (event.id, event.data) == (a2, {"orderId": "a", "n": 2})
            assert [e.id for e in await take(everything, 2)] == [a2, b2]
            assert await stays_empty(by_order, 0.3)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        # the orderId exposure was chosen for the params, the firehose without them
        assert SEEN == [None, None]


async def test_a_tie_between_exposures_needs_via(db_url):
    status = declare()
    on(http.get("/feed").public().live(status))  # no params, like the firehose
    async with oke("shop", database_url=db_url) as app, serving(app) as base:
        first = await app.emit(status, {"orderId": "a"})
        api = Client(base, token="s3cret")
        with pytest.raises(ValueError, match=r"fit equally well .*pass via=PATH"):
            await anext(api.stream(status))
        with pytest.raises(ValueError, match=r'via="/nope": no exposure of "order-status" has that flow name '
                                             r"or path \(exposed at: /_oke/live/order-status, "):
            await anext(api.stream(status, via="/nope"))
        public = Client(base)  # no token: the public exposure serves it
        agen = public.stream(status, via="/feed")
        try:
            assert await asyncio.wait_for(anext(agen), 10) == LiveEvent(first, {"orderId": "a"})
        finally:
            await agen.aclose()
        agen = api.stream(status, via="/_oke/live/order-status")
        try:
            assert (await asyncio.wait_for(anext(agen), 10)).id == first
        finally:
            await agen.aclose()
        # with orderId the largest fitting subset is unique: no via needed
        agen = api.stream(status, {"orderId": "a"})
        try:
            assert (await asyncio.wait_for(anext(agen), 10)).id == first
        finally:
            await agen.aclose()


def declare_spec_example():
    """The exposures of the reference's example: the member firehose, the member `:orderId` route, the public vip flow."""
    status = declare()
    on(http.get("/orders/vip/events").public().live(status),
       flow("orders.vip", do=lambda _in, fx: fx.live(status, match=lambda p: p["status"] == "shipped")))
    return status


async def first_of(agen, timeout: float = 10.0) -> LiveEvent:
    try:
        return await asyncio.wait_for(anext(agen), timeout)
    finally:
        await agen.aclose()


async def test_a_custom_flow_never_competes_and_via_names_it_by_flow_or_path(db_url):
    status = declare_spec_example()
    async with oke("shop", database_url=db_url) as app, serving(app) as base:
        paid = await app.emit(status, {"orderId": "a", "status": "paid"})
        shipped = await app.emit(status, {"orderId": "b", "status": "shipped"})
        api = Client(base, token="s3cret")
        # no params: only the firehose is an empty set among the auto-match exposures
        assert await first_of(api.stream(status, {})) == LiveEvent(paid, {"orderId": "a", "status": "paid"})
        assert SEEN == [None]  # the member gate saw it: the firehose, not the public vip flow
        # orderId "b": the :orderId exposure is the largest subset
        assert (await first_of(api.stream(status, {"orderId": "b"}))).id == shipped
        # the custom flow only when named, by its flow name or by its path; public, so no token
        public = Client(base)
        for via in ("orders.vip", "/orders/vip/events"):
            assert await first_of(public.stream(status, via=via)) == LiveEvent(
                shipped, {"orderId": "b", "status": "shipped"}), via
        with pytest.raises(ValueError, match=r'via="orders.nope": .*\(flow "orders.vip"\)'):
            await anext(api.stream(status, via="orders.nope"))
        assert len(SEEN) == 2  # neither public stream nor the refused via reached the member gate


async def test_param_values_go_into_the_path_as_the_server_compares_them(db_url):
    status = signal.live("order-status")
    member = gate("member", bearer)
    on(http.get("/flags/:urgent/:qty/:note/events").gate(member).live(status))
    async with oke("shop", database_url=db_url) as app, serving(app) as base:
        await app.emit(status, {"urgent": False, "qty": 2, "note": "a/b c?", "n": 0})
        await app.emit(status, {"urgent": True, "qty": 1.5, "note": "a/b c?", "n": 1})
        await app.emit(status, {"urgent": True, "qty": 2, "note": "ü%", "n": 2})
        await app.emit(status, {"urgent": True, "qty": 2, "note": "a/b c?", "n": 3})
        api = Client(base, token="s3cret")
        async with httpx.AsyncClient() as c:
            path = await api.path_for(c, "order-status", {"urgent": True, "qty": 2, "note": "a/b c?"}, None)
        assert path == "/flags/true/2/a%2Fb%20c%3F/events"
        event = await first_of(api.stream(status, {"urgent": True, "qty": 2, "note": "a/b c?"}))
        assert event.data["n"] == 3
        event = await first_of(api.stream(status, {"urgent": True, "qty": 1.5, "note": "a/b c?"}))
        assert event.data["n"] == 1
        event = await first_of(api.stream(status, {"urgent": False, "qty": 2, "note": "a/b c?"}))
        assert event.data["n"] == 0
        with pytest.raises(ValueError, match=r"has no exposure whose path params fit \['qty'\]"):
            await anext(api.stream(status, {"qty": 2}))
        with pytest.raises(ValueError, match=r"a param value JSON cannot write"):
            await anext(api.stream(status, {"urgent": object(), "qty": 2, "note": "x"}))
        with pytest.raises(ValueError, match=r"needs the params qty, note"):
            await anext(api.stream(status, {"urgent": True}, via="/flags/:urgent/:qty/:note/events"))


async def test_reconnect_resumes_from_the_last_id_received_including_heartbeats(db_url):
    status = declare()
    app = oke("shop", database_url=db_url, sse_heartbeat_s=0.2)
    port = free_port()
    async with app:
        queue: asyncio.Queue = asyncio.Queue()
        async with serving(app, port=port) as base:
            api = Client(base, token="s3cret")
            opened = []
            task = asyncio.create_task(consume(api.stream(status, {"orderId": "a"}, auto_resubscribe=True,
                                                          on_open=lambda: opened.append(time.monotonic())),
                                               queue))
            a1 = await app.emit(status, {"orderId": "a", "n": 1})
            assert [e.id for e in await take(queue, 1)] == [a1]
            b_ids = [await app.emit(status, {"orderId": "b", "n": i}) for i in range(3)]
            await asyncio.sleep(0.7)  # id-only heartbeats carry the head (b_ids[-1]) to the client
        # the server is gone (the stream ended with [DONE]); this happens while it is down
        a2 = await app.emit(status, {"orderId": "a", "n": 2})
        b3 = await app.emit(status, {"orderId": "b", "n": 3})
        async with serving(app, port=port):
            try:
                assert [e.id for e in await take(queue, 1)] == [a2]
                a3 = await app.emit(status, {"orderId": "a", "n": 3})
                assert [e.id for e in await take(queue, 1)] == [a3]
                assert await stays_empty(queue, 0.3)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    assert b3 and len(opened) == 2
    # the first request had no cursor; the reconnect sent the heartbeat's head id, not a1
    assert SEEN == [None, b_ids[-1]]


async def test_a_silent_stream_is_dropped_after_idle_s_and_resumed_from_the_last_id(db_url):
    """A server that writes nothing (no event, no heartbeat: here its heartbeat is an hour; in life a
    half-open connection or a stalled proxy) is taken as a drop after idle_s, not waited on forever."""
    status = declare()
    app = oke("shop", database_url=db_url, sse_heartbeat_s=3600)
    async with app, serving(app, port=free_port()) as base:
        queue: asyncio.Queue = asyncio.Queue()
        opened: list[float] = []
        api = Client(base, token="s3cret", idle_s=0.3)
        task = asyncio.create_task(consume(api.stream(status, {"orderId": "a"}, auto_resubscribe=True,
                                                      on_open=lambda: opened.append(time.monotonic())), queue))
        try:
            a1 = await app.emit(status, {"orderId": "a", "n": 1})
            assert [e.id for e in await take(queue, 1)] == [a1]
            await asyncio.sleep(1.2)  # silence: dropped after 0.3 s, resumed, dropped again, …
            a2 = await app.emit(status, {"orderId": "a", "n": 2})
            assert [e.id for e in await take(queue, 1)] == [a2]
            assert await stays_empty(queue, 0.3)  # a1 is never delivered twice
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert len(opened) >= 2
    assert SEEN[0] is None and set(SEEN[1:]) <= {a1, a2} and a1 in SEEN[1:]


def test_client_timeouts_must_be_positive_seconds():
    for bad in (0, -1, "5", True):
        with pytest.raises(ValueError, match="idle_s"):
            Client("http://127.0.0.1:1", idle_s=bad)
        with pytest.raises(ValueError, match="timeout"):
            Client("http://127.0.0.1:1", timeout=bad)
    assert Client("http://127.0.0.1:1", idle_s=None).idle_s is None


async def test_a_410_raises_LiveResumeGap_with_reason_first_id_and_missed(db_url):
    status = declare(retention={"max_count": 5})
    async with oke("shop", database_url=db_url) as app, serving(app) as base:
        ids = [await app.emit(status, {"n": i}) for i in range(8)]  # retained 4..8
        epoch = ids[0].split(".")[0]
        api = Client(base, token="s3cret")
        with pytest.raises(LiveResumeGap) as caught:
            await anext(api.stream(status, last_event_id=ids[0]))
        gap = caught.value
        assert isinstance(gap, OkeError) and gap.code == 1210
        assert str(gap).startswith(f'OKE1210: Cursor "{ids[0]}" missing on "order-status".')
        assert (gap.reason, gap.first_id, gap.missed) == ("pruned", f"{epoch}.4", 2)
        for cursor, reason in (("garbage", "malformed"), ("abc.2", "reset"), (f"{epoch}.42", "unknown")):
            with pytest.raises(LiveResumeGap) as caught:
                await anext(api.stream(status, last_event_id=cursor))
            assert (caught.value.reason, caught.value.first_id, caught.value.missed) == (reason, f"{epoch}.4", None)
        with pytest.raises(ClientError) as refused:
            await anext(Client(base, token="wrong").stream(status))
        assert refused.value.status == 401 and refused.value.code == "Unauthorized"


async def test_auto_resubscribe_drops_the_cursor_and_replays_after_backoff(db_url):
    status = declare(retention={"max_count": 5})
    async with oke("shop", database_url=db_url) as app, serving(app) as base:
        ids = [await app.emit(status, {"n": i}) for i in range(8)]
        api = Client(base, token="s3cret")
        queue: asyncio.Queue = asyncio.Queue()
        t0 = time.monotonic()
        task = asyncio.create_task(consume(api.stream(status, last_event_id=ids[0], auto_resubscribe=True), queue))
        try:
            replayed = await take(queue, 5)
            waited = time.monotonic() - t0
            assert [e.id for e in replayed] == ids[3:]
            assert [e.data for e in replayed] == [{"n": i} for i in range(3, 8)]
            assert waited < 3, waited
            nxt = await app.emit(status, {"n": 8})
            assert [e.id for e in await take(queue, 1)] == [nxt]
            assert await stays_empty(queue, 0.2)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert SEEN == [ids[0], None]
    backoff = SEEN_AT[1] - SEEN_AT[0]  # from the refused request to the resubscription
    assert 0.5 <= backoff < 1.4, backoff  # the first back-off: 500 ms plus jitter, never less


async def test_live_callbacks_on_the_running_loop_and_stop(db_url):
    status = declare()
    async with oke("shop", database_url=db_url) as app, serving(app) as base:
        api = Client(base, token="s3cret")
        events, errors, opened = [], [], []
        stop = api.live(status, {"orderId": "a"}, on_event=events.append, on_error=errors.append,
                        on_open=lambda: opened.append(True))
        a1 = await app.emit(status, {"orderId": "a", "n": 1})
        await app.emit(status, {"orderId": "b", "n": 1})
        await _until(lambda: len(events) == 1)
        assert events == [LiveEvent(a1, {"orderId": "a", "n": 1})] and opened == [True]
        stop()
        await asyncio.sleep(0.1)
        await app.emit(status, {"orderId": "a", "n": 2})
        await asyncio.sleep(0.4)
        assert len(events) == 1 and errors == []
        await _until(lambda: not app.asgi.control.subscriptions)  # the server saw the stream go

        bad = Client(base, token="wrong")
        failures = []
        bad.live(status, on_event=events.append, on_error=failures.append)
        await _until(lambda: failures)
        assert isinstance(failures[0], ClientError) and failures[0].status == 401


async def test_live_callbacks_from_a_thread_without_a_loop(db_url):
    status = declare()
    async with oke("shop", database_url=db_url) as app, serving(app) as base:
        api = Client(base, token="s3cret")
        events: list[LiveEvent] = []
        got = threading.Event()

        def on_event(event: LiveEvent) -> None:
            events.append(event)
            got.set()

        stop = await asyncio.to_thread(lambda: api.live("order-status", on_event=on_event))
        first = await app.emit(status, {"orderId": "a"})
        assert await asyncio.to_thread(got.wait, 10)
        await asyncio.to_thread(stop)  # joins the client's thread
        assert events == [LiveEvent(first, {"orderId": "a"})]
        assert not [t for t in threading.enumerate() if t.name == "oke-client-live"]
        await app.emit(status, {"orderId": "a"})
        await asyncio.sleep(0.3)
        assert len(events) == 1


async def test_empty_data_events_from_httpx_sse_are_ignored(db_url):
    status = declare()
    app = oke("shop", database_url=db_url, sse_heartbeat_s=0.1)
    async with app, serving(app) as base:
        first = await app.emit(status, {"orderId": "a"})
        # the trap is real: after an id, httpx-sse turns a comment heartbeat into an empty event
        async with httpx.AsyncClient() as c:
            async with aconnect_sse(c, "GET", f"{base}/_oke/live/order-status",
                                    headers={"Authorization": "Bearer s3cret"}) as source:
                raw = []
                async with asyncio.timeout(5):
                    async for sse in source.aiter_sse():
                        raw.append(sse)
                        if len(raw) == 3:
                            break
        assert raw[0].data != "" and raw[1].data == "" and raw[1].id == first
        # the client yields only real events across many heartbeats
        api = Client(base, token="s3cret")
        queue: asyncio.Queue = asyncio.Queue()
        task = asyncio.create_task(consume(api.stream(status), queue))
        try:
            assert [e.id for e in await take(queue, 1)] == [first]
            await asyncio.sleep(0.5)
            second = await app.emit(status, {"orderId": "b"})
            assert await take(queue, 1) == [LiveEvent(second, {"orderId": "b"})]
            assert await stays_empty(queue, 0.4)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _until(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def test_stream_waits_for_a_server_that_is_not_up_yet(db_url):
    status = declare()
    port = free_port()
    api = Client(f"http://127.0.0.1:{port}", token="s3cret")
    queue: asyncio.Queue = asyncio.Queue()
    # nothing listens on the port yet: with auto_resubscribe the first connection is retried too
    task = asyncio.create_task(consume(api.stream(status, auto_resubscribe=True), queue))
    try:
        await asyncio.sleep(0.3)
        assert not task.done()
        async with oke("shop", database_url=db_url) as app, serving(app, port=port):
            first = await app.emit(status, {"n": 1})
            assert [e.id for e in await take(queue, 1)] == [first]
        with pytest.raises(httpx.ConnectError):  # retry_first=False fails fast instead
            await anext(Client(f"http://127.0.0.1:{free_port()}").stream(status, auto_resubscribe=True,
                                                                          retry_first=False))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
