"""The browser module `/_oke/client.js` in a real headless Chromium, against a real server.

The page (served by the app, so same-origin) imports the module and keeps what each subscription
receives (events, errors, opens) in `window.subs`; the test starts subscriptions and reads them over
the DevTools protocol. The rows are the Python client's (tests/test_client_rules.py): the exposure
chosen by params and gates, resume across a restart, a drop and a 410 with `autoResubscribe` false
and true, the back-off, `onOpen`, abort through an AbortSignal, the per-flow form, a frame that is
not JSON, and the bad-input rejections. Without Chromium these skip locally and fail when CI=true.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import clientkit
import engine
from clientkit import SEEN, TOKEN, declare
from engine import oke
from consolekit import wait_port
from livekit import free_port, serving
from test_browser import Chromium, chromium  # noqa: F401  (the fixture: skips or fails without Chromium)
from test_examples import EXAMPLES, _env

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>client.js</title></head><body>
<script type="module">
  import { live, flow, backoffMs } from "/_oke/client.js";
  window.subs = {};
  window.backoffMs = backoffMs;
  window.start = async (key, signal, params, opts) => {
    const rec = { events: [], errors: [], opens: 0, rejected: null, stops: 0 };
    window.subs[key] = rec;
    const options = { ...opts, onEvent: (e) => rec.events.push(e), onOpen: () => { rec.opens += 1; },
      onError: (e) => rec.errors.push({ name: e.name, message: e.message, ended: e.ended, lastId: e.lastId,
                                         status: e.status, data: e.data }) };
    if (opts.token) options.headers = { Authorization: "Bearer " + opts.token };
    if (opts.abortable) { rec.controller = new AbortController(); options.signal = rec.controller.signal; }
    try {
      rec.stop = opts.flow ? await flow("", opts.flow).live(params, options) : await live("", signal, params, options);
      return "started";
    } catch (e) {
      rec.rejected = { name: e.name, message: e.message };
      return "rejected";
    }
  };
  window.seen = (key) => JSON.stringify(window.subs[key], (k, v) => (k === "controller" || k === "stop") ? undefined : v);
  window.ready = true;
</script>
</body></html>
"""


@pytest.fixture(autouse=True)
def _fresh():
    clientkit.reset()
    yield
    clientkit.reset()


class Page:
    def __init__(self, browser: Chromium) -> None:
        self.browser = browser

    async def run(self, expression: str):
        """Evaluate, awaiting a promise (the Chromium helper's evaluate does not)."""
        browser = self.browser
        browser._next += 1
        ident = browser._next
        await browser.ws.send(json.dumps({"id": ident, "method": "Runtime.evaluate", "params": {
            "expression": expression, "returnByValue": True, "awaitPromise": True}}))
        while True:
            message = json.loads(await asyncio.wait_for(browser.ws.recv(), 20))
            if message.get("id") == ident:
                result = message["result"]
                assert "exceptionDetails" not in result, result
                return result["result"].get("value")

    async def start(self, key: str, signal: str | None, params: dict | None = None, **opts) -> str:
        return await self.run(f"window.start({json.dumps(key)}, {json.dumps(signal)}, {json.dumps(params or {})}, "
                              f"{json.dumps(opts)})")

    async def sub(self, key: str) -> dict:
        return json.loads(await self.run(f"window.seen({json.dumps(key)})"))

    async def wait(self, key: str, check, timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            got = await self.sub(key)
            if check(got):
                return got
            assert time.monotonic() < deadline, f"{key}: not in time: {got}"
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def page_of(binary: str, base: str):
    browser = Chromium(binary, f"{base}/page")
    try:
        await browser.connect()
        page = Page(browser)
        deadline = time.monotonic() + 20
        while not await browser.evaluate("window.ready === true"):
            assert time.monotonic() < deadline, "the page's module did not load"
            await asyncio.sleep(0.05)
        yield page
    finally:
        await browser.close()


def ids(sub: dict) -> list[str]:
    return [e["id"] for e in sub["events"]]


async def test_gated_and_filtered_exposures_and_the_bad_input_rejections(sqlite_url, chromium):
    status = declare(page=PAGE)
    async with oke("shop", database_url=sqlite_url) as app, serving(app) as base, page_of(chromium, base) as page:
        a1 = await app.emit(status, {"orderId": "a", "status": "paid"})
        b1 = await app.emit(status, {"orderId": "b", "status": "paid"})
        assert await page.start("one", "order-status", {"orderId": "a"}, token=TOKEN) == "started"
        assert await page.start("all", "order-status", {}, token=TOKEN) == "started"
        a2 = await app.emit(status, {"orderId": "a", "status": "shipped"})
        one = await page.wait("one", lambda s: len(s["events"]) == 2)
        assert ids(one) == [a1, a2] and one["events"][1]["data"] == {"orderId": "a", "status": "shipped"}
        assert ids(await page.wait("all", lambda s: len(s["events"]) == 3)) == [a1, b1, a2]
        assert sorted(s.path for s in SEEN) == ["/_oke/live/order-status", "/orders/a/events"]
        # without the token the gated exposures are not listed: the rejection names only the public one
        assert await page.start("anon", "order-status", {}) == "rejected"
        anon = (await page.sub("anon"))["rejected"]
        assert anon["name"] == "NoExposure" and '"order-status" has no exposure whose path params fit []' in anon[
            "message"]
        assert "order-status at /orders/vip/events (flow orders.vip)" in anon["message"]
        assert "/orders/:orderId" not in anon["message"] and "/_oke/live" not in anon["message"]
        # an unknown signal: named, with the exposures there are
        assert await page.start("nope", "nope", {}, token=TOKEN) == "rejected"
        nope = (await page.sub("nope"))["rejected"]["message"]
        assert nope.startswith('unknown live signal "nope": no exposure of it here (exposures listed to this caller: ')
        assert "order-status at /orders/:orderId/events" in nope
        assert await page.start("gone", None, {}, flow="orders.nope", token=TOKEN) == "rejected"
        assert 'flow "orders.nope": no live exposure' in (await page.sub("gone"))["rejected"]["message"]
        assert await page.start("bad", "", {}) == "rejected"
        assert (await page.sub("bad"))["rejected"]["name"] == "TypeError"
        # stop() twice is harmless, and nothing arrives after it
        assert await page.run("window.subs.one.stop(); window.subs.one.stop(); 'ok'") == "ok"
        await app.emit(status, {"orderId": "a", "status": "late"})
        await page.wait("all", lambda s: len(s["events"]) == 4)
        await asyncio.sleep(0.3)
        one = await page.sub("one")
        assert len(one["events"]) == 2 and one["errors"] == []


async def test_auto_resubscribe_resumes_across_a_server_restart_with_no_duplicates(db_url, chromium):
    status = declare(page=PAGE)
    port = free_port()
    async with oke("shop", database_url=db_url) as app:
        before = [await app.emit(status, {"orderId": "a", "n": i}) for i in range(2)]
        async with contextlib.AsyncExitStack() as stack:  # the page outlives the first server
            async with serving(app, port=port) as base:
                page = await stack.enter_async_context(page_of(chromium, base))
                await page.start("on", "order-status", {"orderId": "a"}, token=TOKEN, autoResubscribe=True)
                await page.start("off", "order-status", {"orderId": "a"}, token=TOKEN)
                await page.wait("on", lambda s: len(s["events"]) == 2)
                await page.wait("off", lambda s: len(s["events"]) == 2)
            # the server stopped: its streams ended with [DONE]
            missed = [await app.emit(status, {"orderId": "a", "n": i}) for i in (2, 3)]
            off = await page.wait("off", lambda s: s["errors"])
            assert [(e["name"], e["ended"], e["lastId"]) for e in off["errors"]] == [("StreamDropped", True,
                                                                                      before[-1])]
            async with serving(app, port=port):
                on = await page.wait("on", lambda s: len(s["events"]) == 4, timeout=30)
                after = await app.emit(status, {"orderId": "a", "n": 4})
                on = await page.wait("on", lambda s: len(s["events"]) == 5)
                await asyncio.sleep(1.0)
                on, off = await page.sub("on"), await page.sub("off")
            assert ids(on) == before + missed + [after] and on["errors"] == [] and on["opens"] == 2
            assert ids(off) == before and off["opens"] == 1 and len(off["errors"]) == 1
    # one open each, then only the resubscribing one came back, with the last id it had received
    assert [s.last_event_id for s in SEEN] == [None, None, before[-1]]


async def test_a_410_ends_without_auto_resubscribe_and_replays_the_tape_with_it(sqlite_url, chromium):
    status = declare(retention={"max_count": 3}, page=PAGE)
    async with oke("shop", database_url=sqlite_url) as app, serving(app) as base, page_of(chromium, base) as page:
        sent = [await app.emit(status, {"n": i}) for i in range(6)]
        await page.start("off", "order-status", {}, token=TOKEN, lastEventId=sent[0])
        off = await page.wait("off", lambda s: s["errors"])
        [gap] = off["errors"]
        assert (gap["name"], gap["status"], gap["ended"], gap["data"]["reason"]) == ("LiveResumeGap", 410, True,
                                                                                     "pruned")
        t0 = time.monotonic()
        await page.start("on", "order-status", {}, token=TOKEN, lastEventId=sent[0], autoResubscribe=True)
        on = await page.wait("on", lambda s: len(s["events"]) == 3)
        assert ids(on) == sent[3:] and on["errors"] == [] and time.monotonic() - t0 < 5
        await asyncio.sleep(0.3)
        assert (await page.sub("off"))["events"] == []
    assert [s.last_event_id for s in SEEN] == [sent[0], sent[0], None]
    assert SEEN[2].at - SEEN[1].at >= 0.5  # the replay waited the first back-off


async def test_the_back_off_is_500ms_doubling_to_30s_and_onOpen_follows_each_open(sqlite_url, chromium):
    status = declare(page=PAGE)
    async with oke("shop", database_url=sqlite_url) as app, serving(app) as base, page_of(chromium, base) as page:
        waits = await page.run("Array.from({length: 9}, (_, i) => window.backoffMs(i))")
        for wait, bound in zip(waits, (500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000), strict=True):
            assert bound <= wait <= min(bound * 1.25, 30000), waits
        first = await app.emit(status, {"n": 1})
        clientkit.BUSY["left"] = 3
        await page.start("on", "order-status", {}, token=TOKEN, autoResubscribe=True)
        on = await page.wait("on", lambda s: s["events"])
        assert ids(on) == [first] and on["opens"] == 1 and on["errors"] == []
        gaps = [b.at - a.at for a, b in zip(SEEN, SEEN[1:])]
        assert len(gaps) == 3
        for gap, base_s in zip(gaps, (0.5, 1.0, 2.0)):
            assert base_s - 0.05 <= gap < base_s * 1.25 + 0.6, gaps
        clientkit.BUSY["left"] = 1  # without autoResubscribe a 503 is a drop: onError, and the end
        await page.start("off", "order-status", {}, token=TOKEN)
        off = await page.wait("off", lambda s: s["errors"])
        assert [(e["name"], e["status"], e["ended"]) for e in off["errors"]] == [("StreamDropped", 503, True)]
        assert off["opens"] == 0 and len(SEEN) == 5


async def test_an_abort_signal_stops_the_subscription(sqlite_url, chromium):
    status = declare(page=PAGE)
    async with oke("shop", database_url=sqlite_url) as app, serving(app) as base, page_of(chromium, base) as page:
        first = await app.emit(status, {"n": 1})
        await page.start("s", "order-status", {}, token=TOKEN, abortable=True)
        await page.wait("s", lambda s: s["events"])
        assert app.asgi.control.subscriptions
        await page.run("window.subs.s.controller.abort(); window.subs.s.stop(); 'ok'")
        await app.emit(status, {"n": 2})
        deadline = time.monotonic() + 10
        while app.asgi.control.subscriptions:  # the server saw the stream go
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        s = await page.sub("s")
        assert ids(s) == [first] and s["errors"] == []


async def test_the_per_flow_form_and_a_frame_that_is_not_json(sqlite_url, chromium):
    status = declare(page=PAGE)
    async with oke("shop", database_url=sqlite_url) as app, serving(app) as base, page_of(chromium, base) as page:
        await app.emit(status, {"orderId": "a", "status": "paid"})
        shipped = await app.emit(status, {"orderId": "b", "status": "shipped"})
        assert await page.start("vip", None, {}, flow="orders.vip") == "started"  # public: no token
        vip = await page.wait("vip", lambda s: s["events"])
        assert vip["events"] == [{"id": shipped, "data": {"orderId": "b", "status": "shipped"}}]
        assert await page.start("odd", None, {}, flow="orders.odd", token=TOKEN) == "started"
        odd = await page.wait("odd", lambda s: len(s["events"]) == 2)
        await asyncio.sleep(0.6)  # heartbeats keep coming: the stream is healthy and stays open
        odd = await page.sub("odd")
        assert [e["data"] for e in odd["events"]] == [{"n": 1}, {"n": 3}]
        [bad] = odd["errors"]
        assert (bad["name"], bad["ended"], bad["lastId"]) == ("BadFrame", False, "x.2")
        assert 'a data frame that is not JSON (id "x.2"): "not json {"' in bad["message"]
        assert [s.path for s in SEEN] == ["/odd/events"] and odd["opens"] == 1


async def test_client_js_is_served_public_cached_and_holds_nothing_of_the_app(sqlite_url):
    declare()
    async with oke("shop", database_url=sqlite_url) as app, serving(app) as base:
        async with httpx.AsyncClient() as c:
            got = await c.get(f"{base}/_oke/client.js")
            assert got.status_code == 200
            assert got.headers["content-type"] == "text/javascript; charset=utf-8"
            assert got.headers["cache-control"] == "public, max-age=300"
            assert got.headers["x-content-type-options"] == "nosniff"
            etag = got.headers["etag"]
            body = got.text
            assert "export function live(" in body and "export function flow(" in body
            assert "import " not in body.replace('import { live, flow } from "/_oke/client.js"', "")
            # nothing of this app (its exposures, flows, gates): the package's file byte for byte, the
            # same for a caller with a token as without
            assert got.content == (Path(engine.__file__).parent / "http" / "client.js").read_bytes()
            member = await c.get(f"{base}/_oke/client.js", headers={"Authorization": f"Bearer {TOKEN}"})
            assert member.content == got.content and member.headers["etag"] == etag
            again = await c.get(f"{base}/_oke/client.js", headers={"If-None-Match": etag})
            assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
            head = await c.head(f"{base}/_oke/client.js")
            assert head.status_code == 200 and head.content == b""
            post = await c.post(f"{base}/_oke/client.js")
            assert post.status_code == 405 and post.headers["allow"] == "GET, HEAD"
    assert SEEN == []  # no gate was asked: the module is the same for everyone


def test_the_example_page_shows_an_order_status_live(db_url, chromium):
    """examples/order_status.html, served by examples/shop.py under `okconsole serve`: fill the form,
    place an order, and the page shows its status as the flow publishes it."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "okconsole", "serve", "shop:app", "--port", str(port)],
                              cwd=EXAMPLES, env=_env(db_url), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, stdin=subprocess.DEVNULL)

    async def drive() -> str:
        base = f"http://127.0.0.1:{port}"
        browser = Chromium(chromium, f"{base}/order")
        try:
            await browser.connect()
            deadline = time.monotonic() + 20
            while not await browser.evaluate("document.querySelector('#follow')?.dataset.ready === 'yes'"):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            await browser.evaluate("document.querySelector('#follow').orderId.value = 'o7';"
                                   "document.querySelector('#follow').requestSubmit(); 1")
            deadline = time.monotonic() + 20
            while await browser.evaluate("document.querySelector('#connection').textContent") != "(live)":
                assert time.monotonic() < deadline, await browser.evaluate("document.body.innerText")
                await asyncio.sleep(0.05)
            async with httpx.AsyncClient() as c:
                placed = await c.post(f"{base}/orders", json={"orderId": "o7", "customer": "ada", "total_cents": 5},
                                      headers={"Authorization": "Bearer shop-token"})
                assert placed.status_code == 200, placed.text
            while await browser.evaluate("document.querySelector('#status').textContent") != "shipped":
                assert time.monotonic() < deadline + 20, await browser.evaluate("document.body.innerText")
                await asyncio.sleep(0.05)
            return await browser.evaluate("document.querySelector('#log').textContent")
        finally:
            await browser.close()

    try:
        wait_port(port)
        log = asyncio.run(drive())
    finally:
        server.terminate()
        _out, err = server.communicate(timeout=30)
    lines = log.strip().splitlines()
    assert [json.loads(line.split("  ", 1)[1]) for line in lines] == [{"orderId": "o7", "status": "paid"},
                                                                      {"orderId": "o7", "status": "shipped"}]
    assert server.returncode in (0, -15), err
