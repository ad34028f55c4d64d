"""A settle is fenced by (seq, holder, attempt) on every store shape: an outcome from a worker that
no longer holds that attempt changes nothing (its run is recorded `lease_lost`), and in a batch each
outcome is judged on its own, in every statement the store splits the batch into."""

from __future__ import annotations

import asyncio

from workers.db import fetch

from engine import flow, on, signal
from engine.ids import now_ms
from engine.store import Claimed, Outcome


def _jobs(retries: int = 0):
    jobs = signal.once("c.jobs", retries=retries)
    on(jobs, flow("w", do=lambda p, fx: None))
    return jobs


def outcome(claimed: Claimed, ok: bool = True, run_id: str | None = None) -> Outcome:
    at = now_ms()
    run = run_id or f"run_{claimed.id}_{claimed.attempts}"
    return Outcome(claimed, run, "w", ok, at, at, None if ok else "Boom", None if ok else "boom")


async def _rows(url: str) -> dict[str, tuple]:
    return {r[0]: r[1:] for r in await fetch(url, "SELECT id, status, locked_by, attempts FROM oke_messages")}


async def test_a_stale_holders_outcome_is_refused_and_the_new_holders_lands(shape):
    """w1's lease expires and w2 reclaims: w1's late success changes nothing; w2's failure lands."""
    _jobs()
    async with shape.app() as app:
        store = app.store
        msg_id = await app.emit("c.jobs", {"a": 1})
        [first] = await store.claim(["c.jobs"], "w1", 300, 10)
        await asyncio.sleep(0.4)
        [second] = await store.claim(["c.jobs"], "w2", 60_000, 10)
        assert (second.id, second.attempts) == (msg_id, 2)

        assert await store.settle("w1", [outcome(first, run_id="run_late")]) == [False]
        assert (await _rows(shape.url))[msg_id] == ("inflight", "w2", 2)
        assert await store.claim(["c.jobs"], "w3", 60_000, 10) == []  # still w2's
        assert await store.settle("w2", [outcome(second, ok=False, run_id="run_b")]) == [True]
    assert (await _rows(shape.url))[msg_id] == ("dead", None, 2)
    runs = await fetch(shape.url, "SELECT run_id, status, attempt FROM oke_runs ORDER BY attempt")
    assert runs == [("run_late", "lease_lost", 1), ("run_b", "failed", 2)]
    assert await fetch(shape.url, "SELECT attempt, code FROM oke_failures") == [(2, "Boom")]


async def test_another_worker_cannot_settle_a_message_it_does_not_hold(shape):
    _jobs()
    async with shape.app() as app:
        msg_id = await app.emit("c.jobs")
        [held] = await app.store.claim(["c.jobs"], "w1", 60_000, 10)
        assert await app.store.settle("w2", [outcome(held)]) == [False]
        assert (await _rows(shape.url))[msg_id] == ("inflight", "w1", 1)
        assert await app.store.settle("w1", [outcome(held)]) == [True]
    assert (await _rows(shape.url))[msg_id] == ("delivered", None, 1)


async def test_the_same_worker_reclaiming_its_own_message_is_fenced_by_attempt(shape):
    _jobs()
    async with shape.app() as app:
        msg_id = await app.emit("c.jobs")
        [first] = await app.store.claim(["c.jobs"], "same", 30, 10)
        await asyncio.sleep(0.1)
        [second] = await app.store.claim(["c.jobs"], "same", 60_000, 10)
        assert second.attempts == 2
        assert await app.store.settle("same", [outcome(first, ok=False)]) == [False]
        assert (await _rows(shape.url))[msg_id] == ("inflight", "same", 2)
        assert await app.store.settle("same", [outcome(second)]) == [True]
    assert (await _rows(shape.url))[msg_id] == ("delivered", None, 2)
    assert await fetch(shape.url, "SELECT count(*) FROM oke_failures") == [(0,)]


async def test_a_batch_with_a_late_and_a_current_outcome_of_one_message_acks_only_the_current(shape):
    """Five successes settled at once, two of them attempts 1 and 2 of one message this worker
    reclaimed from itself: attempt 1's is refused (lease_lost), everything else lands."""
    _jobs()
    async with shape.app() as app:
        store = app.store
        msg_id = await app.emit("c.jobs", "twice")
        [first] = await store.claim(["c.jobs"], "same", 30, 1)
        await asyncio.sleep(0.1)
        [second] = await store.claim(["c.jobs"], "same", 60_000, 1)
        others = [await app.emit("c.jobs", n) for n in range(3)]
        rest = await store.claim(["c.jobs"], "same", 60_000, 3)
        outcomes = [outcome(c) for c in [first, second, *rest]]
        assert await store.settle("same", outcomes) == [False, True, True, True, True]
    rows = await _rows(shape.url)
    assert rows[msg_id] == ("delivered", None, 2)
    assert [rows[i] for i in others] == [("delivered", None, 1)] * 3
    runs = await fetch(shape.url, "SELECT attempt, status FROM oke_runs WHERE message_id = $1 ORDER BY attempt", msg_id)
    assert runs == [(1, "lease_lost"), (2, "succeeded")]


async def test_a_large_settle_fences_each_outcome(shape):
    """Twelve successes settled at once (SQLite acks them in one statement from eight on): the three
    whose lease another worker reclaimed are refused and their runs say lease_lost; the rest land."""
    _jobs()
    async with shape.app() as app:
        store = app.store
        ids = await app.emit_many("c.jobs", range(12))
        short = await store.claim(["c.jobs"], "w1", 300, 3)
        rest = await store.claim(["c.jobs"], "w1", 60_000, 9)
        await asyncio.sleep(0.4)
        taken = await store.claim(["c.jobs"], "w2", 60_000, 12)
        assert sorted(c.id for c in taken) == sorted(c.id for c in short)
        assert await store.settle("w1", [outcome(c) for c in short + rest]) == [False] * 3 + [True] * 9
    rows = await _rows(shape.url)
    assert [rows[c.id][:2] for c in short] == [("inflight", "w2")] * 3
    assert [rows[c.id][:2] for c in rest] == [("delivered", None)] * 9
    runs = dict(await fetch(shape.url, "SELECT message_id, status FROM oke_runs"))
    assert [runs[i] for i in ids] == ["lease_lost"] * 3 + ["succeeded"] * 9


async def test_a_settle_longer_than_one_statement_fences_each_outcome_in_every_part(shape):
    """150 successes settled at once (PostgreSQL acks 64 a statement): the last 20, in the third
    statement, lost their lease to another worker and are refused; the 130 before them land."""
    _jobs()
    async with shape.app() as app:
        store = app.store
        await app.emit_many("c.jobs", range(150))
        kept: list[Claimed] = []
        while len(kept) < 130:
            kept += await store.claim(["c.jobs"], "w1", 60_000, 130 - len(kept))
        lost = await store.claim(["c.jobs"], "w1", 300, 20)
        await asyncio.sleep(0.4)
        assert sorted(c.id for c in await store.claim(["c.jobs"], "w2", 60_000, 150)) == sorted(c.id for c in lost)
        assert await store.settle("w1", [outcome(c) for c in kept + lost]) == [True] * 130 + [False] * 20
    rows = await _rows(shape.url)
    assert [rows[c.id][:2] for c in kept] == [("delivered", None)] * 130
    assert [rows[c.id][:2] for c in lost] == [("inflight", "w2")] * 20
    runs = dict(await fetch(shape.url, "SELECT message_id, status FROM oke_runs"))
    assert [runs[c.id] for c in kept + lost] == ["succeeded"] * 130 + ["lease_lost"] * 20


async def test_a_lost_lease_cannot_be_renewed_or_handed_back(shape):
    """The other fenced writes of a held attempt: renewing a lease and giving back unstarted work."""
    _jobs()
    async with shape.app() as app:
        store = app.store
        msg_id = await app.emit("c.jobs")
        [first] = await store.claim(["c.jobs"], "w1", 300, 1)
        await asyncio.sleep(0.4)
        [second] = await store.claim(["c.jobs"], "w2", 60_000, 1)
        assert await store.renew_lease("w1", first, 60_000) is False
        assert await store.hand_back("w1", [first]) == 0
        assert (await _rows(shape.url))[msg_id] == ("inflight", "w2", 2)
        assert await store.renew_lease("w2", second, 60_000) is True
        assert await store.hand_back("w2", [second]) == 1
    assert (await _rows(shape.url))[msg_id] == ("pending", None, 1)
