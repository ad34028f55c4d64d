"""GET /_oke/metrics: real uvicorn on 127.0.0.1, scraped with httpx and parsed with
prometheus_client's own text parser; its figures are compared with `okconsole stats --json` run as
the real CLI, on SQLite and PostgreSQL."""
from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from consolekit import run_okconsole
from engine import Forbidden, Unauthorized, flow, gate, http, oke, on, signal
from livekit import serving

TOKEN = {"Authorization": "Bearer m3trics"}


def bearer(request):
    value = request.headers.get("authorization")
    if value is None:
        raise Unauthorized("missing token")
    if value != TOKEN["Authorization"]:
        raise Forbidden("not a metrics token")
    return "prometheus"


def declare() -> dict:
    """Three once signals (one always succeeds, one always fails, one nobody here consumes) and
    a live tape with a public firehose; the metrics route behind a token."""
    ok = signal.once("jobs.ok")
    flaky = signal.once("jobs.flaky", retries=1)
    later = signal.once("jobs.later", optional=True)
    feed = signal.live("feed")

    async def fine(_payload, _fx):
        await asyncio.sleep(0.01)

    async def broken(_payload, _fx):
        raise RuntimeError("always")

    on(ok, flow("workers.ok", do=fine))
    on(flaky, flow("workers.flaky", do=broken))
    on(http.live(feed).public())
    on(http.metrics().gate(gate("scraper", bearer)))
    return {"ok": ok, "flaky": flaky, "later": later, "feed": feed}


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def scrape(base: str, headers: dict | None = TOKEN) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as c:
        return await c.get(f"{base}/_oke/metrics", headers=headers or {})


async def settled(app, names: list[str]) -> None:
    """Until the signals' messages are all delivered or dead."""
    from engine import ops

    for _ in range(500):
        rows = {r.signal: r for r in await ops.stats(app.store)}
        if all(rows[n].pending == rows[n].inflight == 0 for n in names):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("messages did not settle")


def stats_json(db_url: str) -> dict[str, dict]:
    done = run_okconsole("--db", db_url, "stats", "--json")
    assert done.returncode == 0, done.stderr
    return {row["signal"]: row for row in json.loads(done.stdout)}


async def test_scrape_matches_stats_and_counts_this_processes_handlers(db_url):
    s = declare()
    app = oke("metrics", database_url=db_url)
    async with app, serving(app) as base:
        for i in range(5):
            await app.emit(s["ok"], {"n": i})
        for i in range(2):
            await app.emit(s["flaky"], {"n": i})
        for i in range(3):
            await app.emit(s["later"], {"n": i})
            await app.emit(s["feed"], {"n": i})
        await settled(app, ["jobs.ok", "jobs.flaky"])
        await asyncio.sleep(1.1)  # the unconsumed messages are over a second old
        response = await scrape(base)
        stats = await asyncio.to_thread(stats_json, db_url)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = parse(response.text)
    assert sample(samples, "oke_store_up") == 1
    for name in ("jobs.ok", "jobs.flaky", "jobs.later"):
        for status in ("pending", "inflight", "delivered", "dead"):
            assert sample(samples, "oke_messages", signal=name, status=status) == stats[name][status], (name, status)
    assert stats["jobs.ok"]["delivered"] == 5 and stats["jobs.flaky"]["dead"] == 2 and stats["jobs.later"]["pending"] == 3
    # lag: the scrape came first, so stats (read after it) sees the same oldest message a bit older
    lag = sample(samples, "oke_lag_seconds", signal="jobs.later")
    assert 1.0 <= lag <= stats["jobs.later"]["lag_ms"] / 1000 <= lag + 30
    assert sample(samples, "oke_lag_seconds", signal="jobs.ok") == 0
    # this process's handlers: every attempt counted once, by what it did to the message
    handled = {o: sample(samples, "oke_handled_total", signal="jobs.flaky", flow="workers.flaky", outcome=o)
               for o in ("delivered", "failed", "dead")}
    assert handled == {"delivered": 0, "failed": 2, "dead": 2}
    assert sample(samples, "oke_handled_total", signal="jobs.ok", flow="workers.ok", outcome="delivered") == 5
    ok_runs = dict(signal="jobs.ok", flow="workers.ok")
    assert sample(samples, "oke_handler_duration_seconds_count", **ok_runs) == 5
    assert sample(samples, "oke_handler_duration_seconds_bucket", **ok_runs, le="0.005") == 0  # each sleeps 10 ms
    assert sample(samples, "oke_handler_duration_seconds_bucket", **ok_runs, le="+Inf") == 5
    assert 0.05 <= sample(samples, "oke_handler_duration_seconds_sum", **ok_runs) < 5
    assert sample(samples, "oke_live_events_total", signal="feed") == 3
    assert "jobs.later" not in {dict(labels).get("signal") for (name, labels) in samples if name.startswith("oke_handled")}


async def test_live_subscribers_are_the_streams_open_now(db_url):
    s = declare()
    app = oke("metrics", database_url=db_url)
    async with app, serving(app) as base:
        await app.emit(s["feed"], {"n": 1})
        before = parse((await scrape(base)).text)
        async with httpx.AsyncClient(timeout=10) as c:
            async with c.stream("GET", f"{base}/_oke/live/feed") as stream:
                assert stream.status_code == 200
                async for line in stream.aiter_lines():
                    if line.startswith("data:"):
                        break  # the replayed event: the stream is subscribed
                during = parse((await scrape(base)).text)
        for _ in range(100):
            after = parse((await scrape(base)).text)
            if sample(after, "oke_live_subscribers", signal="feed") == 0:
                break
            await asyncio.sleep(0.05)
    assert sample(before, "oke_live_subscribers", signal="feed") == 0
    assert sample(during, "oke_live_subscribers", signal="feed") == 1
    assert sample(after, "oke_live_subscribers", signal="feed") == 0


async def test_the_metrics_route_is_gated_like_every_route(db_url):
    declare()
    app = oke("metrics", database_url=db_url)
    async with app, serving(app) as base:
        missing = await scrape(base, headers=None)
        wrong = await scrape(base, headers={"Authorization": "Bearer guess"})
        async with httpx.AsyncClient(timeout=10) as c:
            posted = await c.post(f"{base}/_oke/metrics", headers=TOKEN)
    assert missing.status_code == 401
    assert missing.json() == {"data": None, "error": {"code": "Unauthorized", "message": "missing token"}}
    assert wrong.status_code == 403
    assert wrong.json()["error"]["code"] == "Forbidden"
    assert "oke_" not in missing.text + wrong.text
    assert posted.status_code == 405


async def test_without_the_route_there_is_no_metrics_path_and_no_counting(db_url):
    ok = signal.once("jobs.ok")
    on(ok, flow("workers.ok", do=lambda _p, _fx: None))
    on(http.live(signal.live("feed")).public())
    app = oke("metrics", database_url=db_url)
    async with app, serving(app) as base:
        await app.emit(ok, {})
        await settled(app, ["jobs.ok"])
        response = await scrape(base)
        assert app.hooks.handled.flows() == []
    assert response.status_code == 404


def test_the_route_needs_a_gate_or_public_and_takes_no_flow():
    with pytest.raises(TypeError, match="takes no flow"):
        on(http.metrics().public(), flow("x", do=lambda _i, _fx: None))
    on(http.metrics())
    app = oke("metrics", database_url="sqlite+aiosqlite:///" + os.devnull + ".never")
    with pytest.raises(ValueError, match=r"GET /_oke/metrics: every HTTP route needs \.gate\(\.\.\.\) or \.public\(\)"):
        asyncio.run(app.start())


async def test_two_processes_agree_on_the_store_and_their_counters_add_up(db_url):
    """Two apps sharing the store (as two processes would) split the work: each serves the same
    store gauges and its own handler counters, which sum to every run (the docs' max / sum)."""
    s = declare()
    first, second = oke("metrics", database_url=db_url), oke("metrics", database_url=db_url)
    async with first, second, serving(first) as base_a, serving(second) as base_b:
        for i in range(20):
            await first.emit(s["ok"], {"n": i})
        await settled(first, ["jobs.ok"])
        a, b = parse((await scrape(base_a)).text), parse((await scrape(base_b)).text)
    for status in ("pending", "inflight", "delivered", "dead"):
        assert sample(a, "oke_messages", signal="jobs.ok", status=status) == \
            sample(b, "oke_messages", signal="jobs.ok", status=status)
    assert sample(a, "oke_messages", signal="jobs.ok", status="delivered") == 20

    def handled(samples: dict) -> float:
        return samples.get(("oke_handled_total", (("flow", "workers.ok"), ("outcome", "delivered"),
                                                  ("signal", "jobs.ok"))), 0)

    assert handled(a) + handled(b) == 20
