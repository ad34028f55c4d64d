"""Live tapes and retention on every store shape.

Tape: event ids are `<epoch>.<seq>`, seq increases by one per event in commit order and is never
reused, from any store on the database; reading after a cursor the tape has pruned past reports the
gap (how many were missed, the oldest id still there) instead of skipping it silently.
Retention: keep_delivered / keep_dead / keep_runs delete finished work older than they say, with
its failures and runs, and nothing else: not pending or inflight work however old, not newer work.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text
from workers.db import fetch

from engine import flow, on, ops, signal
from engine.ids import base32, now_ms
from engine.store import Claimed, Outcome

HOUR_MS = 3_600_000


def _seqs(ids: list[str], epoch: str) -> list[int]:
    assert {i.split(".")[0] for i in ids} == {epoch}
    return [int(i.split(".")[1]) for i in ids]


# --------------------------------------------------------------------------- tape ids and gaps


async def test_tape_ids_increase_by_one_and_are_never_reused(shape):
    """Ids run on across concurrent emits, pruning, and a second store emitting to the same tape."""
    ticks = signal.live("c.ticks", retention={"max_count": 5}, optional=True)
    async with shape.app() as app:
        first = [await app.emit(ticks, n) for n in range(8)]  # the first three are pruned
        epoch = first[0].split(".")[0]
        assert _seqs(first, epoch) == list(range(1, 9))
        together = await asyncio.gather(*(app.emit(ticks, n) for n in range(8, 20)))
        assert sorted(_seqs(list(together), epoch)) == list(range(9, 21))
        async with shape.app("second", bindings=[]) as other:
            later = [await other.emit(ticks, n) for n in range(20, 23)]
        assert _seqs(later, epoch) == [21, 22, 23]
        info = await ops.tape_info(app.store, "c.ticks")
    assert info is not None
    assert (info.epoch, info.head, info.head_id, info.first_id) == (epoch, 23, f"{epoch}.23", f"{epoch}.19")
    assert (info.retained, info.pruned_through) == (5, 18)


async def test_reading_after_a_pruned_cursor_reports_the_gap(shape):
    ticks = signal.live("c.ticks", retention={"max_count": 3}, optional=True)
    async with shape.app() as app:
        ids = [await app.emit(ticks, {"n": n}) for n in range(6)]  # 4, 5, 6 retained
        epoch = ids[0].split(".")[0]
        after_3, gap = await ops.tape_after(app.store, "c.ticks", f"{epoch}.3")  # the last pruned: resumable
        assert gap is None and [e.id for e in after_3] == ids[3:]
        assert [e.data for e in after_3] == [{"n": 3}, {"n": 4}, {"n": 5}]
        entries, gap = await ops.tape_after(app.store, "c.ticks", f"{epoch}.1")
        assert entries == [] and gap is not None
        assert (gap.reason, gap.missed, gap.first_id) == ("pruned", 2, f"{epoch}.4")
        for cursor, reason in {f"{epoch}.99": "unknown", "zzzz.1": "reset", "not a cursor": "malformed"}.items():
            entries, gap = await ops.tape_after(app.store, "c.ticks", cursor)
            assert entries == [] and gap is not None and gap.reason == reason, cursor


# --------------------------------------------------------------------------- retention


def _never(payload, fx):
    raise AssertionError("these tests claim and settle by hand; no handler runs")


def outcome(claimed: Claimed, ok: bool) -> Outcome:
    at = now_ms()
    return Outcome(claimed, f"run_{claimed.id}", "w", ok, at, at, None if ok else "Boom", "boom")


def _age(ids: list[str], ms: int):
    """A write that makes these messages finished and created `ms` ago, their runs started then too
    (a run's id carries its start time): the test cannot wait an hour."""

    def age(conn) -> None:
        cut = now_ms() - ms
        for mid in ids:
            conn.execute(
                text("UPDATE oke_messages SET finished_at = :t, created_at = :t WHERE id = :id"), {"t": cut, "id": mid}
            )
            runs = conn.execute(text("SELECT run_id FROM oke_runs WHERE message_id = :id"), {"id": mid}).all()
            for (run_id,) in runs:
                conn.execute(
                    text("UPDATE oke_runs SET run_id = :new, started_at = :t WHERE run_id = :old"),
                    {"new": "run_" + base32(cut, 10) + run_id[14:], "t": cut, "old": run_id},
                )

    return age


async def _settle_all(app, fails: set[str]) -> None:
    while claimed := await app.store.claim(["c.jobs"], "w1", 60_000, 16):
        assert await app.store.settle("w1", [outcome(c, c.id not in fails) for c in claimed]) == [True] * len(claimed)


async def test_keep_delivered_and_keep_dead_delete_only_older_finished_messages(shape, one_retention_pass):
    jobs = signal.once("c.jobs", retries=0)
    on(jobs, flow("w", do=_never))
    async with shape.app(keep_delivered="1h", keep_dead="1h") as app:
        ids = await app.emit_many(jobs, range(12))
        await _settle_all(app, fails=set(ids[::3]))  # 4 dead, 8 delivered
        old = ids[:6]  # 2 dead, 4 delivered
        await app.store.write(_age(old, 2 * HOUR_MS))
        waiting = await app.emit(jobs, "pending")
        [held] = await app.store.claim(["c.jobs"], "w1", 60_000, 1)
        stuck = await app.emit(jobs, "pending too")
        await app.store.write(_age([waiting, stuck], 3 * HOUR_MS))
        unfinish = "UPDATE oke_messages SET finished_at = NULL WHERE status IN ('pending', 'inflight')"
        await app.store.write(lambda c: c.execute(text(unfinish)))  # old, but not finished
        assert await app.background.retention.pass_once() == 6
        left = {r[0] for r in await fetch(shape.url, "SELECT id FROM oke_messages")}
        assert held.id == waiting and left == set(ids[6:]) | {waiting, stuck}
        for table in ("oke_runs", "oke_failures"):
            orphans = f"SELECT count(*) FROM {table} WHERE message_id NOT IN (SELECT id FROM oke_messages)"
            assert await fetch(shape.url, orphans) == [(0,)], table
        assert await app.background.retention.pass_once() == 0


async def test_keep_runs_deletes_older_runs_and_keeps_their_messages(shape, one_retention_pass):
    jobs = signal.once("c.jobs", retries=0)
    on(jobs, flow("w", do=_never))
    async with shape.app(keep_runs="1h") as app:
        ids = await app.emit_many(jobs, range(10))
        await _settle_all(app, fails=set())
        await app.store.write(_age(ids[:4], 2 * HOUR_MS))
        assert await app.background.retention.pass_once() == 4
        runs = {r[0] for r in await fetch(shape.url, "SELECT message_id FROM oke_runs")}
        assert runs == set(ids[4:])
        assert len(await fetch(shape.url, "SELECT id FROM oke_messages")) == 10  # keep_delivered is unset
