"""Handlers of one claimed batch run in turn in one task while each finishes without suspending
(engine/worker/running.py `Runner._run_waiting`); the first that suspends keeps that task, the rest
go on in a new one. What a handler must not notice: the handlers after a suspended one still start at once (the
batch runs concurrently), a handler's own asyncio.timeout() reaches it and no other, its current
task stays the same across its awaits and is not another waiting handler's, and context
variables set by one handler are not seen by the next.
"""
from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from burstkit import emit_many
from engine import flow, oke, on, signal
from workers.db import fetch

TRACE: contextvars.ContextVar[str] = contextvars.ContextVar("trace", default="unset")


async def test_handlers_after_a_suspended_one_start_at_once(db_url):
    """Eight handlers, every other one waits on a shared gate that opens only once all four waiters
    are waiting: with one batch run strictly in turn this would never finish."""
    jobs = signal.once("turns.gate", retries=0)
    waiting = 0
    all_waiting = asyncio.Event()
    finished: list[int] = []

    @on(jobs)
    @flow("w.gate")
    async def handle(n: int, fx: Any) -> None:
        nonlocal waiting
        if n % 2:
            waiting += 1
            if waiting == 4:
                all_waiting.set()
            await all_waiting.wait()
        finished.append(n)

    async with oke("t", database_url=db_url) as app:
        await emit_many(app, jobs, list(range(8)))
        async with asyncio.timeout(20):
            await app.drain(concurrency=8)
    assert sorted(finished) == list(range(8))
    rows = await fetch(db_url, "SELECT status, attempts, count(*) FROM oke_messages GROUP BY 1, 2")
    assert rows == [("delivered", 1, 8)]


async def test_a_timeout_in_one_handler_fails_that_handler_only(db_url):
    """In one batch: quick handlers, one that outlives its own asyncio.timeout(), then one that waits
    longer than that timeout without one. Only the timed-out handler fails."""
    jobs = signal.once("turns.timeout", retries=0, dead_letter=True)

    @on(jobs)
    @flow("w.timeout")
    async def handle(kind: str, fx: Any) -> None:
        if kind == "times-out":
            async with asyncio.timeout(0.05):
                await asyncio.sleep(5)
        elif kind == "waits":
            await asyncio.sleep(0.3)

    async with oke("t", database_url=db_url) as app:
        await emit_many(app, jobs, ["quick", "times-out", "quick", "waits", "quick"])
        async with asyncio.timeout(20):
            await app.drain(concurrency=8)
    rows = await fetch(db_url, "SELECT payload, status FROM oke_messages ORDER BY seq")
    assert rows == [('"quick"', "delivered"), ('"times-out"', "dead"), ('"quick"', "delivered"),
                    ('"waits"', "delivered"), ('"quick"', "delivered")]
    assert await fetch(db_url, "SELECT attempt, code FROM oke_failures") == [(1, "TimeoutError")]


async def test_each_waiting_handler_has_a_current_task_of_its_own(db_url):
    """Quick handlers around two that both wait: each waiting one sees one current task before and
    after its await, and not the other's."""
    jobs = signal.once("turns.task", retries=0)
    seen: dict[str, tuple[int, int]] = {}
    both_waiting = asyncio.Event()
    waiters = 0

    @on(jobs)
    @flow("w.task")
    async def handle(name: str, fx: Any) -> None:
        nonlocal waiters
        if name == "quick":
            return
        before = asyncio.current_task()
        waiters += 1
        if waiters == 2:
            both_waiting.set()
        await both_waiting.wait()
        await asyncio.sleep(0.01)
        seen[name] = (id(before), id(asyncio.current_task()))

    async with oke("t", database_url=db_url) as app:
        await emit_many(app, jobs, ["quick", "first", "quick", "second", "quick"])
        async with asyncio.timeout(20):
            await app.drain(concurrency=8)
    assert seen["first"][0] == seen["first"][1]
    assert seen["second"][0] == seen["second"][1]
    assert seen["first"][0] != seen["second"][0]
    rows = await fetch(db_url, "SELECT status, count(*) FROM oke_messages GROUP BY status")
    assert rows == [("delivered", 5)]


async def test_a_context_variable_set_by_one_handler_is_not_seen_by_the_next(db_url):
    jobs = signal.once("turns.context", retries=0)
    seen: list[tuple[str, str, str]] = []

    @on(jobs)
    @flow("w.context")
    async def handle(name: str, fx: Any) -> None:
        found = TRACE.get()
        TRACE.set(name)
        if name.startswith("waits"):
            await asyncio.sleep(0.01)
        seen.append((name, found, TRACE.get()))

    async with oke("t", database_url=db_url) as app:
        await emit_many(app, jobs, ["a", "b", "waits-c", "d", "waits-e", "f"])
        await app.drain(concurrency=8)
    assert sorted(seen) == sorted((name, "unset", name) for name in ["a", "b", "waits-c", "d", "waits-e", "f"])
