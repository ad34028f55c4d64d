"""HTTP and SSE over real uvicorn on 127.0.0.1, on SQLite and PostgreSQL.

Boot checks, gates and their JSON envelopes, flow routes with input schemas, path tricks sent
byte for byte, SSE framing, heartbeats, [DONE] on stop, resume and every 410 reason, retention by
count and by age, concurrent emits against concurrent streams, and 1,000 connect/disconnect cycles
measured for leaks (hub subscribers, stream registrations, tasks, PostgreSQL connections, RSS).
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import re
import time

import asyncpg
import httpx
import pytest
from pydantic import BaseModel, Field

from engine import Forbidden, OkeError, Unauthorized, flow, gate, http, oke, on, signal
from engine.live import tape as live
from live_workers.kit import raw_request, seqs_of, sse, tape_rows
from livekit import free_port, serving, wait_listening

AUTH = {"Authorization": "Bearer s3cret"}
ADMIN = {**AUTH, "X-Role": "admin"}


def bearer(request):
    if request.headers.get("authorization") != "Bearer s3cret":
        raise Unauthorized("missing or wrong token")
    return {"user": "ops"}


async def admin_check(request):
    await asyncio.sleep(0.001)  # a gate may await (a session store, a token introspection)
    if request.headers.get("x-role") != "admin":
        raise Forbidden("admins only")
    return {"role": "admin"}


member = None
admin = None


def gates():
    global member, admin
    member = gate("member", bearer)
    admin = gate("admin", admin_check)
    return member, admin


def declare(retention=None, **options):
    status = signal.live("order-status", retention=retention, **options)
    m, _a = gates()
    on(http.live(status).gate(m))
    on(http.get("/orders/:orderId/events").gate(m).live(status))
    return status


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def envelope(code: str, message: str) -> dict:
    return {"data": None, "error": {"code": code, "message": message}}


# ------------------------------------------------------------------------------------ boot checks

async def test_a_route_without_gate_or_public_fails_boot(db_url):
    status = signal.live("order-status")
    on(http.live(status))  # neither .gate() nor .public()
    app = oke("shop", database_url=db_url)
    with pytest.raises(ValueError, match=r"GET /_oke/live/order-status: every HTTP route needs "
                                         r"\.gate\(\.\.\.\) or \.public\(\)"):
        await app.start()
    assert app.store is None


async def test_an_ungated_flow_route_fails_boot(db_url):
    on(http.post("/orders"), flow("orders.create", do=lambda value, fx: value))
    with pytest.raises(ValueError, match="POST /orders: every HTTP route needs"):
        async with oke("shop", database_url=db_url):
            pass


async def test_same_method_and_path_twice_is_OKE1041(db_url):
    m, _ = gates()
    on(http.get("/orders/:orderId").gate(m), flow("orders.show", do=lambda v, fx: v))
    on(http.get("/orders/:orderId").public(), flow("orders.peek", do=lambda v, fx: v))
    with pytest.raises(OkeError) as caught:
        async with oke("shop", database_url=db_url):
            pass
    assert caught.value.code == 1041
    assert str(caught.value).startswith('OKE1041: GET /orders/:orderId is bound twice (flow "orders.peek").')


async def test_same_path_with_other_methods_boots(db_url):
    m, _ = gates()
    on(http.get("/orders").gate(m), flow("orders.list", do=lambda v, fx: []))
    on(http.post("/orders").gate(m), flow("orders.create", do=lambda v, fx: v))
    async with oke("shop", database_url=db_url) as app, serving(app) as base, httpx.AsyncClient() as c:
        assert (await c.get(f"{base}/orders", headers=AUTH)).json() == {"data": [], "error": None}
        assert (await c.post(f"{base}/orders", headers=AUTH, json={"a": 1})).json() == {
            "data": {"a": 1}, "error": None}
        response = await c.delete(f"{base}/orders", headers=AUTH)
        assert response.status_code == 405


async def boot_error(db_url) -> OkeError:
    """The OkeError the app's boot raises for the routes bound so far."""
    with pytest.raises(OkeError) as caught:
        async with oke("shop", database_url=db_url):
            pass
    return caught.value


async def test_two_identical_firehoses_are_OKE1041_checked_before_OKE1050(db_url):
    status = signal.live("order-status")
    m, _ = gates()
    on(http.live(status).gate(m))
    on(http.live(status).gate(m))  # also the same (signal, gates, match): OKE1041 is checked first
    err = await boot_error(db_url)
    assert err.code == 1041
    assert str(err).startswith('OKE1041: GET /_oke/live/order-status is bound twice (flow "(exposure)").')


async def test_two_firehoses_with_other_gates_are_OKE1041_one_url(db_url):
    status = signal.live("order-status")
    m, a = gates()
    on(http.live(status).gate(m))
    on(http.live(status).gate(a))  # http.live(s) always resolves to /_oke/live/order-status
    err = await boot_error(db_url)
    assert err.code == 1041
    assert str(err).startswith('OKE1041: GET /_oke/live/order-status is bound twice')


async def test_a_second_firehose_with_other_gates_on_its_own_path_boots(db_url):
    status = signal.live("order-status")
    m, a = gates()
    on(http.live(status).gate(m))
    on(http.get("/admin/feed").gate(a).live(status))
    async with oke("shop", database_url=db_url) as app, serving(app) as base, httpx.AsyncClient() as c:
        await app.emit(status, {"n": 1})
        for url, headers in ((f"{base}/_oke/live/order-status", AUTH), (f"{base}/admin/feed", {"X-Role": "admin"})):
            async with sse(c, url, headers) as s:
                assert s.response.status_code == 200
                assert [f.value for f in await s.events(1)] == [{"n": 1}]
        # each path admits its own gate only (no more "the first whose gates pass serves")
        response = await c.get(f"{base}/_oke/live/order-status", headers={"X-Role": "admin"})
        assert (response.status_code, response.json()) == (401, envelope("Unauthorized", "missing or wrong token"))
        response = await c.get(f"{base}/admin/feed", headers=AUTH)
        assert (response.status_code, response.json()) == (403, envelope("Forbidden", "admins only"))


def _OKE1050(gates_text: str, match: str) -> str:
    return (f'OKE1050: Live signal "order-status" is exposed twice with the same gates ({gates_text}) '
            f"and match ({match}).")


async def test_two_member_firehoses_on_different_paths_are_OKE1050(db_url):
    status = signal.live("order-status")
    m, _ = gates()
    on(http.live(status).gate(m))
    on(http.get("/feed").gate(m).live(status))
    err = await boot_error(db_url)
    assert err.code == 1050 and str(err).startswith(_OKE1050("member", "(firehose)"))


async def test_the_same_params_and_gates_on_two_paths_are_OKE1050(db_url):
    status = signal.live("order-status")
    m, a = gates()
    on(http.get("/orders/:orderId/:shop/events").gate(m, a).live(status))
    on(http.get("/shops/:shop/orders/:orderId").gate(a, m).live(status))  # gate order does not matter
    err = await boot_error(db_url)
    assert err.code == 1050 and str(err).startswith(_OKE1050("admin, member", "orderId, shop"))


async def test_one_custom_flow_on_two_paths_is_OKE1050(db_url):
    status = signal.live("order-status")
    vip = flow("orders.vip", do=lambda _in, fx: fx.live(status, match=lambda p: p["status"] == "shipped"))
    on(http.get("/orders/vip/events").public().live(status), vip)
    on(http.get("/vip").public().live(status), vip)
    err = await boot_error(db_url)
    assert err.code == 1050 and str(err).startswith(_OKE1050("public", "custom:orders.vip"))


async def test_an_unnamed_custom_flow_is_its_own_match(db_url):
    status = signal.live("order-status")
    first = flow(do=lambda _in, fx: fx.live(status))
    on(http.get("/a").public().live(status), first)
    on(http.get("/b").public().live(status), flow(do=lambda _in, fx: fx.live(status)))  # another flow: boots
    async with oke("shop", database_url=db_url):
        pass
    on(http.get("/c").public().live(status), first)  # the first flow object on a second path
    err = await boot_error(db_url)
    assert err.code == 1050 and str(err).startswith(_OKE1050("public", "custom:(unnamed)"))


async def test_exposures_differing_in_gates_or_match_boot(db_url):
    status = signal.live("order-status")
    m, a = gates()
    on(http.live(status).gate(m))
    on(http.get("/admin/feed").gate(a).live(status))  # other gates
    on(http.get("/orders/:orderId/events").gate(m).live(status))  # other match
    on(http.get("/orders/vip/events").gate(m).live(status),
       flow("orders.vip", do=lambda _in, fx: fx.live(status)))  # custom:orders.vip
    on(http.get("/orders/late/events").gate(m).live(status),
       flow("orders.late", do=lambda _in, fx: fx.live(status)))  # custom:orders.late
    async with oke("shop", database_url=db_url) as app, serving(app) as base, httpx.AsyncClient() as c:
        exposures = (await c.get(f"{base}/_oke/exposures", headers=ADMIN)).json()["data"]
    # the exposures list tells a client each one's match and, for a custom one, its flow
    assert sorted((e["path"], e["match"], e["custom"], e["flow"]) for e in exposures) == [
        ("/_oke/live/order-status", "(firehose)", False, None),
        ("/admin/feed", "(firehose)", False, None),
        ("/orders/:orderId/events", "orderId", False, None),
        ("/orders/late/events", "custom:orders.late", True, "orders.late"),
        ("/orders/vip/events", "custom:orders.vip", True, "orders.vip"),
    ]


def test_live_on_a_non_get_route_is_a_type_error():
    status = signal.live("order-status")
    for route in (http.post("/x"), http.put("/x"), http.patch("/x"), http.delete("/x")):
        with pytest.raises(TypeError) as caught:
            route.public().live(status)
        assert str(caught.value) == "on(http.*.live(signal)): live exposure must be GET"


async def test_unknown_paths_are_404_not_found(db_url):
    declare()
    async with oke("shop", database_url=db_url) as app, serving(app) as base, httpx.AsyncClient() as c:
        for path in ("/nowhere", "/_oke/live/no-such-signal", "/orders/a", "/orders/a/events/more", "/_oke/x"):
            response = await c.get(base + path, headers=AUTH)
            assert (response.status_code, response.text) == (404, "Not Found"), path


# ------------------------------------------------------------------------------------ gates

async def test_gates_answer_401_and_403_with_the_json_envelope(db_url):
    status = signal.live("order-status")
    m, a = gates()
    on(http.live(status).gate(m, a))  # both must pass; the async one second
    on(http.get("/health").public(), flow("health", do=lambda v, fx: {"ok": True}))
    on(http.get("/me").gate(m), flow("me", do=lambda v, fx: {"me": "ops"}))
    async with oke("shop", database_url=db_url) as app, serving(app) as base, httpx.AsyncClient() as c:
        await app.emit(status, {"n": 1})
        url = f"{base}/_oke/live/order-status"
        response = await c.get(url)
        assert response.status_code == 401
        assert response.headers["content-type"] == "application/json"
        assert response.json() == envelope("Unauthorized", "missing or wrong token")
        response = await c.get(url, headers={"Authorization": "Bearer wrong"})
        assert response.status_code == 401
        response = await c.get(url, headers=AUTH)
        assert response.status_code == 403
        assert response.json() == envelope("Forbidden", "admins only")
        async with sse(c, url, ADMIN) as s:
            assert s.response.status_code == 200
            assert [f.value for f in await s.events(1)] == [{"n": 1}]
        # a public route needs nothing; a gated flow route refuses like an exposure
        assert (await c.get(f"{base}/health")).json() == {"data": {"ok": True}, "error": None}
        response = await c.get(f"{base}/me")
        assert (response.status_code, response.json()) == (401, envelope("Unauthorized", "missing or wrong token"))
        assert (await c.get(f"{base}/me", headers=AUTH)).json() == {"data": {"me": "ops"}, "error": None}


async def test_a_public_exposure_needs_no_credentials(db_url):
    status = signal.live("order-status")
    on(http.live(status).public())
    async with oke("shop", database_url=db_url) as app, serving(app) as base, httpx.AsyncClient() as c:
        await app.emit(status, {"n": 1})
        async with sse(c, f"{base}/_oke/live/order-status") as s:
            assert s.response.status_code == 200
            assert [f.value for f in await s.events(1)] == [{"n": 1}]


async def test_custom_match_flow_streams_only_what_it_matches(db_url):
    status = declare()  # binds the gated /orders/:orderId/events before the public vip route
    vip = on(http.get("/orders/vip/events").public().live(status),
             flow(effects={"reads": ["signal:order-status"]},
                  do=lambda _in, fx: fx.live(status, match=lambda p: p["status"] == "shipped")))
    assert vip is not None
    async with oke("shop", database_url=db_url) as app, serving(app) as base, httpx.AsyncClient() as c:
        for i, st in enumerate(["paid", "shipped", "paid", "shipped", "cancelled"]):
            await app.emit(status, {"orderId": f"o{i}", "status": st})
        # the static path wins over /orders/:orderId/events, and it is public
        async with sse(c, f"{base}/orders/vip/events") as s:
            assert s.response.status_code == 200
            frames = await s.events(2)
            assert [f.value["orderId"] for f in frames] == ["o1", "o3"]
            await app.emit(status, {"orderId": "o5", "status": "paid"})
            await app.emit(status, {"orderId": "o6", "status": "shipped"})
            [frame] = await s.events(1)
            assert frame.value == {"orderId": "o6", "status": "shipped"}
            assert frame.id.endswith(".7")
        # the param route still serves other order ids, gated
        assert (await c.get(f"{base}/orders/o1/events")).status_code == 401
        async with sse(c, f"{base}/orders/o1/events", AUTH) as s:
            assert [f.value for f in await s.events(1)] == [{"orderId": "o1", "status": "shipped"}]


async def test_fx_live_on_the_routes_own_signal_needs_no_declared_read(db_url):
    status = signal.live("order-status")
    on(http.get("/feed").public().live(status),
       flow("feeds.shipped", do=lambda _in, fx: fx.live(status, match=lambda p: p["status"] == "shipped")))
    async with oke("shop", database_url=db_url) as app, serving(app) as base, httpx.AsyncClient() as c:
        await app.emit(status, {"n": 1, "status": "paid"})
        await app.emit(status, {"n": 2, "status": "shipped"})
        async with sse(c, f"{base}/feed") as s:
            assert s.response.status_code == 200
            assert [f.value for f in await s.events(1)] == [{"n": 2, "status": "shipped"}]


async def test_fx_live_of_another_signal_without_the_read_is_OKE1001(db_url):
    status = signal.live("order-status")
    audit = signal.live("audit")
    on(http.get("/feed").public().live(status),
       flow("feeds.all", do=lambda _in, fx: fx.live(audit)))  # not the exposed signal, no effects.reads
    async with oke("shop", database_url=db_url) as app, serving(app) as base, httpx.AsyncClient() as c:
        await app.emit(status, {"n": 1})
        response = await c.get(f"{base}/feed")
        assert response.status_code == 500
        error = response.json()["error"]
        assert error["code"] == "OKE1001" and error["oke"] == 1001
        assert error["message"].startswith('OKE1001: Flow "feeds.all" reads "signal:audit" '
                                           "without declaring it.")


class NewOrder(BaseModel):
    sku: str
    qty: int = Field(ge=1)


class OrderRef(BaseModel):
    orderId: str
    verbose: bool = False


async def test_plain_flow_routes_validate_input_and_return_json(db_url):
    status = declare()

    @on(http.post("/orders", input=NewOrder).gate(member))
    @flow("orders.create")
    async def create(order: NewOrder, fx):
        assert isinstance(order, NewOrder)
        event_id = await fx.emit(status, {"orderId": "o1", "status": "created", "sku": order.sku})
        return {"sku": order.sku, "qty": order.qty, "event": event_id}

    @on(http.get("/orders/:orderId", input=OrderRef).public())
    @flow("orders.show")
    def show(ref: OrderRef, fx):  # sync handlers are allowed
        return ref  # a pydantic model is sent as its JSON

    async with oke("shop", database_url=db_url) as app, serving(app) as base, httpx.AsyncClient() as c:
        response = await c.post(f"{base}/orders", headers=AUTH, json={"sku": "tea", "qty": 2})
        assert response.status_code == 200
        body = response.json()
        assert body["error"] is None and body["data"]["sku"] == "tea" and body["data"]["qty"] == 2
        event_id = body["data"]["event"]
        async with sse(c, f"{base}/_oke/live/order-status", AUTH) as s:
            [frame] = await s.events(1)
            assert frame.id == event_id
            assert frame.value == {"orderId": "o1", "status": "created", "sku": "tea"}

        response = await c.get(f"{base}/orders/o%2F7?verbose=true")
        assert response.json() == {"data": {"orderId": "o/7", "verbose": True}, "error": None}

        response = await c.post(f"{base}/orders", headers=AUTH, json={"sku": "tea", "qty": 0})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "BadRequest" and "qty" in error["message"]
        assert response.json()["data"] is None
        response = await c.post(f"{base}/orders", headers=AUTH, content=b"{not json")
        assert response.status_code == 400 and response.json()["error"]["code"] == "BadRequest"
        response = await c.post(f"{base}/orders", json={"sku": "tea", "qty": 1})
        assert response.status_code == 401  # the gate runs before the input is read


class Declined(Exception):
    code = "E_DECLINED"


async def test_a_get_flow_may_return_engine_records_sent_as_their_json_fields(db_url):
    """The seeds' dead-letter inspection route: a GET flow returning `await fx.dead_letters(sig)`."""
    jobs = signal.once("tasks.email", retries=1)
    _m, a = gates()

    @on(jobs)
    @flow("w.email")
    async def send(payload, fx):
        raise Declined(f"no {payload['n']}")

    @on(http.get("/admin/dead").gate(a))
    @flow("admin.dead", effects={"reads": ["signal:tasks.email"]})
    async def dead(_in, fx):
        return await fx.dead_letters(jobs)

    @on(http.get("/admin/dead/newest").gate(a))
    @flow("admin.newest", effects={"reads": ["signal:tasks.email"]})
    async def newest(_in, fx):
        letters = await fx.dead_letters(jobs)
        return {"newest": letters[0], "all": tuple(letters), "count": len(letters)}  # records at any depth

    @on(http.get("/admin/bad").gate(a))
    @flow("admin.bad")
    async def bad(_in, fx):
        return {"when": object()}

    async with oke("shop", database_url=db_url) as app:
        first = await app.emit(jobs, {"n": 1}, key="usr_1")
        second = await app.emit(jobs, {"n": 2})
        await app.drain()  # before serving: the server's own workers would hold them instead
        async with serving(app) as base, httpx.AsyncClient() as c:
            await inspect_dead_letters(base, c, first, second)


async def inspect_dead_letters(base: str, c: httpx.AsyncClient, first: str, second: str) -> None:
    """What the inspection routes answer for the two dead letters `first` and `second`."""
    response = await c.get(f"{base}/admin/dead", headers={"X-Role": "admin"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["error"] is None
    assert [d["id"] for d in body["data"]] == [second, first]  # newest first
    letter = body["data"][1]
    assert sorted(letter) == ["attempts", "created_at", "failures", "id", "key", "parent_run_id",
                              "payload", "signal", "status"]
    assert (letter["signal"], letter["key"], letter["payload"], letter["attempts"], letter["status"],
            letter["parent_run_id"]) == ("tasks.email", "usr_1", {"n": 1}, 2, "dead", None)
    assert isinstance(letter["created_at"], int)
    assert [(f["code"], f["message"], f["attempt"]) for f in letter["failures"]] == [
        ("E_DECLINED", "no 1", 1), ("E_DECLINED", "no 1", 2)]
    # a list never carries tracebacks (they may hold a handler's secrets; `show` reads them)
    assert all(sorted(f) == ["at", "attempt", "code", "message", "traceback"] and isinstance(f["at"], int)
               and f["traceback"] is None for f in letter["failures"])

    response = await c.get(f"{base}/admin/dead/newest", headers={"X-Role": "admin"})
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert data["count"] == 2 and data["newest"] == body["data"][0] and data["all"] == body["data"]

    response = await c.get(f"{base}/admin/bad", headers={"X-Role": "admin"})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "InternalError" and "JSON cannot carry" in error["message"]


async def test_gates_cannot_be_bypassed_by_path_tricks(db_url):
    status = declare()
    _m, a = gates()
    on(http.get("/admin/stats").gate(a), flow("admin.stats", do=lambda v, fx: {"secret": "TOP-SECRET"}))
    on(http.get("/pub/:page").public(), flow("pages", do=lambda v, fx: {"page": v["page"]}))
    async with oke("shop", database_url=db_url) as app, serving(app) as base:
        await app.emit(status, {"orderId": "a", "status": "paid", "secret": "TOP-SECRET"})
        port = port_of(base)
        # sanity: the front doors
        assert (await raw_request(port, "GET", "/admin/stats")).status == 403
        assert b"TOP-SECRET" in (await raw_request(port, "GET", "/admin/stats", {"X-Role": "admin"})).body
        assert (await raw_request(port, "GET", "/_oke/live/order-status")).status == 401
        assert (await raw_request(port, "GET", "/_oke/live/order-status", AUTH)).status == 200
        tricks = [
            "/%61dmin/stats", "/admin%2Fstats", "/admin/%73tats", "//admin/stats", "/admin//stats",
            "/admin/stats/", "/admin/stats/.", "/admin/./stats", "/pub/../admin/stats",
            "/pub/%2e%2e/admin/stats", "/admin/stats%00", "/admin/stats?x=/../",
            "/_oke/live/order%2Dstatus", "/_oke/live//order-status", "/_oke//live/order-status",
            "/_oke/live/order-status/", "/_oke/live/x/../order-status", "/_oke/live/x/%2e%2e/order-status",
            "/%5Foke/live/order-status", "/_oke/%6Cive/order-status", "/_oke/live/./order-status",
            "/pub/x/../../_oke/live/order-status", "/orders/a/events/", "/orders/a//events",
            "/orders//events", "/orders/a/events/../events", "/orders/%61/events", "/orders/a%2Fevents",
            "/_oke/live/order-status?lastEventId=../", "/pub/..", "/pub/.",
        ]
        for target in tricks:
            response = await raw_request(port, "GET", target)
            assert b"TOP-SECRET" not in response.body, target
            assert not response.headers.get("content-type", "").startswith("text/event-stream"), target
            assert response.status in (400, 401, 403, 404), (target, response.status)
        # an encoded slash stays inside its segment: the public route gets a literal value, not a path
        response = await raw_request(port, "GET", "/pub/..%2Fadmin%2Fstats")
        assert (response.status, response.json()) == (200, {"data": {"page": "../admin/stats"}, "error": None})
        # the public route still works, and its param is decoded
        response = await raw_request(port, "GET", "/pub/a%20b")
        assert (response.status, response.json()) == (200, {"data": {"page": "a b"}, "error": None})


# ------------------------------------------------------------------------------------ SSE

async def test_sse_framing_and_headers(db_url):
    status = declare()
    async with oke("shop", database_url=db_url) as app, serving(app) as base, httpx.AsyncClient() as c:
        first = await app.emit(status, {"orderId": "o1", "status": "paid", "note": "multi\nline ü"})
        second = await app.emit(status, [1, 2])
        async with c.stream("GET", f"{base}/_oke/live/order-status", headers=AUTH) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["cache-control"] == "no-cache"
            assert response.headers["x-accel-buffering"] == "no"
            raw = b""
            async with asyncio.timeout(10):
                async for chunk in response.aiter_raw():
                    raw += chunk
                    if raw.count(b"\n\n") >= 2:
                        break
        expected = (f"id: {first}\ndata: " + json.dumps({"orderId": "o1", "status": "paid", "note": "multi\nline ü"},
                                                       ensure_ascii=False, separators=(",", ":"))
                    + f"\n\nid: {second}\ndata: [1,2]\n\n").encode()
        assert raw == expected


async def test_heartbeat_is_a_comment_on_a_plain_stream(db_url):
    status = declare()
    app = oke("shop", database_url=db_url, sse_heartbeat_s=0.2)
    async with app, serving(app) as base, httpx.AsyncClient() as c:
        await app.emit(status, {"orderId": "a"})
        async with sse(c, f"{base}/_oke/live/order-status", AUTH) as s:
            t0 = time.monotonic()
            assert (await s.frame()).is_event
            beats = [await s.frame(2) for _ in range(3)]
            assert all(b.comment and b.id is None and b.data is None for b in beats)
            assert [b.raw for b in beats] == [b":\n\n"] * 3
            assert time.monotonic() - t0 >= 0.5


async def test_heartbeat_on_a_filtered_stream_carries_the_head_id(db_url):
    status = declare()
    app = oke("shop", database_url=db_url, sse_heartbeat_s=0.3)
    async with app, serving(app) as base, httpx.AsyncClient() as c:
        first = await app.emit(status, {"orderId": "a", "status": "paid"})
        epoch = first.split(".")[0]
        async with sse(c, f"{base}/orders/a/events", AUTH) as s:
            assert (await s.frame()).id == first
            # nothing for "a" while "b" keeps the tape busy: heartbeats still come, at least every 0.3 s,
            # each carrying the head id it has passed
            heads: list[str] = []
            beats = []

            async def busy():
                for _ in range(25):
                    heads.append(await app.emit(status, {"orderId": "b"}))
                    await asyncio.sleep(0.04)

            emitter = asyncio.create_task(busy())
            t0 = time.monotonic()
            while time.monotonic() - t0 < 1.2:
                beats.append((await s.frame(1.0), time.monotonic()))
            await emitter
            assert len(beats) >= 3, beats
            for frame, _at in beats:
                assert frame.data is None and not frame.comment, frame.raw
                assert frame.raw == f"id: {frame.id}\n\n".encode()
                assert frame.id.startswith(epoch + ".")
            seqs = [int(f.id.split(".")[1]) for f, _ in beats]
            assert seqs == sorted(seqs) and seqs[-1] > 1
            # once the tape is quiet, the next heartbeat names the head exactly
            final = await s.frame(2)
            while final.id != heads[-1]:
                final = await s.frame(2)
            assert final.raw == f"id: {heads[-1]}\n\n".encode()


async def test_stop_ends_open_streams_with_done_and_serve_returns(db_url):
    status = declare()
    app = oke("shop", database_url=db_url)
    async with app:
        port = free_port()
        task = asyncio.create_task(app.serve(port=port))
        await wait_listening(port)
        await app.emit(status, {"orderId": "a"})
        async with httpx.AsyncClient() as c:
            async with sse(c, f"http://127.0.0.1:{port}/_oke/live/order-status", AUTH) as s1, \
                    sse(c, f"http://127.0.0.1:{port}/orders/a/events", AUTH) as s2:
                await s1.events(1)
                await s2.events(1)
                t0 = time.monotonic()
                await app.stop()
                for s in (s1, s2):
                    rest = await s.rest(5)
                    assert [f.raw for f in rest] == [b"data: [DONE]\n\n"]
                    assert s.ended
                await asyncio.wait_for(task, 5)
                assert time.monotonic() - t0 < 3  # no waiting out the graceful-shutdown timeout
        assert task.result() is None


async def test_serve_again_after_stop_on_the_same_port_resumes(db_url):
    status = declare()
    app = oke("shop", database_url=db_url)
    port = free_port()
    url = f"http://127.0.0.1:{port}/_oke/live/order-status"
    async with app, httpx.AsyncClient() as c:
        async with serving(app, port=port):
            ids = [await app.emit(status, {"n": i}) for i in range(2)]
            async with sse(c, url, AUTH) as s:
                assert [f.id for f in await s.events(2)] == ids
        down = [await app.emit(status, {"n": i}) for i in range(2, 5)]  # while no server runs
        async with serving(app, port=port):
            async with sse(c, url, {**AUTH, "Last-Event-ID": ids[-1]}) as s:
                assert s.response.status_code == 200
                assert [f.id for f in await s.events(3)] == down
                assert await s.silent_for(0.3)
                later = await app.emit(status, {"n": 5})
                assert [f.id for f in await s.events(1)] == [later]


async def test_resume_by_header_or_query_and_every_410_reason(db_url):
    status = declare(retention={"max_count": 4})
    app = oke("shop", database_url=db_url)
    async with app, serving(app) as base, httpx.AsyncClient() as c:
        ids = [await app.emit(status, {"orderId": "o", "n": i}) for i in range(7)]
        epoch = ids[0].split(".")[0]
        url = f"{base}/_oke/live/order-status"
        # retained 4..7, pruned through 3
        async with sse(c, url, {**AUTH, "Last-Event-ID": ids[2]}) as s:
            assert [f.id for f in await s.events(4)] == ids[3:]
        async with sse(c, f"{url}?lastEventId={ids[4]}", AUTH) as s:
            assert [f.id for f in await s.events(2)] == ids[5:]
        async with sse(c, f"{url}?lastEventId={ids[0]}", {**AUTH, "Last-Event-ID": ids[5]}) as s:
            assert s.response.status_code == 200  # the header wins over a pruned query cursor
            assert [f.id for f in await s.events(1)] == ids[6:]
        async with sse(c, url, {**AUTH, "Last-Event-ID": ids[6]}) as s:  # at the head: nothing, then live
            assert await s.silent_for(0.3)
            nxt = await app.emit(status, {"n": 7})
            assert [f.id for f in await s.events(1)] == [nxt]

        async def gap(cursor: str, via_query: bool = False) -> dict:
            if via_query:
                response = await c.get(url, params={"lastEventId": cursor}, headers=AUTH)
            else:
                response = await c.get(url, headers={**AUTH, "Last-Event-ID": cursor})
            assert response.status_code == 410, (cursor, response.status_code)
            assert response.headers["content-type"] == "application/json"
            body = response.json()
            assert body["data"] is None
            error = body["error"]
            assert (error["code"], error["oke"]) == ("LiveResumeGap", 1210)
            assert error["message"] == f'Cursor "{cursor}" missing on "order-status".'
            assert error["data"]["signal"] == "order-status" and error["data"]["afterId"] == cursor
            return error["data"]

        # head is 8 now, retained 5..8, pruned through 4
        for bad in ("garbage", "", f"{epoch}.", f"{epoch}.-1", f"{epoch}.01", f"{epoch}.1.2", f".{epoch}"):
            if bad == "":
                continue  # an empty cursor is no cursor
            data = await gap(bad)
            assert (data["reason"], data["firstId"], data["missed"]) == ("malformed", f"{epoch}.5", None), bad
        data = await gap("zzzz.3")
        assert (data["reason"], data["firstId"], data["missed"]) == ("reset", f"{epoch}.5", None)
        data = await gap(f"{epoch}.9")
        assert (data["reason"], data["firstId"], data["missed"]) == ("unknown", f"{epoch}.5", None)
        data = await gap(f"{epoch}.1", via_query=True)
        assert (data["reason"], data["firstId"], data["missed"]) == ("pruned", f"{epoch}.5", 3)
        data = await gap(f"{epoch}.3")
        assert (data["reason"], data["missed"]) == ("pruned", 1)
        async with sse(c, url, {**AUTH, "Last-Event-ID": f"{epoch}.4"}) as s:  # exactly at the pruned edge
            assert s.response.status_code == 200
            assert seqs_of(await s.events(4)) == [5, 6, 7, 8]

        # a wipe gives the tape a new epoch: every old cursor, even a valid-looking one, is "reset"
        new_epoch = await app.store.write(lambda conn: live.wipe(conn, "order-status"))
        assert new_epoch != epoch
        data = await gap(f"{epoch}.8")
        assert (data["reason"], data["firstId"], data["missed"]) == ("reset", None, None)
        fresh = await app.emit(status, {"n": "after wipe"})
        assert fresh == f"{new_epoch}.9"  # seq is never reused, even across a wipe
        data = await gap(f"{epoch}.9")
        assert (data["reason"], data["firstId"]) == ("reset", fresh)
        async with sse(c, url, AUTH) as s:
            assert [f.id for f in await s.events(1)] == [fresh]


async def test_retention_by_count(db_url):
    status = declare(retention={"max_count": 3})
    app = oke("shop", database_url=db_url)
    async with app, serving(app) as base, httpx.AsyncClient() as c:
        ids = [await app.emit(status, {"n": i}) for i in range(5)]
        url = f"{base}/_oke/live/order-status"
        async with sse(c, url, AUTH) as s:
            assert [f.id for f in await s.events(3)] == ids[2:]
            assert await s.silent_for(0.2)
        response = await c.get(url, headers={**AUTH, "Last-Event-ID": ids[0]})
        assert response.status_code == 410
        data = response.json()["error"]["data"]
        assert (data["reason"], data["firstId"], data["missed"]) == ("pruned", ids[2], 1)
        assert await tape_rows(db_url, "order-status") == [3, 4, 5]


async def test_retention_by_age(db_url):
    status = declare(retention={"max_age": "1s"})
    app = oke("shop", database_url=db_url)
    async with app, serving(app) as base, httpx.AsyncClient() as c:
        ids = [await app.emit(status, {"n": i}) for i in range(3)]
        epoch = ids[0].split(".")[0]
        url = f"{base}/_oke/live/order-status"
        async with sse(c, url, AUTH) as s:
            assert [f.id for f in await s.events(3)] == ids
        await asyncio.sleep(1.2)
        # nothing was appended since: a connection alone applies the age rule
        response = await c.get(url, headers={**AUTH, "Last-Event-ID": ids[0]})
        assert response.status_code == 410
        data = response.json()["error"]["data"]
        assert (data["reason"], data["firstId"], data["missed"]) == ("pruned", None, 2)
        async with sse(c, url, {**AUTH, "Last-Event-ID": ids[2]}) as resumed, sse(c, url, AUTH) as fresh:
            assert resumed.response.status_code == 200 and fresh.response.status_code == 200
            assert await fresh.silent_for(0.3)  # the expired events are not replayed
            new = await app.emit(status, {"n": 3})
            assert new == f"{epoch}.4"
            assert [f.id for f in await fresh.events(1)] == [new]
            assert [f.id for f in await resumed.events(1)] == [new]
        assert await tape_rows(db_url, "order-status") == [4]


async def test_concurrent_emits_reach_every_stream_once_in_order(db_url):
    status = declare()
    app = oke("shop", database_url=db_url)
    emitters, per = 3, 300
    total = emitters * per
    async with app, serving(app) as base, httpx.AsyncClient(timeout=30) as c:
        url = f"{base}/_oke/live/order-status"
        seen: dict[int, list] = {}

        async def reader(n: int, delay: float) -> None:
            await asyncio.sleep(delay)
            async with sse(c, url, AUTH) as s:
                assert s.response.status_code == 200
                seen[n] = [(f.id, f.value) for f in await s.events(total, timeout=60)]
                assert await s.silent_for(0.2)  # nothing after the last: no duplicates at the tail

        async def emitter(e: int) -> list[str]:
            out = []
            for i in range(per):
                out.append(await app.emit(status, {"e": e, "i": i}))
            return out

        readers = [asyncio.create_task(reader(n, 0.0)) for n in range(5)]
        readers.append(asyncio.create_task(reader(5, 0.5)))  # one joins mid-way: replay, then live
        await asyncio.sleep(0.2)
        emitted = await asyncio.gather(*(emitter(e) for e in range(emitters)))
        await asyncio.gather(*readers)
    all_ids = sorted((i for ids in emitted for i in ids), key=lambda i: int(i.split(".")[1]))
    assert [int(i.split(".")[1]) for i in all_ids] == list(range(1, total + 1))
    for n, events in seen.items():
        assert [eid for eid, _ in events] == all_ids, f"stream {n}"
        for e in range(emitters):  # each emitter's events in its own order
            assert [v["i"] for _, v in events if v["e"] == e] == list(range(per)), f"stream {n}"


# ------------------------------------------------------------------------------------ leaks

def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        import os
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _pg_connections(db_url: str) -> int | None:
    if not db_url.startswith("postgresql"):
        return None
    dsn = db_url.replace("postgresql+asyncpg://", "postgresql://", 1)
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                   "AND pid <> pg_backend_pid()")
    finally:
        await conn.close()


async def _settled(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value[0] or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.05)


async def test_a_thousand_connect_disconnect_cycles_leave_nothing_behind(db_url):
    status = declare()
    app = oke("shop", database_url=db_url)
    async with app, serving(app) as base:
        await app.emit(status, {"orderId": "a", "status": "paid"})
        await app.emit(status, {"orderId": "b", "status": "paid"})
        server = app.asgi
        paths = ["/_oke/live/order-status", "/orders/a/events", "/orders/b/events"]
        port = port_of(base)

        async def one(i: int) -> None:
            # raw sockets: a cheap client, and hang-ups at three moments of a stream's life
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(f"GET {paths[(i // 3) % 3]} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                             f"Authorization: Bearer s3cret\r\n\r\n".encode())
                await writer.drain()
                mode = i % 3
                if mode == 0:
                    return  # gone before the response starts
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 200 "), head
                if mode == 2:  # read one frame (chunked: a size line, then the frame)
                    frame = await asyncio.wait_for(reader.readuntil(b"\n\n"), 10)
                    assert b"id: " in frame and b"data: " in frame, frame
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

        async def cycles(count: int, width: int = 10) -> None:
            for start in range(0, count, width):
                await asyncio.gather(*(one(i) for i in range(start, start + width)))

        async def quiet():
            hubs = server._hubs
            subscribers = sum(len(h.subscribers) for h in hubs.hubs.values()) if hubs else 0
            ok = subscribers == 0 and not server.control.subscriptions
            return ok, subscribers

        await cycles(60)  # warm up: pools, the LISTEN connection, lazy imports
        assert (await _settled(quiet))[0]
        await asyncio.sleep(0.2)
        gc.collect()
        tasks_before = len(asyncio.all_tasks())
        pg_before = await _pg_connections(db_url)
        rss_before = _rss_bytes()

        t0 = time.monotonic()
        await cycles(1000)
        elapsed = time.monotonic() - t0

        ok, subscribers = await _settled(quiet)
        assert ok, f"{subscribers} hub subscribers / {len(server.control.subscriptions)} streams left"
        hubs = server._hubs
        assert hubs is None or all(not h.subscribers for h in hubs.hubs.values())
        assert all(h.task is None for h in hubs.hubs.values()) if hubs else True
        _ok, tasks_after = await _settled(lambda: _tasks_at_most(tasks_before))
        assert tasks_after <= tasks_before, (tasks_before, tasks_after)
        if pg_before is not None:
            # streams never hold a connection of their own: after the churn the store is back within
            # what its pools keep idle (they may have grown toward it), whatever the client count was
            ceiling = max(pg_before, app.store.idle_connection_ceiling())

            async def pg_back():
                now = await _pg_connections(db_url)
                return now <= ceiling, now
            _ok, pg_after = await _settled(pg_back)
            assert pg_after <= ceiling, (pg_before, pg_after, ceiling)
        gc.collect()
        growth = _rss_bytes() - rss_before
        assert growth < 20 * 1024 * 1024, f"RSS grew {growth / 2**20:.1f} MB over 1000 cycles"
        # still serving after all that
        async with httpx.AsyncClient() as c, sse(c, f"{base}{paths[0]}", AUTH) as s:
            assert [f.value for f in await s.events(1)] == [{"orderId": "a", "status": "paid"}]
        print(f"\n1000 cycles in {elapsed:.2f}s; RSS {growth / 2**20:+.1f} MB; tasks {tasks_before}->{tasks_after}; "
              f"pg connections {pg_before}")


async def _tasks_at_most(limit: int):
    n = len(asyncio.all_tasks())
    return n <= limit, n


async def test_a_wipe_under_an_open_stream_ends_it_and_its_cursor_is_reset(db_url):
    status = declare()
    app = oke("shop", database_url=db_url)
    async with app, serving(app) as base, httpx.AsyncClient() as c:
        url = f"{base}/_oke/live/order-status"
        old = await app.emit(status, {"n": 1})
        async with sse(c, url, AUTH) as before:
            assert [f.id for f in await before.events(1)] == [old]
            new_epoch = await app.store.write(lambda conn: live.wipe(conn, "order-status"))
            # a stream opened right after the wipe shares the hub, but is on the new epoch
            async with sse(c, url, AUTH) as after:
                # the old stream learns of the reset without waiting for an event (the hub's 1 s poll
                # at worst) and ends; it never shows a new-epoch event under an old-epoch id
                rest = await before.rest(5)
                assert [f.raw for f in rest] == [b"data: [DONE]\n\n"]
                fresh = await app.emit(status, {"n": 2})
                assert fresh == f"{new_epoch}.2"
                assert [f.id for f in await after.events(1)] == [fresh]  # the new-epoch stream lives on
        response = await c.get(url, headers={**AUTH, "Last-Event-ID": old})
        assert response.status_code == 410
        assert response.json()["error"]["data"]["reason"] == "reset"
        async with sse(c, url, AUTH) as again:
            assert [f.id for f in await again.events(1)] == [fresh]
            later = await app.emit(status, {"n": 3})
            assert [f.id for f in await again.events(1)] == [later]
            assert later.startswith(new_epoch + ".")


async def test_a_stream_too_slow_for_the_hub_catches_up_from_the_store(db_url, monkeypatch):
    from engine.live import hub as hub_module

    monkeypatch.setattr(hub_module, "QUEUE_BATCHES", 4)  # a small queue, so a stalled reader is dropped
    status = declare()
    app = oke("shop", database_url=db_url)
    blob = "x" * 60_000
    async with app, serving(app) as base:
        port = port_of(base)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /_oke/live/order-status HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Authorization: Bearer s3cret\r\n\r\n")
            await writer.drain()
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            # the client reads nothing while ~9 MB go out: the socket fills, the stream blocks on send,
            # its queue overflows and the hub drops it
            ids = []
            for i in range(150):
                ids.append(await app.emit(status, {"n": i, "blob": blob}))
                if i % 10 == 0:
                    await asyncio.sleep(0.01)  # let the hub read between emits: many small batches
            subs = [s for h in app.asgi._hubs.hubs.values() for s in h.subscribers]
            dropped = [s for s in subs if s.dropped]
            assert dropped, "the stalled stream should have been dropped by the hub"
            # now read everything: exactly every event once, in order, then silence
            body = b""
            seen: list[str] = []
            async with asyncio.timeout(30):
                while len(seen) < len(ids):
                    body += await reader.read(1 << 20)
                    seen = [line[4:].decode() for line in body.split(b"\n") if line.startswith(b"id: ")]
            assert seen == ids
            assert not [s for h in app.asgi._hubs.hubs.values() for s in h.subscribers if s.dropped]
            later = await app.emit(status, {"n": "later"})
            async with asyncio.timeout(10):
                while later.encode() not in body:
                    body += await reader.read(1 << 20)
            assert [line[4:].decode() for line in body.split(b"\n") if line.startswith(b"id: ")] == ids + [later]
        finally:
            writer.close()


# ------------------------------------------------------------------------- coalesced writes

async def test_a_stream_writes_each_replay_page_and_every_waiting_batch_as_one_chunk(db_url):
    """The body generator itself (real store, real hub): a replay page is one chunk, and hub batches
    that queued up while the stream was busy go out together, in order, each event once."""
    from engine.live.hub import HubRegistry
    from engine.live.stream import StreamControl, live_stream

    ticks = signal.live("ticks", optional=True)
    async with oke("shop", database_url=db_url) as app:
        store = app.store
        for start in range(0, 2500, 500):
            await store.write(lambda c, s=start: live.append(c, ticks, [json.dumps({"n": n})
                                                                       for n in range(s, s + 500)], None))
        epoch = (await store.read(lambda c: live.state(c, "ticks"))).epoch
        hubs, control = HubRegistry(store), StreamControl()
        body = live_stream(store, hubs, control, "ticks", epoch, 0, None, heartbeat_s=60)

        def ids(chunk: bytes) -> list[int]:
            return [int(line.split(b".")[1]) for line in chunk.split(b"\n") if line.startswith(b"id: ")]

        chunks = [await anext(body) for _ in range(3)]
        assert [len(ids(c)) for c in chunks] == [1000, 1000, 500]
        assert [i for c in chunks for i in ids(c)] == list(range(1, 2501))
        assert chunks[0].startswith(f'id: {epoch}.1\ndata: {{"n": 0}}\n\n'.encode())
        sub = next(iter(control.subscriptions))
        for k in range(3):  # three appends the hub reads one by one while the stream sends nothing
            await app.emit(ticks, {"live": k})
            async with asyncio.timeout(10):
                while sub.queue.qsize() < k + 1:
                    await asyncio.sleep(0.01)
        chunk = await anext(body)
        assert ids(chunk) == [2501, 2502, 2503]
        assert [json.loads(line[6:]) for line in chunk.split(b"\n") if line.startswith(b"data: ")] == [
            {"live": 0}, {"live": 1}, {"live": 2}]
        control.close_all()
        assert await anext(body) == b"data: [DONE]\n\n"
        with pytest.raises(StopAsyncIteration):
            await anext(body)
        hubs.close()


async def test_a_filtered_stream_coalesces_too_and_keeps_only_its_events(db_url):
    status = declare()
    app = oke("shop", database_url=db_url)
    async with app, serving(app) as base, httpx.AsyncClient(timeout=30) as c:
        early = [await app.emit(status, {"orderId": "a" if n % 3 else "b", "n": n}) for n in range(30)]
        async with sse(c, f"{base}/orders/a/events", AUTH) as s:
            replayed = await s.events(20, timeout=20)
            later = await asyncio.gather(*(app.emit(status, {"orderId": "a" if n % 3 else "b", "n": n})
                                           for n in range(30, 330)))
            followed = await s.events(200, timeout=30)
            assert await s.silent_for(0.2)
    wanted = [i for n, i in enumerate(early + later) if n % 3]
    assert [f.id for f in replayed + followed] == wanted
    assert [f.value["n"] for f in replayed + followed] == [n for n in range(330) if n % 3]


# ------------------------------------------------------------------------------------ limits

@pytest.mark.parametrize("bad", [0, -1, 2.5, "100", None, True])
def test_max_connections_below_1_or_not_an_int_is_a_value_error_at_oke(tmp_path, bad):
    with pytest.raises(ValueError, match=r"^oke\(max_connections=\.\.\.\): an int ≥ 1 .*got " + re.escape(repr(bad))):
        oke("shop", database_url=f"sqlite+aiosqlite:///{tmp_path}/oke.db", max_connections=bad)



@pytest.mark.parametrize("bad", [0, -1, 1.5, "1MB", None, True])
def test_max_payload_bytes_below_1_or_not_an_int_is_a_value_error_at_oke(tmp_path, bad):
    """A bad limit was taken as given: every emit and every HTTP request then failed with a 500."""
    with pytest.raises(ValueError, match=r"^oke\(max_payload_bytes=\.\.\.\): an int of bytes ≥ 1, got " + re.escape(repr(bad))):
        oke("shop", database_url=f"sqlite+aiosqlite:///{tmp_path}/oke.db", max_payload_bytes=bad)
