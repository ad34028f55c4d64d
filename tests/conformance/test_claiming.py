"""What a claim promises on every store shape: one holder per live lease however many claim at once,
a keyed message waits behind its key's unfinished head, nothing is claimed before its run_at, and
higher priority goes first, then emit order (seq)."""

from __future__ import annotations

import asyncio
from collections import Counter

from workers.db import fetch

from engine import flow, on, signal
from engine.ids import now_ms
from engine.store import Claimed, Outcome, Store


def _never(payload, fx):
    raise AssertionError("these tests claim and settle by hand; no handler runs")


def _jobs(name: str = "c.jobs", **options):
    jobs = signal.once(name, **options)
    on(jobs, flow(f"w.{name}", do=_never))
    return jobs


def done(claimed: Claimed, ok: bool = True) -> Outcome:
    """The outcome of one attempt that ran just now: a success, or a failure coded "Boom"."""
    at = now_ms()
    return Outcome(claimed, f"run_{claimed.id}_{claimed.attempts}", "w", ok, at, at, None if ok else "Boom", "boom")


async def _claim_until_empty(store: Store, queue: str, worker: str, took: list[Claimed]) -> None:
    """Claim in small bites until a claim finds nothing; record every message taken."""
    while batch := await store.claim([queue], worker, 60_000, 3):
        took += batch
        await asyncio.sleep(0)


# --------------------------------------------------------------------------- exclusivity


async def test_many_concurrent_claimers_never_take_one_message_twice(shape):
    """Six claimers on the app's store and three on a second store of the same shape (for SQLite
    with the writer process, a second writer process) race over one backlog: each message is taken
    by exactly one of them, once."""
    jobs = _jobs()
    async with shape.app() as app:
        ids = await app.emit_many(jobs, range(150))
        other = shape.store()
        await other.open()
        try:
            took: list[Claimed] = []
            claimers = [_claim_until_empty(app.store, "c.jobs", f"a{i}", took) for i in range(6)]
            claimers += [_claim_until_empty(other, "c.jobs", f"b{i}", took) for i in range(3)]
            await asyncio.gather(*claimers)
            assert await app.store.claim(["c.jobs"], "late", 60_000, 200) == []
        finally:
            await other.close()
    twice = [msg_id for msg_id, n in Counter(c.id for c in took).items() if n > 1]
    assert twice == []
    assert sorted(c.id for c in took) == sorted(ids)
    assert {c.attempts for c in took} == {1}


async def test_a_message_under_a_live_lease_is_not_claimed_and_one_past_its_lease_is(shape):
    _jobs()
    async with shape.app() as app:
        msg_id = await app.emit("c.jobs")
        [first] = await app.store.claim(["c.jobs"], "w1", 300, 10)
        assert await app.store.claim(["c.jobs"], "w2", 60_000, 10) == []  # the lease is live
        await asyncio.sleep(0.4)
        [second] = await app.store.claim(["c.jobs"], "w2", 60_000, 10)  # the next claim reclaims
    assert (first.id, first.attempts) == (msg_id, 1)
    assert (second.id, second.attempts) == (msg_id, 2)


# --------------------------------------------------------------------------- per-key FIFO


async def test_a_keyed_message_waits_behind_its_unfinished_head(shape):
    """While a key's head is held, failed back to pending or not yet due, the later messages of that
    key are not claimed; other keys and unkeyed messages are. The next one goes once the head ends."""
    _jobs(retries=1)
    async with shape.app() as app:
        store = app.store
        k1 = [await app.emit("c.jobs", n, key="k") for n in range(3)]
        other = await app.emit("c.jobs", "j", key="j")
        plain = await app.emit("c.jobs", "none")
        first = await store.claim(["c.jobs"], "w1", 60_000, 10)
        assert sorted(c.id for c in first) == sorted([k1[0], other, plain])  # one per key, the head
        assert await store.claim(["c.jobs"], "w2", 60_000, 10) == []  # k's head is held

        [head] = [c for c in first if c.id == k1[0]]
        assert await store.settle("w1", [done(head, ok=False)]) == [True]  # pending again, retries left
        [again] = await store.claim(["c.jobs"], "w2", 60_000, 10)
        assert (again.id, again.attempts) == (k1[0], 2)  # the failed head, not the message behind it

        assert await store.settle("w2", [done(again)]) == [True]
        [nxt] = await store.claim(["c.jobs"], "w2", 60_000, 10)
        assert nxt.id == k1[1]
        assert await store.settle("w2", [done(nxt)]) == [True]
        [last] = await store.claim(["c.jobs"], "w2", 60_000, 10)
        assert last.id == k1[2]


async def test_a_dead_head_releases_its_key(shape):
    _jobs(retries=0)
    async with shape.app() as app:
        first, second = [await app.emit("c.jobs", n, key="k") for n in range(2)]
        [head] = await app.store.claim(["c.jobs"], "w1", 60_000, 10)
        assert head.id == first
        assert await app.store.settle("w1", [done(head, ok=False)]) == [True]  # no retries: dead
        [nxt] = await app.store.claim(["c.jobs"], "w1", 60_000, 10)
    assert nxt.id == second


async def test_a_delayed_head_holds_its_key_back_and_the_same_key_of_another_signal_is_free(shape):
    _jobs()
    _jobs("c.other")
    async with shape.app() as app:
        await app.emit("c.jobs", "first", key="k", delay="1h")
        await app.emit("c.jobs", "second", key="k")
        free = await app.emit("c.other", "elsewhere", key="k")
        assert await app.store.claim(["c.jobs"], "w1", 60_000, 10) == []
        [claimed] = await app.store.claim(["c.jobs", "c.other"], "w1", 60_000, 10)
    assert claimed.id == free


# --------------------------------------------------------------------------- delays and priority


async def test_a_delayed_message_is_not_claimed_before_its_run_at(shape):
    _jobs()
    async with shape.app() as app:
        later = await app.emit("c.jobs", "later", delay="400ms")
        assert await app.store.claim(["c.jobs"], "w1", 60_000, 10) == []
        waits = await app.store.next_due_in_ms(["c.jobs"])
        assert waits is not None and 0 < waits <= 400
        await asyncio.sleep(0.5)
        [claimed] = await app.store.claim(["c.jobs"], "w1", 60_000, 10)
    assert claimed.id == later


async def test_higher_priority_is_claimed_first_then_emit_order(shape):
    """One at a time: priority descending, seq ascending among equals; a high priority that is not
    due yet waits, and within a key emit order beats priority."""
    _jobs()
    async with shape.app() as app:
        names = ["low", "plain", "high", "mid", "plain 2", "not due", "k first", "k second"]
        options = [
            {"priority": -1},
            {},
            {"priority": 10},
            {"priority": 5},
            {},
            {"priority": 99, "delay": "1h"},
            {"key": "k"},
            {"key": "k", "priority": 100},
        ]
        ids = {await app.emit("c.jobs", name, **opts): name for name, opts in zip(names, options, strict=True)}
        order = []
        while claimed := await app.store.claim(["c.jobs"], "w1", 60_000, 1):
            order.append(ids[claimed[0].id])
            assert await app.store.settle("w1", [done(claimed[0])]) == [True]
    assert order == ["high", "mid", "plain", "plain 2", "k first", "k second", "low"]
    stored = await fetch(shape.url, "SELECT priority FROM oke_messages ORDER BY seq")
    assert [p for (p,) in stored] == [-1, 0, 10, 5, 0, 99, 0, 100]


async def test_one_claim_returns_the_best_rows_by_priority_then_seq(shape):
    _jobs()
    async with shape.app() as app:
        low = await app.emit_many("c.jobs", range(4), priority=-1)
        high = await app.emit_many("c.jobs", range(3), priority=3)
        plain = await app.emit_many("c.jobs", range(3))
        claimed = await app.store.claim(["c.jobs"], "w1", 60_000, 5)
    assert sorted(c.id for c in claimed) == sorted(high + plain[:2])
    assert all(c.id not in low for c in claimed)
