"""The claimer (engine/worker/claiming.py, claim_ahead.py): how much a claim asks for, and claim
lanes running a whole pool over a store double: every message handled and settled once, outages
backed off with a growing delay. No database."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from workerkit import StoreDouble, claimed, route, runtime

from engine.worker import WorkerPool, claiming
from engine.worker.claim_ahead import AHEAD_MAX, CLAIM_MAX, CLAIM_STEP, claim_ahead, claim_size
from engine.worker.waiting import FIRST_BACKOFF_S


def test_before_anything_is_measured_a_claim_asks_for_the_free_slots() -> None:
    assert claim_ahead(8, 0.0, 0.001, 1, 64) == 0 and claim_ahead(8, 0.002, 0.0, 1, 64) == 0
    assert claim_size(0, 8, 0, 64) == 8
    assert claim_size(3, 8, 0, 64) == 5
    assert claim_size(8, 8, 0, 64) == 0  # every slot held: no claim until one frees


def test_handlers_faster_than_a_claim_claim_ahead_what_they_finish_while_it_is_on_the_wire() -> None:
    assert claim_ahead(4, claim_s=0.002, handler_s=0.001, concurrent_claims=1, claim_rows_max=64) == 8
    assert claim_ahead(4, claim_s=0.001, handler_s=0.002, concurrent_claims=1, claim_rows_max=64) == 2
    # slower than `concurrency` claims: nothing ahead, so no message waits behind a slow handler
    assert claim_ahead(4, claim_s=0.001, handler_s=0.005, concurrent_claims=1, claim_rows_max=64) == 0


def test_what_a_worker_holds_ahead_is_capped_by_concurrency_and_the_rows_of_its_claims() -> None:
    assert claim_ahead(4, claim_s=1.0, handler_s=0.001, concurrent_claims=2, claim_rows_max=128) == AHEAD_MAX * 4
    assert claim_ahead(32, claim_s=1.0, handler_s=0.001, concurrent_claims=1, claim_rows_max=64) == 64


def test_a_large_claim_is_capped_and_rounded_down_to_a_step() -> None:
    assert claim_size(0, 4, 100, 64) == CLAIM_MAX * 4  # 32: the cap, a multiple of the step
    assert claim_size(0, 16, 1_000, 64) == 64  # the store's rows a claim
    assert claim_size(0, 4, 9, 64) == 8  # 13 asked: 8, so few claim statements get prepared
    assert all(
        claim_size(held, 8, 40, 128) % CLAIM_STEP == 0 for held in range(0, 30) if claim_size(held, 8, 40, 128) > 8
    )
    assert claim_size(0, 1, 0, 64) == 1 and claim_size(2, 8, 0, 64) == 6  # at or below the step: as asked


def _pool(store: StoreDouble, concurrency: int, handled: list[str]) -> WorkerPool:
    async def handle(payload: Any, fx: Any) -> None:
        handled.append(payload)

    return WorkerPool(runtime(store), route("unit.q", handle), concurrency)


async def test_a_drain_handles_and_settles_every_message_once() -> None:
    store = StoreDouble([claimed(n) for n in range(1, 41)])
    handled: list[str] = []
    async with asyncio.timeout(10):
        await _pool(store, 4, handled).run(until_idle=True)
    assert sorted(handled) == sorted(str(n) for n in range(1, 41))
    assert sorted(o.claimed.seq for o in store.settled) == list(range(1, 41))
    assert all(limit <= 4 * CLAIM_MAX for name, limit in store.calls if name == "claim")


async def test_claims_lost_to_an_outage_are_retried_after_a_doubling_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The back-off's waits are recorded, not slept: each next claim waits twice as long, and the
    first claim that gets through starts the delay over."""
    waits: list[float | None] = []

    async def no_wait(*events: asyncio.Event, timeout: float | None = None) -> None:
        waits.append(timeout)
        await asyncio.sleep(0)

    monkeypatch.setattr(claiming, "wait_any", no_wait)
    store = StoreDouble([claimed(n) for n in range(1, 4)])
    store.outage("claim", 3)
    handled: list[str] = []
    async with asyncio.timeout(10):
        await _pool(store, 2, handled).run(until_idle=True)
    assert waits[:3] == [FIRST_BACKOFF_S, 2 * FIRST_BACKOFF_S, 4 * FIRST_BACKOFF_S]
    assert sorted(handled) == ["1", "2", "3"] and len(store.settled) == 3
