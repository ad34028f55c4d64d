"""fx.extend_lease: a long handler keeps its message past the original lease; once another
worker has reclaimed it, extending raises engine.LeaseLost. Two workers (apps with their own store
connections and worker ids) share one store. Both stores."""

from __future__ import annotations

import asyncio

import pytest

from engine import LeaseLost, flow, oke, on, signal
from engine.fx import Fx
from engine.ids import now_ms
from prockit import until
from workers.db import fetch, scalar

LEASE_MS = 400


async def _lease_left_ms(url: str, msg_id: str) -> int:
    expires = await scalar(url, "SELECT lease_expires_at FROM oke_messages WHERE id = $1", msg_id)
    return int(expires) - now_ms()


async def _run_both(first, second, started: asyncio.Event, done):
    """Worker `first` runs until its handler started, then `second` joins; both until `done()`.
    `first` has one slot, which its handler holds: only `second` can reclaim the message."""
    runs = [asyncio.create_task(first.run(concurrency=1))]
    try:
        await asyncio.wait_for(started.wait(), 20)
        runs.append(asyncio.create_task(second.run(concurrency=2)))
        await until(done, "the message to be settled", timeout=30)
    finally:
        await first.stop()
        await second.stop()
        await asyncio.gather(*runs)


async def test_a_long_handler_that_extends_keeps_its_message_from_a_second_worker(db_url):
    long_job = signal.once("long", retries=3)
    attempts: list[tuple[int, str]] = []
    left_after_extend: list[int] = []
    started = asyncio.Event()

    @on(long_job)
    @flow("w.long")
    async def handle(payload, fx):
        attempts.append((fx.attempt, fx.message_id))
        started.set()
        for _ in range(6):  # 1.2 s in all, three times the lease
            await asyncio.sleep(LEASE_MS / 2000)
            await fx.extend_lease()
        await fx.extend_lease(ms=1_500)
        left_after_extend.append(await _lease_left_ms(db_url, fx.message_id))

    first = oke("a", database_url=db_url, lease_ms=LEASE_MS, worker_id="first")
    second = oke("b", database_url=db_url, lease_ms=LEASE_MS, worker_id="second")
    async with first, second:
        msg_id = await first.emit(long_job, None)

        async def delivered() -> bool:
            return await scalar(db_url, "SELECT status FROM oke_messages") == "delivered"

        await _run_both(first, second, started, delivered)
    assert attempts == [(1, msg_id)], "the second worker reclaimed a message whose lease was extended"
    assert 1_200 <= left_after_extend[0] <= 1_500  # now + ms, by the store's lease clock
    assert await fetch(db_url, "SELECT attempts, locked_by FROM oke_messages") == [(1, None)]
    assert await fetch(db_url, "SELECT status, worker_id FROM oke_runs") == [("succeeded", "first")]


async def test_extending_a_lease_another_worker_has_taken_over_raises_lease_lost(db_url):
    job = signal.once("job", retries=3)
    reclaimed = asyncio.Event()
    started = asyncio.Event()
    lost: list[str] = []

    @on(job)
    @flow("w.job")
    async def handle(payload, fx):
        if fx.attempt == 1:
            started.set()
            await asyncio.wait_for(reclaimed.wait(), 20)  # outlive the lease until it is taken over
            try:
                await fx.extend_lease()
            except LeaseLost as err:
                lost.append(str(err))
                raise
        else:
            reclaimed.set()

    first = oke("a", database_url=db_url, lease_ms=LEASE_MS, worker_id="first")
    second = oke("b", database_url=db_url, lease_ms=LEASE_MS, worker_id="second")
    async with first, second:
        msg_id = await first.emit(job, None)

        async def both_settled() -> bool:
            return await scalar(db_url, "SELECT count(*) FROM oke_runs") == 2

        await _run_both(first, second, started, both_settled)
    assert len(lost) == 1 and msg_id in lost[0] and "was reclaimed" in lost[0]
    assert await fetch(db_url, "SELECT status, attempts FROM oke_messages") == [("delivered", 2)]
    runs = await fetch(db_url, "SELECT attempt, status, worker_id FROM oke_runs ORDER BY attempt")
    assert runs == [(1, "lease_lost", "first"), (2, "succeeded", "second")]


async def test_bad_lease_lengths_are_refused_and_nothing_changes(db_url):
    job = signal.once("job", retries=0)
    refused: list[tuple[object, str]] = []

    @on(job)
    @flow("w.job")
    async def handle(payload, fx):
        for bad in (0, -5, True, 1.5, "1000", 2**60):
            try:
                await fx.extend_lease(ms=bad)
            except (TypeError, ValueError) as err:
                refused.append((bad, type(err).__name__))

    async with oke("t", database_url=db_url) as app:
        await app.emit(job, None)
        await app.drain()
    assert refused == [(0, "ValueError"), (-5, "ValueError"), (True, "TypeError"), (1.5, "TypeError"),
                       ("1000", "TypeError"), (2**60, "ValueError")]
    assert await fetch(db_url, "SELECT status FROM oke_messages") == [("delivered",)]


async def test_extend_lease_outside_a_held_message_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="held by a worker"):
        await Fx(None, flow("w.http", do=lambda p, fx: None)).extend_lease()
