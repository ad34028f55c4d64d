"""engine.ops: the operator read/write model, on SQLite and PostgreSQL.

Stores are populated through the real engine (declare, bind, emit, drain); handlers
that raise make the dead letters. Assertions read back through `engine.ops` and,
where the point is what the database holds, with plain SQL.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import text

from burstkit import emit_many
from engine import OkeError, flow, oke, on, ops, signal
from engine.store import make_store
from engine.store.wake import Waker


class Boom(Exception):
    code = "E_BOOM"


class DiskFull(Exception):
    code = "E_DISK"


async def sql(store, statement: str, **params: Any) -> list[tuple]:
    return await store.read(lambda conn: [tuple(r) for r in conn.execute(text(statement), params)])


async def sql_write(store, *statements: str) -> None:
    def run(conn):
        for s in statements:
            conn.execute(text(s))
    await store.write(run)


def by_signal(rows: list[ops.SignalStats]) -> dict[str, ops.SignalStats]:
    return {r.signal: r for r in rows}


class Switch:
    """A handler that fails (E_BOOM) while `broken`, recording every call's payload and attempt."""

    def __init__(self, broken: bool = True) -> None:
        self.broken = broken
        self.calls: list[tuple[Any, int]] = []

    async def __call__(self, payload, fx) -> None:
        self.calls.append((payload, fx.attempt))
        if self.broken:
            raise Boom(f"broken on attempt {fx.attempt}")


# --------------------------------------------------------------------------------------- stats

async def test_stats_counts_every_status_and_lists_idle_signals(db_url):
    work = signal.once("t.work", retries=0)
    signal.once("t.idle", optional=True, description="never emitted")
    signal.broadcast("t.fan", optional=True)

    @on(work)
    @flow("w.work")
    async def handle(payload, fx):
        if payload["fail"]:
            raise Boom("no")

    async with oke("t", database_url=db_url) as app:
        for n in range(5):
            await app.emit(work, {"fail": n < 2})
        await app.drain()
        for _ in range(4):
            await app.emit(work, {"fail": False})
        await asyncio.sleep(0.06)
        rows = await ops.stats(app.store)

    got = by_signal(rows)
    assert [r.signal for r in rows] == sorted(got)
    assert set(got) == {"t.work", "t.idle", "t.fan"}
    w = got["t.work"]
    assert (w.kind, w.pending, w.inflight, w.delivered, w.dead) == ("once", 4, 0, 3, 2)
    assert w.lag_ms is not None and 60 <= w.lag_ms < 60_000
    idle = got["t.idle"]
    assert (idle.kind, idle.pending, idle.inflight, idle.delivered, idle.dead, idle.lag_ms) == \
        ("once", 0, 0, 0, 0, None)
    assert got["t.fan"].kind == "broadcast"
    assert set(ops.to_json(w)) == {"signal", "kind", "description", "pending", "inflight", "delivered", "dead",
                                   "lag_ms", "flows", "paused", "scheduled", "kept", "head", "events_per_s",
                                   "health", "concurrency", "rate", "running", "held_by"}
    assert (w.description, w.flows) == ("t.work", ["w.work"])  # the description defaults to the name
    assert (idle.description, idle.flows) == ("never emitted", [])


async def test_inflight_lease_blocker_and_reclaimable(db_url):
    jobs = signal.once("t.keyed", retries=0)
    started = asyncio.Event()
    release = asyncio.Event()

    @on(jobs)
    @flow("w.keyed")
    async def handle(payload, fx):
        if payload["n"] == 1:
            started.set()
            await release.wait()

    async with oke("t", database_url=db_url, lease_ms=300, worker_id="ops-test-worker") as app:
        first = await app.emit(jobs, {"n": 1}, key="k")
        second = await app.emit(jobs, {"n": 2}, key="k")
        other = await app.emit(jobs, {"n": 3}, key="other")
        drain = asyncio.create_task(app.drain(concurrency=1))
        await asyncio.wait_for(started.wait(), 10)

        counts = by_signal(await ops.stats(app.store))["t.keyed"]
        assert (counts.pending, counts.inflight) == (2, 1)
        held = await ops.show(app.store, first)
        assert held.status == "inflight"
        assert held.lease.locked_by == "ops-test-worker"
        assert held.lease.lease_expires_at is not None
        assert held.lease.reclaimable is False
        assert held.lease.orphaned is False  # its holder (this app's drain) beats
        blocked = await ops.show(app.store, second)
        assert blocked.blocked_by is not None and blocked.blocked_by.id == first
        assert blocked.blocked_by.status == "inflight"
        assert (await ops.show(app.store, other)).blocked_by is None  # another key: nothing blocks it

        await asyncio.sleep(0.45)  # the lease (300 ms) runs out while the handler still runs
        expired = await ops.show(app.store, first)
        assert expired.status == "inflight" and expired.lease.reclaimable is True
        assert expired.lease.orphaned is False  # slow, not stuck: the holder is alive

        release.set()
        await asyncio.wait_for(drain, 20)
        done = await ops.show(app.store, second)
        assert done.status == "delivered" and done.blocked_by is None
        assert done.lease == ops.Lease(locked_by=None, lease_expires_at=None, reclaimable=False)


# ------------------------------------------------------------------------------------ messages

async def test_messages_newest_first_filtered_and_paged(db_url):
    jobs = signal.once("t.list", retries=0)

    @on(jobs)
    @flow("w.list")
    async def handle(payload, fx):
        if payload["n"] % 3 == 0:
            raise Boom("multiple of three")

    async with oke("t", database_url=db_url) as app:
        ids = [await app.emit(jobs, {"n": n}, key="a" if n % 2 else "b") for n in range(7)]
        await app.drain()
        store = app.store
        first = await ops.message_page(store, "t.list", limit=3)
        assert [m.id for m in first.items] == ids[::-1][:3]
        second = await ops.message_page(store, "t.list", limit=3, before_seq=first.next_before_seq)
        assert [m.id for m in second.items] == ids[::-1][3:6]
        third = await ops.message_page(store, "t.list", limit=3, before_seq=second.next_before_seq)
        assert [m.id for m in third.items] == ids[:1] and third.next_before_seq is None

        dead = await ops.messages(store, "t.list", status="dead")
        assert [m.id for m in dead] == [ids[6], ids[3], ids[0]]
        assert all(m.status == "dead" and m.attempts == 1 for m in dead)
        keyed = await ops.messages(store, "t.list", key="a")
        assert [m.id for m in keyed] == [ids[5], ids[3], ids[1]]
        assert await ops.messages(store, "t.list", status="pending") == []

        row = (await ops.messages(store, "t.list", limit=1))[0]
        assert set(ops.to_json(row)) == {"id", "status", "key", "attempts", "locked_by", "lease_expires_at",
                                         "created_at", "parent_run_id", "run_at", "priority", "dedupe"}
        assert isinstance(row.created_at, int) and row.created_at > 1_600_000_000_000

        with pytest.raises(ops.UnknownSignal) as err:
            await ops.messages(store, "t.nope")
        assert err.value.known == ["t.list"] and "t.list" in str(err.value)
        with pytest.raises(ValueError, match="unknown status"):
            await ops.messages(store, "t.list", status="failed")


# ---------------------------------------------------------------------------------- show, trace

async def test_show_has_payload_failures_and_the_trace(db_url):
    parent_sig = signal.once("t.parent", retries=0)
    child_sig = signal.once("t.child", retries=1)
    parent_runs: list[str] = []

    @on(parent_sig)
    @flow("w.parent")
    async def parent(payload, fx):
        parent_runs.append(fx.run_id)
        await fx.emit(child_sig, {"order": payload["order"], "note": "ünïcode"}, key="o1")

    @on(child_sig)
    @flow("w.child")
    async def child(payload, fx):
        raise DiskFull(f"disk full on attempt {fx.attempt}")

    async with oke("t", database_url=db_url) as app:
        await app.emit(parent_sig, {"order": 7})
        await app.drain()
        [dead] = await ops.dead_letters(app.store, "t.child")
        detail = await ops.show(app.store, dead.id)
        with pytest.raises(ops.UnknownMessage) as err:
            await ops.show(app.store, "msg_nope")

    assert "not a message id: msg_nope (message ids look like msg_" in str(err.value)
    assert "t.child" not in str(err.value)  # the signal names do not help someone holding a wrong id
    assert detail.payload == {"order": 7, "note": "ünïcode"}
    assert (detail.signal, detail.flow, detail.key, detail.status) == ("t.child", "w.child", "o1", "dead")
    assert detail.attempts == 2 and detail.retries == 1 and detail.replays == 0
    assert [(f.code, f.message, f.attempt) for f in detail.failures] == [
        ("E_DISK", "disk full on attempt 1", 1), ("E_DISK", "disk full on attempt 2", 2)]
    assert detail.failures[0].at <= detail.failures[1].at
    assert detail.parent_run_id == parent_runs[0]
    assert [r.attempt for r in detail.runs] == [1, 2]
    assert {r.status for r in detail.runs} == {"failed"}
    [root] = detail.trace
    assert root.run_id == parent_runs[0] and root.flow == "w.parent" and root.status == "succeeded"
    assert [m.id for m in root.messages] == [dead.id] and root.emitted == 1
    assert [(c.flow, c.attempt, c.status) for c in root.children] == [("w.child", 1, "failed"),
                                                                      ("w.child", 2, "failed")]
    data = ops.to_json(detail)
    assert json.loads(json.dumps(data)) == data
    assert set(data["lease"]) == {"locked_by", "lease_expires_at", "reclaimable", "orphaned"}


async def test_trace_walks_up_to_the_root_and_down_to_every_child(db_url):
    a_sig = signal.once("t.a", retries=0)
    b_sig = signal.broadcast("t.b", retries=0)
    c_sig = signal.once("t.c", retries=2)
    runs: dict[str, list[str]] = {"a": [], "b1": [], "b2": [], "c": [], "ghost": []}

    @on(a_sig)
    @flow("w.a")
    async def a(payload, fx):
        runs["a"].append(fx.run_id)
        await fx.emit(b_sig, {"step": "b"})

    @on(b_sig)
    @flow("w.b1")
    async def b1(payload, fx):
        runs["b1"].append(fx.run_id)
        await fx.emit(c_sig, {"step": "c"})

    @on(b_sig)
    @flow("w.b2")
    async def b2(payload, fx):
        runs["b2"].append(fx.run_id)

    @on(c_sig)
    @flow("w.c")
    async def c(payload, fx):
        runs["c" if payload["step"] == "c" else "ghost"].append(fx.run_id)
        if fx.attempt == 1:
            raise Boom("first try fails")

    async with oke("t", database_url=db_url) as app:
        await app.emit(a_sig, {"step": "a"})
        ghost_msg = await app.emit(c_sig, {"step": "ghost"}, parent_run_id="run_ghost")
        await app.drain()
        from_leaf = await ops.trace(app.store, runs["c"][1])
        from_root = await ops.trace(app.store, runs["a"][0])
        ghost = await ops.trace(app.store, "run_ghost")
        with pytest.raises(ops.UnknownRun):
            await ops.trace(app.store, "run_never")

    assert from_leaf == from_root
    root = from_root
    assert (root.run_id, root.flow, root.status, root.parent_run_id) == (runs["a"][0], "w.a", "succeeded", None)
    assert root.started_at is not None and root.ended_at >= root.started_at
    assert root.emitted == 2 and {m.signal for m in root.messages} == {"t.b"}  # one copy per flow
    assert sorted(ch.flow for ch in root.children) == ["w.b1", "w.b2"]
    b1_node = next(ch for ch in root.children if ch.flow == "w.b1")
    assert b1_node.parent_run_id == runs["a"][0]
    assert [m.signal for m in b1_node.messages] == ["t.c"]
    assert [(n.run_id, n.status, n.attempt) for n in b1_node.children] == [
        (runs["c"][0], "failed", 1), (runs["c"][1], "succeeded", 2)]
    assert b1_node.children[0].error == "E_BOOM: first try fails"
    assert next(ch for ch in root.children if ch.flow == "w.b2").children == []

    assert ghost.run_id == "run_ghost" and ghost.status == "unknown" and ghost.flow is None
    assert [m.id for m in ghost.messages] == [ghost_msg]
    assert [ch.run_id for ch in ghost.children] == runs["ghost"]
    assert [(ch.parent_run_id, ch.attempt) for ch in ghost.children] == [("run_ghost", 1), ("run_ghost", 2)]
    node = ops.to_json(root)
    assert {"run_id", "flow", "status", "parent_run_id", "started_at", "ended_at", "messages",
            "children"} <= set(node)


# ------------------------------------------------------------------------------------ failures

async def test_failures_group_dead_and_failing_messages_by_latest_failure(db_url):
    jobs = signal.once("t.fail", retries=1)

    @on(jobs)
    @flow("w.fail")
    async def handle(payload, fx):
        if payload["kind"] == "disk":
            raise DiskFull("disk full")
        if payload["kind"] == "key":
            raise KeyError("sku")
        if payload["kind"] == "flaky" and fx.attempt == 1:
            raise Boom("flaky")

    async with oke("t", database_url=db_url) as app:
        for kind in ["disk", "key", "disk", "flaky", "ok", "key", "disk"]:
            await app.emit(jobs, {"kind": kind})
            await app.drain()
        groups = await ops.failures(app.store, "t.fail")
        keys = [m.id for m in await ops.messages(app.store, "t.fail", status="dead")
                if (await ops.show(app.store, m.id)).failures[-1].code == "KeyError"]
        await ops.replay(app.store, "t.fail", keys)
        after = await ops.failures(app.store, "t.fail")
        with pytest.raises(ops.UnknownSignal):
            await ops.failures(app.store, "t.nope")

    assert [(g.code, g.message, g.count) for g in groups] == [("E_DISK", "disk full", 3),
                                                              ("KeyError", "'sku'", 2)]
    assert groups[0].last_at >= groups[1].last_at
    assert set(ops.to_json(groups[0])) == {"code", "message", "count", "last_at"}
    # the delivered "flaky" message failed once but is not failing any more; replayed ones left the list
    assert [(g.code, g.count) for g in after] == [("E_DISK", 3)]


# -------------------------------------------------------------------------------------- replay

async def test_replay_requeues_and_a_worker_delivers_from_attempt_one_with_history(db_url):
    jobs = signal.once("t.replay", retries=1)
    handler = Switch(broken=True)
    on(jobs, flow("w.replay", do=handler))

    async with oke("t", database_url=db_url) as app:
        dead_id = await app.emit(jobs, {"n": 1}, key="k")
        await app.drain()
        later = await app.emit(jobs, {"n": 2}, key="k")  # same key, emitted after the dead one
        seq_before = await sql(app.store, "SELECT seq FROM oke_messages WHERE id = :i", i=dead_id)

        result = await ops.replay(app.store, "t.replay", [dead_id], reason="fixed the SMTP password",
                                  actor="alice")
        assert result == ops.Replayed(replayed=1, ids=[dead_id])
        again = await ops.replay(app.store, "t.replay", [dead_id], actor="alice")
        assert again == ops.Replayed(replayed=0, ids=[])  # it is pending now: nothing to requeue

        requeued = await ops.show(app.store, dead_id)
        assert (requeued.status, requeued.attempts, requeued.replays) == ("pending", 0, 1)
        assert requeued.lease == ops.Lease(None, None, False) and requeued.finished_at is None
        assert await sql(app.store, "SELECT seq FROM oke_messages WHERE id = :i", i=dead_id) == seq_before
        assert [(f.code, f.attempt) for f in requeued.failures] == [("E_BOOM", 1), ("E_BOOM", 2),
                                                                   ("replayed", 0)]
        marker = requeued.failures[-1].message
        assert "alice" in marker and "fixed the SMTP password" in marker
        [entry] = await ops.audit(app.store)
        assert (entry.actor, entry.action, entry.signal, entry.count, entry.ids, entry.reason) == \
            ("alice", "replay", "t.replay", 1, [dead_id], "fixed the SMTP password")

        # still broken: the replayed message fails again, counting attempts from 1 after the marker
        handler.calls.clear()
        await app.drain(concurrency=1)
        assert [(p["n"], a) for p, a in handler.calls][:2] == [(1, 1), (1, 2)]  # key order: the old one first
        redead = await ops.show(app.store, dead_id)
        assert redead.status == "dead" and redead.attempts == 2
        assert [(f.code, f.attempt) for f in redead.failures] == [
            ("E_BOOM", 1), ("E_BOOM", 2), ("replayed", 0), ("E_BOOM", 1), ("E_BOOM", 2)]

        # fixed: replay both dead ones; the worker delivers them at attempt 1, in key order
        handler.broken = False
        handler.calls.clear()
        both = await ops.replay(app.store, "t.replay", all=True)
        assert both.replayed == 2 and both.ids == [dead_id, later]
        await app.drain(concurrency=1)
        assert handler.calls == [({"n": 1}, 1), ({"n": 2}, 1)]
        done = await ops.show(app.store, dead_id)
        assert (done.status, done.attempts, done.replays) == ("delivered", 1, 2)
        assert [f.code for f in done.failures] == ["E_BOOM", "E_BOOM", "replayed", "E_BOOM", "E_BOOM",
                                                   "replayed"]
        assert by_signal(await ops.stats(app.store))["t.replay"].delivered == 2


async def test_replay_keeps_per_key_order_against_newer_pending_messages(db_url):
    jobs = signal.once("t.order", retries=0)
    handler = Switch(broken=True)
    on(jobs, flow("w.order", do=handler))

    async with oke("t", database_url=db_url) as app:
        old = await app.emit(jobs, {"n": "old"}, key="acct-1")
        await app.drain()
        handler.broken = False
        handler.calls.clear()
        await app.emit(jobs, {"n": "new"}, key="acct-1")  # pending, not yet run
        await ops.replay(app.store, "t.order", [old])
        await app.drain(concurrency=4)
    assert [p["n"] for p, _ in handler.calls] == ["old", "new"]


async def test_replay_dry_run_and_filters(db_url):
    jobs = signal.once("t.filter", retries=0)
    other = signal.once("t.other", retries=0)

    @on(jobs)
    @flow("w.filter")
    async def handle(payload, fx):
        if payload["err"] == "disk":
            raise DiskFull("Disk FULL: 100% used")
        raise Boom("smtp refused")

    @on(other)
    @flow("w.other")
    async def handle_other(payload, fx):
        raise Boom("x")

    async with oke("t", database_url=db_url) as app:
        ids = {}
        for name, err, key in [("d1", "disk", "a"), ("d2", "disk", "b"), ("s1", "smtp", "a"),
                               ("s2", "smtp", "b"), ("s3", "smtp", "a")]:
            ids[name] = await app.emit(jobs, {"err": err}, key=key)
        foreign = await app.emit(other, {"err": "x"})
        await app.drain()
        store = app.store

        preview = await ops.replay(store, "t.filter", all=True, dry_run=True)
        assert preview == ops.ReplayPreview(replayed=0, would_replay=5,
                                            ids=[ids[n] for n in ("d1", "d2", "s1", "s2", "s3")])
        assert set(ops.to_json(preview)) == {"replayed", "would_replay", "ids"}

        async def would(**filters) -> set[str]:
            result = await ops.replay(store, "t.filter", dry_run=True, **filters)
            return set(result.ids)

        assert await would(all=True, code="E_DISK") == {ids["d1"], ids["d2"]}
        assert await would(all=True, match="disk full") == {ids["d1"], ids["d2"]}  # case-insensitive
        assert await would(all=True, match="100%") == {ids["d1"], ids["d2"]}      # % is literal
        assert await would(all=True, match="10_%") == set()                       # _ is literal
        assert await would(all=True, key="a") == {ids["d1"], ids["s1"], ids["s3"]}
        assert await would(all=True, code="E_BOOM", key="b") == {ids["s2"]}
        assert await would(all=True, older_than_ms=0) == set(ids.values())
        assert await would(all=True, older_than_ms=3_600_000) == set()
        assert await would(ids=[ids["s1"], ids["d1"]], code="E_BOOM") == {ids["s1"]}

        # nothing above changed anything
        counts = by_signal(await ops.stats(store))["t.filter"]
        assert (counts.dead, counts.pending) == (5, 0)
        assert await ops.audit(store) == []

        with pytest.raises(ops.UnknownMessage) as err:
            await ops.replay(store, "t.filter", ["msg_missing", ids["d1"]])
        assert err.value.ids == ["msg_missing"]
        with pytest.raises(ops.UnknownMessage):
            await ops.replay(store, "t.filter", [foreign])  # a message of another signal
        with pytest.raises(ops.UnknownSignal) as unknown:
            await ops.replay(store, "t.nope", all=True)
        assert unknown.value.known == ["t.filter", "t.other"]
        with pytest.raises(ValueError):
            await ops.replay(store, "t.filter", [ids["d1"]], all=True)
        with pytest.raises(ValueError):
            await ops.replay(store, "t.filter")
        with pytest.raises(ValueError):
            await ops.replay(store, "t.filter", all=True, rate=0)

        assert (await ops.replay(store, "t.filter", ids["s1"], dry_run=True)).ids == [ids["s1"]]  # a lone id

        done = await ops.replay(store, "t.filter", all=True, code="E_DISK", actor="bob")
        assert done.ids == [ids["d1"], ids["d2"]]
        counts = by_signal(await ops.stats(store))["t.filter"]
        assert (counts.dead, counts.pending) == (3, 2)
        assert by_signal(await ops.stats(store))["t.other"].dead == 1


async def test_two_concurrent_replays_of_one_dead_letter_requeue_it_once(db_url):
    jobs = signal.once("t.race", retries=0)
    on(jobs, flow("w.race", do=Switch(broken=True)))

    async with oke("t", database_url=db_url) as app:
        ids = await emit_many(app, jobs, [{"n": n} for n in range(400)])
        await app.drain(concurrency=32)
        one, two = make_store(db_url), make_store(db_url)
        await one.open()
        await two.open()
        try:
            for msg_id in ids[:10]:  # the same single id from two stores at once
                results = await asyncio.gather(ops.replay(one, "t.race", [msg_id], actor="one"),
                                               ops.replay(two, "t.race", [msg_id], actor="two"))
                assert sorted(r.replayed for r in results) == [0, 1]
            # two --all replays racing over the rest: each dead letter is taken by exactly one
            results = await asyncio.gather(ops.replay(one, "t.race", all=True),
                                           ops.replay(two, "t.race", all=True))
        finally:
            await one.close()
            await two.close()
        a, b = (set(r.ids) for r in results)
        assert not a & b and a | b == set(ids[10:])
        assert results[0].replayed + results[1].replayed == 390

        markers = await sql(app.store, "SELECT message_id, count(*) FROM oke_failures "
                                       "WHERE kind = 'replayed' GROUP BY message_id")
        assert len(markers) == 400 and {n for _, n in markers} == {1}
        assert await sql(app.store, "SELECT DISTINCT replays FROM oke_messages") == [(1,)]
        audited = await ops.audit(app.store, limit=1000)
        assert sum(e.count for e in audited) == 400
        assert sorted(i for e in audited for i in e.ids) == sorted(ids)


def _abort_trigger(dialect: str, table: str, event: str, condition: str) -> list[str]:
    """A trigger that makes the statement fail when `condition` holds for the row."""
    if dialect == "sqlite":
        return [f"CREATE TRIGGER oke_test_abort BEFORE {event} ON {table} WHEN {condition} "
                f"BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END"]
    pg_condition = condition
    return [f"CREATE FUNCTION oke_test_abort() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF {pg_condition} THEN RAISE EXCEPTION 'refused by the test trigger'; END IF; "
            f"RETURN NEW; END $$",
            f"CREATE TRIGGER oke_test_abort BEFORE {event} ON {table} FOR EACH ROW "
            f"EXECUTE FUNCTION oke_test_abort()"]


def _drop_trigger(dialect: str, table: str) -> list[str]:
    if dialect == "sqlite":
        return ["DROP TRIGGER oke_test_abort"]
    return [f"DROP TRIGGER oke_test_abort ON {table}", "DROP FUNCTION oke_test_abort()"]


async def _assert_untouched(store, ids: list[str]) -> None:
    counts = by_signal(await ops.stats(store))["t.bulk"]
    assert (counts.dead, counts.pending) == (len(ids), 0)
    assert await sql(store, "SELECT count(*) FROM oke_failures WHERE kind = 'replayed'") == [(0,)]
    assert await sql(store, "SELECT count(*) FROM oke_messages WHERE replays <> 0 OR attempts <> 1") == [(0,)]
    assert await ops.audit(store) == []
    [group] = await ops.failures(store, "t.bulk")
    assert group.count == len(ids)


async def test_replay_of_10000_dead_letters_commits_whole_or_not_at_all(db_url):
    bulk = signal.once("t.bulk", retries=0)
    on(bulk, flow("w.bulk", do=Switch(broken=True)))

    async with oke("t", database_url=db_url) as app:
        store = app.store
        ids = await emit_many(app, bulk, [{"n": n} for n in range(10_000)])
        await app.drain(concurrency=64)
        await _assert_untouched(store, ids)
        dialect = store.dialect

        # 1. the 5,001st row's update fails half-way through the UPDATE
        victim = ids[5000]
        await sql_write(store, *_abort_trigger(dialect, "oke_messages", "UPDATE",
                                               f"NEW.id = '{victim}' AND NEW.status = 'pending'"))
        with pytest.raises(Exception, match="refused by the test trigger"):
            await ops.replay(store, "t.bulk", all=True, reason="half way")
        await _assert_untouched(store, ids)
        # by ids (ten IN-list chunks in one transaction): the sixth chunk fails
        with pytest.raises(Exception, match="refused by the test trigger"):
            await ops.replay(store, "t.bulk", ids, reason="half way, by ids")
        await _assert_untouched(store, ids)
        await sql_write(store, *_drop_trigger(dialect, "oke_messages"))

        # 2. every update and marker is written, then the audit row fails: still nothing
        await sql_write(store, *_abort_trigger(dialect, "oke_audit", "INSERT", "NEW.count > 0"))
        with pytest.raises(Exception, match="refused by the test trigger"):
            await ops.replay(store, "t.bulk", all=True)
        await _assert_untouched(store, ids)
        await sql_write(store, *_drop_trigger(dialect, "oke_audit"))

        # 3. and without the trigger it commits whole
        result = await ops.replay(store, "t.bulk", all=True, actor="ops")
        assert result.replayed == 10_000 and result.ids == ids
        counts = by_signal(await ops.stats(store))["t.bulk"]
        assert (counts.dead, counts.pending) == (0, 10_000)
        assert await sql(store, "SELECT count(*) FROM oke_failures WHERE kind = 'replayed'") == [(10_000,)]
        [entry] = await ops.audit(store)
        assert entry.count == 10_000 and entry.ids == ids


async def test_replay_with_a_rate_runs_in_audited_chunks(db_url):
    jobs = signal.once("t.rate", retries=0)
    on(jobs, flow("w.rate", do=Switch(broken=True)))

    async with oke("t", database_url=db_url) as app:
        ids = await emit_many(app, jobs, [{"n": n} for n in range(30)])
        await app.drain()
        started = time.monotonic()
        result = await ops.replay(app.store, "t.rate", all=True, rate=20, actor="pacer")
        elapsed = time.monotonic() - started
        entries = await ops.audit(app.store)

    assert result.replayed == 30 and result.ids == ids
    assert elapsed >= 0.9, f"30 messages at 20/s took only {elapsed:.2f}s"
    assert [e.count for e in entries] == [10, 20]  # newest first: one audit row per chunk
    assert entries[1].ids == ids[:20] and entries[0].ids == ids[20:]


class Order(BaseModel):
    sku: str
    qty: int


async def test_replay_can_replace_one_payload_checked_by_the_schema(db_url):
    orders = signal.once("t.orders", schema=Order, retries=0)
    seen: list[Order] = []

    @on(orders)
    @flow("w.orders")
    async def handle(payload: Order, fx):
        if payload.qty < 0:
            raise ValueError("negative quantity")
        seen.append(payload)

    async with oke("t", database_url=db_url) as app:
        bad = await app.emit(orders, {"sku": "A-1", "qty": -2})
        also_bad = await app.emit(orders, {"sku": "A-2", "qty": -1})
        await app.drain()
        store = app.store

        with pytest.raises(OkeError) as err:
            await ops.replay(store, "t.orders", [bad], payload={"sku": "A-1", "qty": "lots"})
        assert err.value.code == 1250
        with pytest.raises(ValueError, match="exactly one"):
            await ops.replay(store, "t.orders", all=True, payload={"sku": "A-1", "qty": 2})
        with pytest.raises(ValueError, match="exactly one"):
            await ops.replay(store, "t.orders", [bad, also_bad], payload={"sku": "A-1", "qty": 2})
        assert (await ops.show(store, bad)).status == "dead"
        assert (await ops.show(store, bad)).payload == {"sku": "A-1", "qty": -2}

        result = await ops.replay(store, "t.orders", [bad], payload={"sku": "A-1", "qty": 2},
                                  reason="typo in qty")
        assert result.ids == [bad]
        assert (await ops.show(store, bad)).payload == {"sku": "A-1", "qty": 2}
        assert (await ops.show(store, also_bad)).payload == {"sku": "A-2", "qty": -1}
        [entry] = await ops.audit(store)
        assert entry.reason == "typo in qty [payload replaced]"
        await app.drain()
        assert seen == [Order(sku="A-1", qty=2)]


async def test_replay_wakes_workers_here_and_in_other_processes(db_url):
    jobs = signal.once("t.wake", retries=0)
    on(jobs, flow("w.wake", do=Switch(broken=True)))

    async with oke("t", database_url=db_url) as app:
        msg = await app.emit(jobs, {})
        await app.drain()
        waker = Waker(app.store.url)
        listener = None
        heard: list[str] = []
        if app.store.dialect == "postgresql":
            import asyncpg
            listener = await asyncpg.connect(db_url.replace("postgresql+asyncpg://", "postgresql://"))
            await listener.add_listener("oke_wake", lambda *args: heard.append(args[-1]))
        try:
            waker.clear()
            await ops.replay(app.store, "t.wake", [msg])
            await asyncio.sleep(0.2)
            assert waker.event.is_set()
            if listener is not None:
                assert heard == ["t.wake"]
        finally:
            waker.close()
            if listener is not None:
                await listener.close()


# --------------------------------------------------------------------------------------- purge

async def test_purge_deletes_finished_messages_with_failures_and_steps(db_url):
    jobs = signal.once("t.purge", retries=1)

    @on(jobs)
    @flow("w.purge", durable=True)
    async def handle(payload, fx):
        await fx.step("charge", lambda: {"charged": payload["n"]})
        if payload["n"] % 2:
            raise Boom("odd")

    async with oke("t", database_url=db_url) as app:
        ids = [await app.emit(jobs, {"n": n}) for n in range(6)]
        await app.drain()
        store = app.store
        dead = [ids[n] for n in (1, 3, 5)]
        delivered = [ids[n] for n in (0, 2, 4)]
        assert await sql(store, "SELECT count(*) FROM oke_steps") == [(6,)]

        assert await ops.purge(store, "t.purge", "dead", older_than_ms=3_600_000) == ops.Purged(0, [])
        assert await ops.audit(store) == []
        preview = await ops.purge(store, "t.purge", "dead", dry_run=True)
        assert preview == ops.PurgePreview(purged=0, would_purge=3, ids=dead)
        with pytest.raises(ValueError, match="delivered"):
            await ops.purge(store, "t.purge", "pending")
        with pytest.raises(ops.UnknownSignal):
            await ops.purge(store, "t.nope", "dead")

        result = await ops.purge(store, "t.purge", "dead", actor="carol", reason="cleanup")
        assert result.purged == 3 and sorted(result.ids) == sorted(dead)
        for msg_id in dead:
            with pytest.raises(ops.UnknownMessage):
                await ops.show(store, msg_id)
        assert await sql(store, "SELECT count(*) FROM oke_failures") == [(0,)]
        assert sorted(r[0] for r in await sql(store, "SELECT message_id FROM oke_steps")) == sorted(delivered)
        counts = by_signal(await ops.stats(store))["t.purge"]
        assert (counts.delivered, counts.dead) == (3, 0)
        [entry] = await ops.audit(store)
        assert (entry.action, entry.actor, entry.signal, entry.count, entry.reason) == \
            ("purge", "carol", "t.purge", 3, "cleanup")
        assert sorted(entry.ids) == sorted(dead)

        assert (await ops.purge(store, "t.purge", "delivered", older_than_ms=0)).purged == 3
        assert await sql(store, "SELECT count(*) FROM oke_messages") == [(0,)]
        assert await sql(store, "SELECT count(*) FROM oke_steps") == [(0,)]
        assert await sql(store, "SELECT count(*) FROM oke_runs") != [(0,)]  # runs stay: the trace history
        assert [e.action for e in await ops.audit(store)] == ["purge", "purge"]


# ----------------------------------------------------------------------------- signals, audit

async def test_known_signals_signal_info_and_audit_order(db_url):
    jobs = signal.once("t.info", retries=4, description="the info queue")
    on(jobs, flow("w.info", do=Switch(broken=True)))

    async with oke("shop", database_url=db_url) as app:
        first = await app.emit(jobs, {})
        second = await app.emit(jobs, {})
        await app.drain()
        store = app.store
        assert await ops.known_signals(store) == ["t.info"]
        info = await ops.signal_info(store, "t.info")
        assert info == ops.SignalInfo(name="t.info", kind="once", retries=4, dead_letter=True, optional=False,
                                      retention=None, description="the info queue", app="shop",
                                      flows=["w.info"], recorded=True)
        assert await ops.signal_info(store, "t.nope") is None
        await ops.replay(store, "t.info", [first], actor="a1")
        await ops.replay(store, "t.info", [second], actor="a2", reason="second")
        entries = await ops.audit(store)
        assert [(e.actor, e.ids) for e in entries] == [("a2", [second]), ("a1", [first])]
        assert [e.actor for e in await ops.audit(store, limit=1)] == ["a2"]
        assert set(ops.to_json(entries[0])) == {"at", "actor", "action", "signal", "count", "ids", "reason", "source"}
        assert entries[0].at >= entries[1].at > 1_600_000_000_000


async def test_show_judges_a_lease_by_the_clock_the_claims_use(db_url, monkeypatch):
    """A console on a machine whose clock runs two minutes ahead: on PostgreSQL leases are judged
    by the database's clock (as claims are), so a live lease is not shown as reclaimable."""
    from engine.store import base
    from holdkit import one_message_held

    async with one_message_held(db_url, "t.clock") as (app, msg):
        assert (await ops.show(app.store, msg)).lease.reclaimable is False
        ahead = base.now_ms() + 120_000
        monkeypatch.setattr(base, "now_ms", lambda: ahead)
        detail = await ops.show(app.store, msg)
    assert detail.status == "inflight"
    if db_url.startswith("postgresql"):
        assert detail.lease.reclaimable is False
    else:  # SQLite's workers share this machine's clock: by it, the lease has expired
        assert detail.lease.reclaimable is True


async def test_keyed_lists_and_trace_children_can_use_their_partial_indexes(db_url):
    """Unkeyed, parentless messages stay out of the key and parent indexes (cheaper status
    changes), and the lookups by key and by parent run still use those indexes."""
    async with oke("t", database_url=db_url, bindings=[]):
        pass
    store = make_store(db_url)
    await store.open()
    try:
        def plans(conn):
            pg = conn.dialect.name == "postgresql"
            if pg:
                conn.execute(text("SET LOCAL enable_seqscan = off"))
            explain = "EXPLAIN " if pg else "EXPLAIN QUERY PLAN "
            out = []
            catalog = ("SELECT indexdef FROM pg_indexes WHERE indexname = :n" if pg
                       else "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :n")
            for name in ("oke_messages_signal_key", "oke_messages_parent", "oke_runs_parent"):
                assert "WHERE" in conn.execute(text(catalog), {"n": name}).scalar().upper(), name
            for q in ("SELECT seq FROM oke_messages WHERE signal = 's' AND key = 'k' ORDER BY seq DESC LIMIT 5",
                      "SELECT seq FROM oke_messages WHERE parent_run_id IN ('r1', 'r2')",
                      "SELECT run_id FROM oke_runs WHERE parent_run_id = 'r1'"):
                out.append(" ".join(str(c) for row in conn.execute(text(explain + q)) for c in row))
            return out
        keyed, children, runs = await store.read(plans)
    finally:
        await store.close()
    assert "oke_messages_signal_key" in keyed
    # the parent index, or the sort index over (signal, parent_run_id, seq): both hold only rows that
    # have a parent, and PostgreSQL may pick either for a lookup this small
    assert "oke_messages_parent" in children or "oke_messages_signal_parent" in children
    assert "oke_runs_parent" in runs
