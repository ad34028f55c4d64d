"""Dedupe and pause on every store shape. Dedupe: a second emit with the dedupe key of an unfinished
(pending or inflight) message stores nothing and returns that message's id; once it is delivered or
dead the key is free. Pause: a paused signal's messages are not claimed (emits are still stored);
resume releases them."""

from __future__ import annotations

import asyncio
import json

from workers.db import fetch, scalar

from engine import flow, on, ops, signal
from engine.ids import now_ms
from engine.store import Claimed, Outcome


class Recorder:
    """A handler that records each payload it is given."""

    def __init__(self) -> None:
        self.seen: list[object] = []

    def __call__(self, payload, fx) -> None:
        self.seen.append(payload)


def outcome(claimed: Claimed, ok: bool = True) -> Outcome:
    at = now_ms()
    return Outcome(claimed, f"run_{claimed.id}", "w", ok, at, at, None if ok else "Boom", "boom")


# --------------------------------------------------------------------------- dedupe


async def test_a_second_emit_with_an_unfinished_dedupe_key_stores_nothing(shape):
    jobs = signal.once("c.jobs", retries=0)
    on(jobs, flow("w", do=Recorder()))
    async with shape.app() as app:
        first = await app.emit(jobs, {"n": 1}, dedupe="report:1")
        assert await app.emit(jobs, {"n": 2}, dedupe="report:1", delay="1h", priority=9) == first  # pending
        other = await app.emit(jobs, {"n": 3}, dedupe="report:2")
        assert other != first
        claimed = {c.id: c for c in await app.store.claim(["c.jobs"], "w1", 60_000, 10)}
        assert sorted(claimed) == sorted([first, other])
        assert await app.emit(jobs, {"n": 4}, dedupe="report:1") == first  # inflight
        rows = await fetch(shape.url, "SELECT id, payload, dedupe, priority, run_at FROM oke_messages ORDER BY seq")
        assert [(r[0], r[2], r[3], r[4]) for r in rows] == [(first, "report:1", 0, None), (other, "report:2", 0, None)]
        assert [json.loads(r[1]) for r in rows] == [{"n": 1}, {"n": 3}]  # the duplicates' payloads: nowhere

        assert await app.store.settle("w1", [outcome(claimed[first])]) == [True]  # delivered: the key is free
        after = await app.emit(jobs, {"n": 5}, dedupe="report:1")
        assert after not in (first, other)
        assert await app.store.settle("w1", [outcome(claimed[other], ok=False)]) == [True]  # dead: free too
        again = await app.emit(jobs, {"n": 6}, dedupe="report:2")
        assert again not in (first, other, after)
    statuses = dict(await fetch(shape.url, "SELECT id, status FROM oke_messages"))
    assert statuses == {first: "delivered", other: "dead", after: "pending", again: "pending"}


async def test_each_broadcast_copy_is_deduplicated_in_its_own_flow(shape):
    news = signal.broadcast("c.news")
    on(news, flow("a", do=Recorder()))
    on(news, flow("b", do=Recorder()))
    async with shape.app() as app:
        first = await app.emit(news, 1, dedupe="x")
        assert await app.emit(news, 2, dedupe="x") == first
        assert await scalar(shape.url, "SELECT count(*) FROM oke_messages") == 2  # one copy per flow
        claimed = await app.store.claim(["c.news\x1fa", "c.news\x1fb"], "w1", 60_000, 10)
    assert sorted(c.flow for c in claimed) == ["a", "b"]


# --------------------------------------------------------------------------- pause


async def test_a_paused_signals_messages_are_not_claimed_and_resume_releases_them(shape):
    """The pause is the store's (every process reads it); the worker leaves a paused signal's queues
    (the once queue and every broadcast copy's) out of its claims. Emits are still stored."""
    jobs = signal.once("c.jobs")
    fan = signal.broadcast("c.fan")
    other = signal.once("c.other")
    handled = Recorder()
    on(jobs, flow("w.jobs", do=handled))
    on(fan, flow("w.fan.a", do=handled))
    on(fan, flow("w.fan.b", do=handled))
    on(other, flow("w.other", do=handled))
    async with shape.app() as app:
        assert await app.store.paused_signals() == frozenset()
        await ops.pause(app.store, "c.jobs", actor="t")
        await ops.pause(app.store, "c.fan", actor="t")
        assert await app.store.paused_signals() == frozenset({"c.jobs", "c.fan"})
        await app.emit_many(jobs, ["j0", "j1"])
        await app.emit(fan, "f")
        await app.emit(other, "o")
        await asyncio.wait_for(app.drain(), 20)  # nothing of the paused signals is claimable: it ends
        assert handled.seen == ["o"]
        pending = await fetch(
            shape.url, "SELECT signal, count(*) FROM oke_messages WHERE status = 'pending' GROUP BY signal"
        )
        assert dict(pending) == {"c.jobs": 2, "c.fan": 2}

        await ops.resume(app.store, "c.jobs", actor="t")
        assert await app.store.paused_signals() == frozenset({"c.fan"})
        await asyncio.wait_for(app.drain(), 20)
        assert sorted(handled.seen) == ["j0", "j1", "o"]
        await ops.resume(app.store, "c.fan", actor="t")
        await asyncio.wait_for(app.drain(), 20)
    assert sorted(handled.seen) == ["f", "f", "j0", "j1", "o"]
    assert await scalar(shape.url, "SELECT count(*) FROM oke_messages WHERE status <> 'delivered'") == 0


# --------------------------------------------------------------------------- dedupe for a window


async def test_a_key_held_for_a_window_stays_held_after_its_message_finished(shape):
    """`dedupe_for`: delivered or dead, the message keeps its key for the window, whatever the later
    emit's own options; a plain dedupe key is free as before; a lapsed window frees the key."""
    jobs = signal.once("c.jobs", retries=0)
    on(jobs, flow("w", do=Recorder()))
    async with shape.app() as app:
        ok = await app.emit(jobs, {"n": 1}, dedupe="daily", dedupe_for="1h")
        bad = await app.emit(jobs, {"n": 2}, dedupe="failing", dedupe_for="1h")
        short = await app.emit(jobs, {"n": 3}, dedupe="short", dedupe_for="200ms")
        claimed = {c.id: c for c in await app.store.claim(["c.jobs"], "w1", 60_000, 10)}
        assert await app.emit(jobs, {"n": 4}, dedupe="daily", dedupe_for="1h") == ok  # inflight
        held = [outcome(claimed[ok]), outcome(claimed[bad], ok=False), outcome(claimed[short])]
        assert await app.store.settle("w1", held) == [True, True, True]
        assert await app.emit(jobs, {"n": 5}, dedupe="daily", dedupe_for="1h") == ok  # delivered, in its window
        assert await app.emit(jobs, {"n": 6}, dedupe="daily") == ok  # a plain dedupe emit sees the window too
        assert await app.emit(jobs, {"n": 7}, dedupe="failing", delay="1h") == bad  # dead, in its window
        await asyncio.sleep(0.5)
        later = await app.emit(jobs, {"n": 8}, dedupe="short", dedupe_for="200ms")  # its window lapsed
        assert later not in (ok, bad, short)
    rows = await fetch(shape.url, "SELECT id, status FROM oke_messages ORDER BY seq")
    assert rows == [(ok, "delivered"), (bad, "dead"), (short, "delivered"), (later, "pending")]


async def test_retention_deleting_a_windowed_message_keeps_its_key_held(shape):
    """The hold outlives the row: retention records when the window ends before deleting it, and
    deletes the hold once that has passed."""
    jobs = signal.once("c.jobs")
    on(jobs, flow("w", do=Recorder()))
    async with shape.app(keep_delivered="1ms") as app:
        first = await app.emit(jobs, 1, dedupe="k", dedupe_for="1h")
        brief = await app.emit(jobs, 2, dedupe="b", dedupe_for="100ms")
        await asyncio.wait_for(app.drain(), 20)
        await asyncio.sleep(0.05)
        assert await app.background.retention.pass_once() >= 2
        assert await scalar(shape.url, "SELECT count(*) FROM oke_messages") == 0
        assert await app.emit(jobs, 3, dedupe="k", dedupe_for="1h") == first  # the row is gone, the key held
        await asyncio.sleep(0.3)
        await app.background.retention.pass_once()  # the brief hold lapsed: deleted
        assert await fetch(shape.url, "SELECT dedupe FROM oke_dedupe_holds") == [("k",)]
        assert await app.emit(jobs, 4, dedupe="b", dedupe_for="100ms") != brief
    assert await scalar(shape.url, "SELECT count(*) FROM oke_messages") == 1
