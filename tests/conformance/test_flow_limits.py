"""What a gated claim (flow limits, engine/store/sql/gates.py) promises on every store shape: however
many claimers race on two stores, never more than N of a queue inflight under a live lease, never
more than N starts recorded in a window, the plain queues claimed beside them as before, a
broadcast limited per copy queue, and a held-back claim saying how long until more fit."""

from __future__ import annotations

import asyncio

from workers.db import fetch

from engine import flow, on, signal
from engine.ids import now_ms
from engine.store import Claimed, Outcome, Store
from engine.store.sql.gates import CONCURRENCY_POLL_MS, Gate


def _never(payload, fx):
    raise AssertionError("these tests claim and settle by hand; no handler runs")


def _bound(name: str, kind: str = "once", **options):
    declared = signal.once(name, **options) if kind == "once" else signal.broadcast(name, **options)
    on(declared, flow(f"w.{name}", do=_never))
    return declared


def done(claimed: Claimed) -> Outcome:
    at = now_ms()
    return Outcome(claimed, f"run_{claimed.id}_{claimed.attempts}", "w", True, at, at)


async def _inflight(url: str, queue: str) -> int:
    [(n,)] = await fetch(url, "SELECT count(*) FROM oke_messages WHERE queue = $1 AND status = 'inflight'", queue)
    return int(n)


async def test_racing_gated_claimers_never_hold_more_than_the_limit(shape):
    """Eight claimers on two stores claim and settle a capped queue until it is drained; after every
    claim, the inflight count (read from the table) is at most the limit, and the limit is reached."""
    _bound("g.capped", concurrency=3)
    gate = Gate("g.capped", "g.capped", 3, None, None)
    async with shape.app() as app:
        await app.emit_many("g.capped", range(60))
        other = shape.store()
        await other.open()
        seen: list[int] = []
        done_ids: set[str] = set()

        async def claimer(store: Store, worker: str) -> None:
            idle = 0
            while idle < 40:
                got = (await store.claim_gated(worker, [], [], [gate], 60_000, 4, 4)).claimed
                seen.append(await _inflight(shape.url, "g.capped"))
                if not got:
                    idle += 1
                    await asyncio.sleep(0.01)
                    continue
                idle = 0
                await asyncio.sleep(0.005)
                assert all(await store.settle(worker, [done(c) for c in got]))
                done_ids.update(c.id for c in got)

        try:
            await asyncio.gather(*[claimer(app.store, f"a{i}") for i in range(5)],
                                 *[claimer(other, f"b{i}") for i in range(3)])
        finally:
            await other.close()
    assert len(done_ids) == 60
    assert max(seen) == 3


async def test_a_rate_gate_admits_n_starts_a_window_and_says_when_the_next_fits(shape):
    _bound("g.paced", rate="4/2s")
    _bound("g.plain")
    gate = Gate("g.paced", "g.paced", None, 4, 2_000)
    async with shape.app() as app:
        await app.emit_many("g.paced", range(10))
        await app.emit_many("g.plain", range(3))
        first = await app.store.claim_gated("w1", [], ["g.plain"], [gate], 60_000, 20, 20)
        assert sorted(c.queue for c in first.claimed) == ["g.paced"] * 4 + ["g.plain"] * 3
        assert [c.queue for c in first.claimed[:4]] == ["g.paced"] * 4  # the gated ones start first
        assert 1_000 < first.held_back_ms <= 2_000
        other = shape.store()
        await other.open()
        try:
            held = await other.claim_gated("w2", [], [], [gate], 60_000, 20, 20)
        finally:
            await other.close()
        assert held.claimed == [] and held.held_back_ms is not None
        await asyncio.sleep((held.held_back_ms + 50) / 1000)
        later = await app.store.claim_gated("w1", [], [], [gate], 60_000, 20, 20)
        assert len(later.claimed) == 4
        rows = await fetch(shape.url, "SELECT at, n FROM oke_rate_starts WHERE queue = 'g.paced'")
        starts = [int(at) for at, n in rows for _ in range(int(n))]
        assert len(starts) == 4 and len(set(starts)) == 1  # the first window's four were deleted


async def test_a_broadcast_is_limited_per_copy_queue_and_a_concurrency_hold_polls(shape):
    _bound("g.fan", kind="broadcast", concurrency=1)
    on("g.fan", flow("w.g.fan.b", do=_never))
    gates = [Gate(q, "g.fan", 1, None, None) for q in ("g.fan\x1fw.g.fan", "g.fan\x1fw.g.fan.b")]
    async with shape.app() as app:
        await app.emit_many("g.fan", range(3))
        first = await app.store.claim_gated("w1", [], [], gates, 60_000, 10, 10)
        assert sorted(c.flow for c in first.claimed) == ["w.g.fan", "w.g.fan.b"]
        again = await app.store.claim_gated("w1", [], [], gates, 60_000, 10, 10)
        assert again.claimed == [] and again.held_back_ms == CONCURRENCY_POLL_MS
        # a settle frees each copy queue's slot: the next claim takes one more of each
        assert all(await app.store.settle("w1", [done(c) for c in first.claimed]))
        after = await app.store.claim_gated("w1", [], [], gates, 60_000, 10, 10)
        assert sorted(c.flow for c in after.claimed) == ["w.g.fan", "w.g.fan.b"]
