"""OpenTelemetry: each run a span `oke.run <flow>`, a chain of emits one trace, a retry a
new span linked to the attempt before; checked with the SDK's in-memory exporter on SQLite and
PostgreSQL. Without a provider nothing is traced, and `import engine` never loads opentelemetry."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import text

from engine import flow, oke, on, signal

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider():
    """One SDK provider for the process (OpenTelemetry allows the global one to be set once)."""
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        sdk = TracerProvider()
        sdk.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(sdk)
    yield


@pytest.fixture(autouse=True)
def spans():
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def chain():
    """order.placed → workers.orders emits invoice.send → workers.invoices fails once, then succeeds."""
    placed = signal.once("order.placed")
    invoice = signal.once("invoice.send", retries=2)
    tries: list[int] = []

    async def take_order(payload, fx):
        await fx.emit(invoice, {"order": payload["order"]})

    async def send_invoice(_payload, fx):
        tries.append(fx.attempt)
        if fx.attempt == 1:
            raise ConnectionError("mail server away")

    on(placed, flow("workers.orders", do=take_order))
    on(invoice, flow("workers.invoices", do=send_invoice))
    return placed, tries


def runs(exported) -> dict[str, list]:
    by_name: dict[str, list] = {}
    for span in exported:
        by_name.setdefault(span.name, []).append(span)
    for found in by_name.values():
        found.sort(key=lambda s: s.attributes.get("oke.attempt", 0) if s.attributes else 0)
    return by_name


async def test_emit_run_emit_run_with_a_retry_is_one_trace(db_url, spans):
    placed, tries = chain()
    async with oke("shop", database_url=db_url) as app:
        with trace.get_tracer("checkout").start_as_current_span("POST /orders") as request:
            msg_id = await app.emit(placed, {"order": "ord_1"})
        await app.drain()
        recorded = set(await app.store.read(lambda c: c.execute(text("SELECT run_id FROM oke_runs")).scalars().all()))
    assert tries == [1, 2]
    by_name = runs(spans.get_finished_spans())
    (root,) = by_name["POST /orders"]
    (order_run,) = by_name["oke.run workers.orders"]
    first, second = by_name["oke.run workers.invoices"]
    trace_id = request.get_span_context().trace_id
    assert {s.context.trace_id for s in (root, order_run, first, second)} == {trace_id}
    assert order_run.parent.span_id == root.context.span_id
    assert first.parent.span_id == order_run.context.span_id
    assert second.parent.span_id == order_run.context.span_id  # a retry is still the emitting run's child
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    assert order_run.links == () or list(order_run.links) == []
    assert dict(order_run.attributes) == {
        "oke.signal": "order.placed", "oke.message_id": msg_id, "oke.attempt": 1,
        "oke.run_id": order_run.attributes["oke.run_id"],
    }
    assert order_run.attributes["oke.run_id"].startswith("run_")
    assert first.attributes["oke.attempt"] == 1 and second.attributes["oke.attempt"] == 2
    assert first.status.status_code == trace.StatusCode.ERROR
    assert "mail server away" in first.status.description
    assert [e.name for e in first.events] == ["exception"]
    assert second.status.status_code != trace.StatusCode.ERROR
    assert order_run.kind == trace.SpanKind.CONSUMER
    # the run ids in the spans are the ones the store records (okconsole trace joins both)
    assert {s.attributes["oke.run_id"] for s in (order_run, first, second)} == recorded


async def test_an_emit_outside_any_span_starts_a_trace_of_its_own(db_url, spans):
    placed, tries = chain()
    async with oke("shop", database_url=db_url) as app:
        await app.emit(placed, {"order": "ord_1"})
        await app.emit(placed, {"order": "ord_2"})
        await app.drain()
    by_name = runs(spans.get_finished_spans())
    orders = by_name["oke.run workers.orders"]
    assert len(orders) == 2 and all(s.parent is None for s in orders)
    assert len({s.context.trace_id for s in orders}) == 2  # two emits, two traces
    invoices = by_name["oke.run workers.invoices"]
    assert len(invoices) == 4
    for run in invoices:  # each invoice run sits in the trace of the order run that emitted it
        parent = next(o for o in orders if o.context.span_id == run.parent.span_id)
        assert run.context.trace_id == parent.context.trace_id
    retried = [s for s in invoices if s.attributes["oke.attempt"] == 2]
    failed = {s.context.span_id for s in invoices if s.attributes["oke.attempt"] == 1}
    assert len(retried) == 2 and {s.links[0].context.span_id for s in retried} == failed


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception fails")


async def test_an_exception_that_cannot_describe_itself_still_ends_its_span(db_url, spans):
    jobs = signal.once("jobs", retries=1)

    async def handle(_payload, fx):
        if fx.attempt == 1:
            raise Unprintable()

    on(jobs, flow("workers.jobs", do=handle))
    async with oke("shop", database_url=db_url) as app:
        msg = await app.emit(jobs, {})
        await app.drain()
        status = await app.store.read(
            lambda c: c.execute(text(f"SELECT status FROM oke_messages WHERE id = '{msg}'")).scalar()
        )
    assert status == "delivered"
    first, second = runs(spans.get_finished_spans())["oke.run workers.jobs"]
    assert first.status.status_code == trace.StatusCode.ERROR and "Unprintable" in first.status.description
    assert second.links[0].context.span_id == first.context.span_id


def test_import_engine_and_running_an_app_never_import_opentelemetry(tmp_path):
    code = textwrap.dedent(f"""
        import asyncio, sys
        import engine
        from engine import flow, oke, on, signal
        jobs = signal.once("jobs", retries=1)
        seen = []
        def handle(payload, fx):
            seen.append(fx.attempt)
            if fx.attempt == 1:
                raise RuntimeError("once")
        on(jobs, flow("workers.jobs", do=handle))
        async def main():
            async with oke("t", database_url="sqlite+aiosqlite:///{tmp_path}/t.db") as app:
                await app.emit(jobs, {{}})
                await app.drain()
        asyncio.run(main())
        assert seen == [1, 2], seen
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
        print(loaded)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_with_the_api_but_no_provider_nothing_is_traced_or_stored(tmp_path):
    code = textwrap.dedent(f"""
        import asyncio, sqlite3
        import opentelemetry.trace  # the extra is installed, but no provider is configured
        from engine import flow, oke, on, signal
        jobs = signal.once("jobs")
        on(jobs, flow("workers.jobs", do=lambda p, fx: None))
        async def main():
            async with oke("t", database_url="sqlite+aiosqlite:///{tmp_path}/t.db") as app:
                with opentelemetry.trace.get_tracer("x").start_as_current_span("outer"):
                    await app.emit(jobs, {{}})
                await app.drain()
        asyncio.run(main())
        print(sqlite3.connect("{tmp_path}/t.db").execute("SELECT traceparent, status FROM oke_messages").fetchall())
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[(None, 'delivered')]"
