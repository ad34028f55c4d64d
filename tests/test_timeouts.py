"""Flow option `timeout`: a handler still running then is cancelled and the attempt fails
with code `Timeout`, retried or dead by the signal's retries like any failure. Both stores."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

import pytest

from engine import flow, oke, on, signal
from engine.ops import dead_letters
from workers.db import fetch


@pytest.mark.parametrize("bad", [0, -1, 0.0, -0.5, timedelta(0), timedelta(seconds=-3), "0s", "-5s", "5", "1h30m",
                                 float("nan"), float("inf")])
def test_a_timeout_that_is_not_a_positive_duration_is_a_value_error_at_declaration(bad):
    with pytest.raises(ValueError, match=r"flow\('w.x', timeout=\.\.\.\)"):
        flow("w.x", do=lambda p, fx: None, timeout=bad)


@pytest.mark.parametrize("bad", [True, [5], {"s": 5}, object()])
def test_a_timeout_of_another_type_is_a_type_error_at_declaration(bad):
    with pytest.raises(TypeError, match="a duration is"):
        flow("w.x", do=lambda p, fx: None, timeout=bad)


@pytest.mark.parametrize(("given", "seconds"), [("250ms", 0.25), ("5s", 5.0), (timedelta(minutes=2), 120.0),
                                                 (3, 3.0), (0.5, 0.5)])
def test_a_timeout_is_a_duration_string_a_timedelta_or_seconds(given, seconds):
    assert flow("w.x", do=lambda p, fx: None, timeout=given).timeout_s == seconds
    assert flow("w.x", do=lambda p, fx: None).timeout_s is None


async def test_a_handler_past_its_timeout_is_cancelled_and_retried_then_dead(db_url):
    slow = signal.once("slow", retries=1)
    events: list[tuple[str, int]] = []

    @on(slow)
    @flow("w.slow", timeout="200ms")
    async def handle(payload, fx):
        events.append(("start", fx.attempt))
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            events.append(("cancelled", fx.attempt))
            raise
        events.append(("finished", fx.attempt))

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(slow, {"n": 1})
        started = time.monotonic()
        await app.drain()
        took = time.monotonic() - started
        [dead] = await dead_letters(app.store, "slow")
    assert events == [("start", 1), ("cancelled", 1), ("start", 2), ("cancelled", 2)]
    assert took < 3, "each attempt ended at its timeout, not when the handler would have"
    assert dead.id == msg_id and dead.attempts == 2
    assert [(f.code, f.attempt) for f in dead.failures] == [("Timeout", 1), ("Timeout", 2)]
    assert dead.failures[0].message == 'flow "w.slow" ran longer than its timeout of 0.2s and was cancelled'
    runs = await fetch(db_url, "SELECT status, error FROM oke_runs ORDER BY attempt")
    assert [r[0] for r in runs] == ["failed", "failed"] and runs[0][1].startswith("Timeout: ")


async def test_a_handler_within_its_timeout_succeeds_and_a_later_attempt_may_finish(db_url):
    flaky = signal.once("flaky", retries=2)
    attempts: list[int] = []

    @on(flaky)
    @flow("w.flaky", timeout=timedelta(milliseconds=300))
    async def handle(payload, fx):
        attempts.append(fx.attempt)
        await asyncio.sleep(2 if fx.attempt == 1 else 0.01)

    async with oke("t", database_url=db_url) as app:
        await app.emit(flaky, None)
        await app.drain()
    assert attempts == [1, 2]
    assert await fetch(db_url, "SELECT status, attempts FROM oke_messages") == [("delivered", 2)]
    assert await fetch(db_url, "SELECT code FROM oke_failures") == [("Timeout",)]


async def test_a_handler_that_swallows_the_cancel_still_fails_with_timeout(db_url):
    stubborn = signal.once("stubborn", retries=0)

    @on(stubborn)
    @flow("w.stubborn", timeout=0.1)
    async def handle(payload, fx):
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return  # pretends nothing happened

    async with oke("t", database_url=db_url) as app:
        await app.emit(stubborn, None)
        await app.drain()
    assert await fetch(db_url, "SELECT status FROM oke_messages") == [("dead",)]
    assert await fetch(db_url, "SELECT code FROM oke_failures") == [("Timeout",)]


async def test_the_handlers_own_timeout_error_is_an_ordinary_failure(db_url):
    own = signal.once("own", retries=0)

    @on(own)
    @flow("w.own", timeout="5s")
    async def handle(payload, fx):
        raise TimeoutError("the SMTP server did not answer")

    async with oke("t", database_url=db_url) as app:
        await app.emit(own, None)
        await app.drain()
    assert await fetch(db_url, "SELECT code, message FROM oke_failures") == [
        ("TimeoutError", "the SMTP server did not answer")]


async def test_a_sync_handler_past_its_timeout_fails_while_its_thread_runs_on(db_url):
    blocking = signal.once("blocking", retries=0)
    release = threading.Event()

    @on(blocking)
    @flow("w.blocking", timeout="150ms")
    def handle(payload, fx):
        release.wait(10)  # a thread cannot be interrupted

    async with oke("t", database_url=db_url) as app:
        await app.emit(blocking, None)
        started = time.monotonic()
        await app.drain()
        took = time.monotonic() - started
        release.set()
    assert took < 5
    assert await fetch(db_url, "SELECT status FROM oke_messages") == [("dead",)]
    assert await fetch(db_url, "SELECT code FROM oke_failures") == [("Timeout",)]


async def test_each_handler_of_a_batch_has_its_own_timeout(db_url):
    mixed = signal.once("mixed", retries=0)
    finished: list[int] = []

    @on(mixed)
    @flow("w.mixed", timeout="300ms")
    async def handle(payload, fx):
        if payload % 2 == 0:
            await asyncio.sleep(0.05)  # well within the timeout, beside the slow ones
        else:
            await asyncio.sleep(3)
        finished.append(payload)

    async with oke("t", database_url=db_url) as app:
        ids = await app.emit_many(mixed, range(8))
        await app.drain(concurrency=8)
    status = dict(await fetch(db_url, "SELECT id, status FROM oke_messages"))
    assert [status[i] for i in ids] == ["delivered", "dead"] * 4
    assert sorted(finished) == [0, 2, 4, 6]
    assert await fetch(db_url, "SELECT DISTINCT code FROM oke_failures") == [("Timeout",)]
