"""Claiming ahead (engine/worker/claim_ahead.py): a worker with fast handlers holds more leases than
it has handler slots, so a freed slot finds its next message already claimed (PostgreSQL) or a claim
carries more messages for its transaction (SQLite). What must hold:
never more handlers at once than `concurrency`; slow handlers claim nothing ahead (another worker
gets the waiting messages); a claimed-ahead message has its lease renewed every half lease it waits
for a slot, so it is never reclaimed unstarted, and again before its handler starts when less than
90 % of the lease is left (engine/worker/leases.py); a renewal by a worker that lost the message
changes nothing.
"""
from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

from engine import flow, oke, on, signal
from engine.worker.claim_ahead import AHEAD_MAX, CLAIM_STEP
from workers.db import fetch, is_sqlite, scalar


async def lease_clock_ms(url: str) -> int:
    """Now by the clock the store judges leases by: PostgreSQL's own, this machine's on SQLite."""
    if is_sqlite(url):
        return int(time.time() * 1000)
    return int(await scalar(url, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"))


async def test_fast_handlers_never_run_more_than_concurrency_at_once(db_url):
    jobs = signal.once("ca.fast", retries=0)
    running = peak = 0

    @on(jobs)
    @flow("w.fast")
    async def handle(payload: Any, fx: Any) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        running -= 1

    async with oke("t", database_url=db_url) as app:
        for start in range(0, 2000, 500):
            await asyncio.gather(*(app.emit(jobs, n) for n in range(start, start + 500)))
        await app.drain(concurrency=4)
        rows = await fetch(db_url, "SELECT status, attempts, count(*) FROM oke_messages GROUP BY 1, 2")
    assert rows == [("delivered", 1, 2000)]
    assert 1 <= peak <= 4


async def test_slow_handlers_leave_waiting_messages_to_another_worker(db_url):
    """Worker A (2 slots, handlers of 0.6 s) must not hold the 3rd and 4th message while it works:
    worker B, started a little later, takes them and finishes while A's first two still run."""
    jobs = signal.once("ca.slow", retries=0)
    started: set[int] = set()

    @on(jobs)
    @flow("w.slow")
    async def handle(payload: int, fx: Any) -> None:
        started.add(payload)
        await asyncio.sleep(0.6)

    async with oke("a", database_url=db_url, worker_id="A") as a, \
            oke("b", database_url=db_url, worker_id="B") as b:
        for n in range(2):  # warm-up: A measures its handlers and its claims first
            await a.emit(jobs, 100 + n)
        await a.drain(concurrency=2)
        for n in range(4):
            await a.emit(jobs, n)
        run_a = asyncio.create_task(a.drain(concurrency=2))
        async with asyncio.timeout(10):
            while len(started & {0, 1, 2, 3}) < 2:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        await b.drain(concurrency=2)
        await run_a
        runs = await fetch(db_url, "SELECT r.worker_id, r.status, r.attempt FROM oke_runs AS r "
                                   "JOIN oke_messages AS m ON m.id = r.message_id "
                                   "WHERE m.payload IN ('0', '1', '2', '3') ORDER BY r.worker_id")
    assert runs == [("A", "succeeded", 1)] * 2 + [("B", "succeeded", 1)] * 2


async def test_a_claimed_ahead_message_that_waited_past_half_its_lease_starts_on_a_renewed_lease(db_url):
    """One slot, fast handlers (so the worker claims one ahead), then a handler that takes 85 % of
    the lease while the next message waits claimed: that message's lease is renewed while it waits
    (at half a lease), so its handler starts with more than half a lease left (not 15 %), and it
    runs once. The renewal may land up to a third of a lease (2 s) late and the test still holds.
    (It failed now and then while the renewer slept until the first waiting batch's renewal
    instead of the earliest: see the test below.)"""
    lease_ms = 6000
    jobs = signal.once("ca.lease", retries=3)
    calls: list[tuple[str, int]] = []
    lease_left_ms: list[int] = []

    @on(jobs)
    @flow("w.lease")
    async def handle(payload: str, fx: Any) -> None:
        calls.append((payload, fx.attempt))
        if payload == "slow":
            await asyncio.sleep(lease_ms / 1000 * 0.85)
        if payload == "victim":
            [(until,)] = await fetch(db_url, "SELECT lease_expires_at FROM oke_messages WHERE id = $1", fx.message_id)
            lease_left_ms.append(until - await lease_clock_ms(db_url))

    async with oke("t", database_url=db_url, lease_ms=lease_ms) as app:
        for n in range(30):
            await app.emit(jobs, f"fast-{n}")
        await app.emit(jobs, "slow")
        victim = await app.emit(jobs, "victim")
        await app.drain(concurrency=1)
        row = await fetch(db_url, "SELECT status, attempts FROM oke_messages WHERE id = $1", victim)
    assert row == [("delivered", 1)]
    assert [c for c in calls if c[0] == "victim"] == [("victim", 1)]
    assert len(lease_left_ms) == 1 and lease_left_ms[0] > lease_ms * 0.5, lease_left_ms


async def lease_left_at_start_ms(url: str, msg_id: str, began: float) -> float:
    """How much lease the message had when its handler began (`began`, by time.time()): the row's
    lease_expires_at against the store's lease clock, read now, counted back to `began` by this
    machine's clock (the reads' own time is not taken from the handler)."""
    until = await _lease_until(url, msg_id)
    now = await lease_clock_ms(url)
    return until - now + (time.time() - began) * 1000


async def test_every_handler_claimed_ahead_starts_with_nine_tenths_of_its_lease_left(db_url):
    """One slot, fast handlers first (so the worker claims ahead), then five handlers of a fifth of
    the lease each: the ones claimed ahead wait for the slot up to four fifths of a lease. Each of
    these with at least 90 % of its lease left (renewed before it starts), by the row's
    lease against the moment it began; before, one that waited two fifths of a lease started with
    60 % (the renewer renews at half a lease). Each message runs once."""
    lease_ms = 2000
    jobs = signal.once("ca.start", retries=3)
    left: dict[str, float] = {}

    @on(jobs)
    @flow("w.start")
    async def handle(payload: str, fx: Any) -> None:
        began = time.time()
        if payload.startswith("slow"):  # the fast ones stay fast: no reads
            left[payload] = await lease_left_at_start_ms(db_url, fx.message_id, began)
            await asyncio.sleep(lease_ms / 1000 / 5)

    async with oke("t", database_url=db_url, lease_ms=lease_ms) as app:
        for n in range(30):
            await app.emit(jobs, f"fast-{n}")
        for n in range(5):
            await app.emit(jobs, f"slow-{n}")
        await app.drain(concurrency=1)
        rows = await fetch(db_url, "SELECT status, attempts, count(*) FROM oke_messages GROUP BY 1, 2")
    assert rows == [("delivered", 1, 35)]
    short = {payload: round(ms) for payload, ms in left.items() if ms < lease_ms * 0.9}
    assert len(left) == 5 and not short, short


async def test_a_batch_due_a_moment_after_the_first_is_renewed_on_time_not_a_share_of_a_lease_later(db_url):
    """The renewer sleeps until the earliest renewal of all waiting batches. Two batches wait for a
    slot, the first due now and the second 50 ms later: the second's lease is renewed within moments,
    not when the first (renewed now, so next due half a lease on) is due again. (White-box: a
    waiting line's batches are set up directly, on real claims and a real store; with two claim
    lanes the order of two batches is whichever claim came back first.)"""
    from engine.worker.claim_ahead import AHEAD_LEASE_SHARE, WaitingLine

    lease_ms = 4000
    jobs = signal.once("ca.order", retries=3)
    on(jobs, flow("w.order", do=lambda payload, fx: None))
    async with oke("t", database_url=db_url, lease_ms=lease_ms) as app:
        for n in range(2):
            await app.emit(jobs, n)
        runtime = app._runtime()
        first = await app.store.claim(["ca.order"], runtime.worker_id, lease_ms, 1)
        second = await app.store.claim(["ca.order"], runtime.worker_id, lease_ms, 1)
        claimed_until = await _lease_until(db_url, second[0].id)
        line = WaitingLine(app.store, runtime.worker_id, lease_ms, lambda: None)
        share_s = lease_ms / 1000 * AHEAD_LEASE_SHARE
        now = time.monotonic()
        line.add(first, now - share_s)  # due now
        line.add(second, now + 0.05 - share_s)  # due 50 ms later
        renewer = asyncio.create_task(line.renew_due())
        try:
            await asyncio.sleep(0.6)  # the first's next renewal is 2 s away
            assert await _lease_until(db_url, second[0].id) > claimed_until
        finally:
            line.take_unstarted()
            renewer.cancel()


async def _lease_until(url: str, msg_id: str) -> int:
    [(until,)] = await fetch(url, "SELECT lease_expires_at FROM oke_messages WHERE id = $1", msg_id)
    return int(until)


async def test_a_renewal_is_refused_once_another_worker_holds_the_message(db_url):
    """The renewal is fenced like a settle: after another worker reclaimed the message (attempt 2),
    the first holder's renewal of attempt 1 changes nothing."""
    jobs = signal.once("ca.fence", retries=3)
    on(jobs, flow("w.fence", do=lambda payload, fx: None))
    async with oke("t", database_url=db_url, lease_ms=50) as app:
        await app.emit(jobs, 1)
        [first] = await app.store.claim(["ca.fence"], "A", 50, 1)
        await asyncio.sleep(0.1)
        [second] = await app.store.claim(["ca.fence"], "B", 30_000, 1)
        assert (first.seq, first.attempts, second.attempts) == (second.seq, 1, 2)
        assert not await app.store.renew_lease("A", first, 30_000)
        assert await app.store.renew_lease("B", second, 30_000)
        row = await fetch(db_url, "SELECT locked_by, attempts, status FROM oke_messages")
    assert row == [("B", 2, "inflight")]


async def test_fast_handlers_claim_several_batches_ahead_within_the_cap(db_url):
    """With handlers far faster than a claim's round trip, a worker holds more than two batches'
    worth of leases not yet handled (fewer, larger claims), but never more than
    (1 + AHEAD_MAX) × concurrency: what its heartbeat records (`held`, as `okconsole workers` shows)."""
    jobs = signal.once("ca.deep", retries=0)
    on(jobs, flow("w.deep", do=lambda payload, fx: None))
    held: list[int] = []
    concurrency = 4

    async def watch() -> None:
        while True:
            held.extend(n for (n,) in await fetch(db_url, "SELECT held FROM oke_workers WHERE stopped_at IS NULL"))
            await asyncio.sleep(0.002)  # SQLite's fetch never yields to the loop by itself

    async with oke("t", database_url=db_url, worker_heartbeat_s=0.005) as app:
        await app.emit_many(jobs, list(range(8_000)))
        watcher = asyncio.create_task(watch())
        await app.drain(concurrency=concurrency)
        watcher.cancel()
        rows = await fetch(db_url, "SELECT status, attempts, count(*) FROM oke_messages GROUP BY 1, 2")
    assert rows == [("delivered", 1, 8_000)]
    assert max(held) <= (1 + AHEAD_MAX) * concurrency, held
    assert max(held) > 2 * concurrency, held


async def test_a_worker_claiming_ahead_prepares_few_claim_statements(pg_url):
    """Claim sizes above CLAIM_STEP are multiples of it, so a worker claiming up to CLAIM_MAX ×
    concurrency ahead prepares a handful of claim statements a connection, not one per size."""
    jobs = signal.once("ca.round", retries=0)
    on(jobs, flow("w.round", do=lambda payload, fx: None))
    concurrency = 16
    async with oke("t", database_url=pg_url) as app:
        await app.emit_many(jobs, list(range(8_000)))
        await app.drain(concurrency=concurrency)
        prepared: list[str] = []
        cap = app.store.claim_rows_max
        hot = app.store.hot
        held = [await hot.take() for _ in range(hot.open_count)]  # every hot connection, each once
        for conn in held:
            prepared += [r[0] for r in await conn.fetch("SELECT statement FROM pg_prepared_statements")]
            hot.give(conn)
    limits = sorted({int(m) for m in re.findall(r"LIMIT (\d+)\s+FOR UPDATE OF m SKIP LOCKED", "\n".join(prepared))})
    assert limits, prepared
    assert all(n <= CLAIM_STEP or n % CLAIM_STEP == 0 for n in limits), limits
    assert max(limits) > concurrency, limits  # it did claim ahead
    assert max(limits) <= cap == 64, limits


@pytest.mark.parametrize(("concurrency", "largest"), [(8, 64), (32, 128)])
async def test_on_sqlite_fast_handlers_claim_up_to_what_they_may_hold_and_the_store_cap(
    sqlite_url: str, concurrency: int, largest: int
) -> None:
    """SQLite pays a writer transaction and its sync per claim whatever its size: 8 fast handlers
    ask for claims above 4 × 8 rows (up to CLAIM_MAX × 8 = 64), 32 for claims above 64 rows, never
    above the store's cap of 128 (twice PostgreSQL's). The real store runs every claim; the test
    only records the sizes asked for."""
    jobs = signal.once("ca.sqlite_cap", retries=0)

    async def instant(payload: Any, fx: Any) -> None:
        """Fast for sure: async, it runs in turn in the loop. A sync handler's thread hop (up to a
        millisecond on a loaded machine) made it as slow as the claim, and CI once saw claims of 32."""

    on(jobs, flow("w.sqlite_cap", do=instant))
    asked: list[int] = []
    async with oke("t", database_url=sqlite_url) as app:
        store = app.store

        def recording(method: Any) -> Any:
            async def call(*args: Any) -> Any:
                asked.append(args[-1])  # the claim's limit
                return await method(*args)

            return call

        store.claim = recording(store.claim)  # type: ignore[method-assign]
        store.settle_and_claim = recording(store.settle_and_claim)  # type: ignore[method-assign]
        await app.emit_many(jobs, list(range(8_000)))
        await app.drain(concurrency=concurrency)
        rows = await fetch(sqlite_url, "SELECT status, attempts, count(*) FROM oke_messages GROUP BY 1, 2")
    assert rows == [("delivered", 1, 8_000)]
    assert store.claim_rows_max == 128
    assert largest // 2 < max(asked) <= largest, sorted(set(asked))


async def test_an_outcome_is_settled_while_every_slot_is_taken_and_messages_wait_claimed_ahead(db_url):
    """Two slots, messages claimed ahead waiting, then both slots taken by handlers that wait: the
    worker cannot claim (it holds enough), so nothing carries the outcome of a handler that ended
    just before. It is settled anyway, at once, not left to run out its lease (SQLite used to keep
    it for the next claim, so another worker ran the message again: the once concurrency test
    caught it)."""
    lease_ms = 1000
    jobs = signal.once("ca.starved", retries=3)
    release = {name: asyncio.Event() for name in ("A", "B", "C")}
    ended: dict[str, float] = {}

    @on(jobs)
    @flow("w.starved")
    async def handle(payload: Any, fx: Any) -> None:
        if payload in release:
            await release[payload].wait()
            ended[payload] = time.monotonic()

    async with oke("t", database_url=db_url, lease_ms=lease_ms) as app:
        for n in range(40):  # fast handlers: the worker learns to claim ahead
            await app.emit(jobs, n)
        a = await app.emit(jobs, "A")
        for name in ("B", "C"):
            await app.emit(jobs, name)
        for n in range(40, 80):
            await app.emit(jobs, n)
        running = asyncio.create_task(app.drain(concurrency=2))
        await asyncio.sleep(0.3)  # A and B hold the slots; C and fast ones wait, claimed ahead
        release["A"].set()  # A ends after 0.3 s (claiming ahead stops: handlers got slow) and C takes its slot
        await asyncio.sleep(0.5)
        status = await scalar(db_url, "SELECT status FROM oke_messages WHERE id = $1", a)
        release["B"].set()
        release["C"].set()
        await asyncio.wait_for(running, 30)
        rows = await fetch(db_url, "SELECT attempts, count(*) FROM oke_messages GROUP BY 1")
    assert status == "delivered", "A's outcome waited for a claim that could not come"
    assert rows == [(1, 83)]  # and nothing ran twice


async def test_a_clean_stop_hands_the_messages_claimed_ahead_back_at_once(db_url):
    """One slot and fast handlers, so worker A claims several messages ahead; then a handler holds
    A's slot while A is stopped. Nothing starts after the stop: what A claimed ahead is pending
    again at once, its attempt not counted, and worker B takes it while A's last handler still runs
    (not after A's 30 s leases). Each message runs once, as attempt 1."""
    jobs = signal.once("ca.stop", retries=0)
    started: list[str] = []
    gate = asyncio.Event()

    @on(jobs)
    @flow("w.stop")
    async def handle(payload: str, fx: Any) -> None:
        started.append(payload)
        if payload == "hold":
            await gate.wait()

    async def inflight() -> int:
        return int(await scalar(db_url, "SELECT count(*) FROM oke_messages WHERE status = 'inflight'"))

    async with oke("a", database_url=db_url, worker_id="A", stop_grace_s=30) as a, \
            oke("b", database_url=db_url, worker_id="B") as b:
        for n in range(30):  # first: A measures fast handlers against its claims, so it claims ahead
            await a.emit(jobs, f"warm-{n}")
        await a.emit(jobs, "hold")
        for n in range(20):
            await a.emit(jobs, f"after-{n}")
        run_a = asyncio.create_task(a.run(concurrency=1))
        async with asyncio.timeout(10):
            while "hold" not in started or await inflight() < 3:
                await asyncio.sleep(0.01)
        ahead = await inflight() - 1
        # PostgreSQL's two claim lanes may have started a few after-N before "hold": those are A's
        by_a = {p for p in started if p.startswith("after-")}
        await a.stop()
        async with asyncio.timeout(10):  # handed back before the grace period, "hold" still runs
            while await inflight() > 1:
                await asyncio.sleep(0.01)
        assert {p for p in started if p.startswith("after-")} == by_a, started  # nothing started since
        back = await fetch(db_url, "SELECT status, attempts, locked_by, count(*) FROM oke_messages "
                                   "WHERE payload LIKE '\"after-%' AND status <> 'delivered' GROUP BY 1, 2, 3")
        assert back == [("pending", 0, None, 20 - len(by_a))]  # never claimed, or claimed ahead and handed back
        await b.drain(concurrency=4)
        assert not run_a.done()  # A's grace period: "hold" has not ended
        gate.set()
        await run_a
        runs = await fetch(db_url, "SELECT m.payload, r.worker_id, r.status, r.attempt, m.status, m.attempts "
                                   "FROM oke_runs AS r JOIN oke_messages AS m ON m.id = r.message_id "
                                   "WHERE m.payload NOT LIKE '\"warm-%' ORDER BY m.seq")
    assert ahead >= 2, ahead
    assert runs == [('"hold"', "A", "succeeded", 1, "delivered", 1)] + [
        (f'"after-{n}"', "A" if f"after-{n}" in by_a else "B", "succeeded", 1, "delivered", 1) for n in range(20)
    ]


async def test_a_hand_back_is_fenced_like_a_settle(db_url):
    """The hand-back at a stop changes only what this worker still holds: a message another worker
    took over after the lease ran out (attempt 2) is left alone; the other goes back, attempt 0."""
    jobs = signal.once("ca.back", retries=3)
    on(jobs, flow("w.back", do=lambda payload, fx: None))
    async with oke("t", database_url=db_url, lease_ms=50) as app:
        await app.emit(jobs, 1)
        await app.emit(jobs, 2)
        first, other = await app.store.claim(["ca.back"], "A", 50, 2)
        await asyncio.sleep(0.1)
        [second] = await app.store.claim(["ca.back"], "B", 30_000, 1)
        assert (second.seq, second.attempts) == (first.seq, 2)
        assert await app.store.hand_back("A", [first, other]) == 1
        rows = await fetch(db_url, "SELECT payload, status, attempts, locked_by FROM oke_messages ORDER BY seq")
    assert rows == [("1", "inflight", 2, "B"), ("2", "pending", 0, None)]
