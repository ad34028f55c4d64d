"""Retention of finished work (keep_delivered, keep_dead, keep_runs) on SQLite and PostgreSQL:
only finished rows older than the option go, in bounded batches, with their failures and runs;
the trigger-kept counts stay exact; each deletion is counted in history (`pruned`), not audited."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from engine import flow, oke, on, ops, signal
from engine import retention as retention_mod
from engine.ids import base32, now_ms

HOUR_MS = 3_600_000

pytestmark = pytest.mark.usefixtures("one_retention_pass")  # tests/conftest.py


class Boom(Exception):
    code = "E_BOOM"


def _make_flows(prefix: str):
    work = signal.once(f"{prefix}.work", retries=1)

    @on(work)
    @flow(f"{prefix}.work.flow")
    async def handle(n, fx):
        if n % 4 == 0:
            raise Boom("dies")  # a failed attempt, then dead

    return work


async def _age(store, signal_name: str, where: str, ms: int) -> int:
    """Make the messages `where` says finished (and were created) `ms` ago; their runs started
    then too (a run's id carries its start time, as new_id makes it)."""

    def age(conn) -> int:
        cut = now_ms() - ms
        ids = [r[0] for r in conn.execute(text(f"SELECT id FROM oke_messages WHERE signal = :s AND {where}"), {"s": signal_name})]
        for mid in ids:
            conn.execute(text("UPDATE oke_messages SET finished_at = :t, created_at = :t WHERE id = :id"), {"t": cut, "id": mid})
            for (run_id,) in conn.execute(text("SELECT run_id FROM oke_runs WHERE message_id = :id"), {"id": mid}).all():
                conn.execute(
                    text("UPDATE oke_runs SET run_id = :new, started_at = :t WHERE run_id = :old"),
                    {"new": "run_" + base32(cut, 10) + run_id[14:], "t": cut, "old": run_id},
                )
        return len(ids)

    return await store.write(age)


async def _rows(store, sql: str) -> int:
    return int(await store.read(lambda conn: conn.execute(text(sql)).scalar()))


async def test_retention_deletes_only_old_finished_messages_with_their_failures_and_runs(db_url):
    work = _make_flows("r1")
    async with oke("r", database_url=db_url, keep_delivered="1h", keep_dead="1h") as app:
        for n in range(40):
            await app.emit(work, n)
        await app.drain(concurrency=4)
        aged = await _age(app.store, "r1.work", "seq % 2 = 0", 2 * HOUR_MS)
        assert aged == 20
        await app.emit(work, 1)  # pending: never pruned, however old
        await app.store.write(lambda conn: conn.execute(text(
            "UPDATE oke_messages SET created_at = 0 WHERE status = 'pending'")))
        old_ids = set(await app.store.read(lambda conn: [r[0] for r in conn.execute(text(
            "SELECT id FROM oke_messages WHERE finished_at < :t"), {"t": now_ms() - HOUR_MS})]))
        deleted = await app.background.retention.pass_once()
        assert deleted == 20
        left = await app.store.read(lambda conn: {r[0] for r in conn.execute(text("SELECT id FROM oke_messages"))})
        assert not (left & old_ids) and len(left) == 21
        for table in ("oke_runs", "oke_failures"):
            orphans = await _rows(app.store, f"SELECT count(*) FROM {table} WHERE message_id NOT IN (SELECT id FROM oke_messages)")
            assert orphans == 0, table
        stats = {s.signal: s for s in await ops.stats(app.store)}["r1.work"]
        truth = await _rows(app.store, "SELECT count(*) FROM oke_messages WHERE status IN ('delivered', 'dead')")
        assert stats.delivered + stats.dead == truth == 20 and stats.pending == 1
        points = await ops.history(app.store, "r1.work", 0)
        assert sum(p.pruned for p in points) == 20  # counted in history ...
        audited = await ops.audit(app.store)
        assert audited == []  # ... and not in the audit log
        assert await app.background.retention.pass_once() == 0  # nothing old is left


async def test_retention_goes_in_bounded_batches(db_url, monkeypatch):
    monkeypatch.setattr(retention_mod, "MAX_BATCH", 7)
    # a batch slower than HOLD_TARGET_MS halves the next, but never below MIN_BATCH (20): above
    # this MAX_BATCH, so one slow batch on a loaded machine made the rest batches of 20
    monkeypatch.setattr(retention_mod, "MIN_BATCH", 1)
    work = _make_flows("r2")
    async with oke("r", database_url=db_url, keep_delivered="1h", keep_dead="1h") as app:
        for n in range(1, 61):  # every fourth dies: 15 dead, 45 delivered
            await app.emit(work, n)
        await app.drain(concurrency=4)
        await _age(app.store, "r2.work", "1 = 1", 2 * HOUR_MS)
        retention = app.background.retention
        retention.batch = 7
        retention.hold_ms.clear()
        assert await retention.pass_once() == 60
        # 45 delivered in batches of at most 7 (7 batches), 15 dead (3), each its own transaction
        assert len(retention.hold_ms) >= 7 + 3
        assert await _rows(app.store, "SELECT count(*) FROM oke_messages") == 0
        assert await _rows(app.store, "SELECT count(*) FROM oke_runs") == 0


async def test_keep_runs_deletes_old_runs_and_keeps_their_messages(db_url):
    work = _make_flows("r3")
    async with oke("r", database_url=db_url, keep_runs="1h") as app:
        for n in range(1, 11):
            await app.emit(work, n)
        await app.drain()
        runs_before = await _rows(app.store, "SELECT count(*) FROM oke_runs")
        await _age(app.store, "r3.work", "seq % 2 = 1", 2 * HOUR_MS)
        old_runs = await _rows(app.store, f"SELECT count(*) FROM oke_runs WHERE started_at < {now_ms() - HOUR_MS}")
        assert 0 < old_runs < runs_before
        assert await app.background.retention.pass_once() == old_runs
        assert await _rows(app.store, "SELECT count(*) FROM oke_runs") == runs_before - old_runs
        assert await _rows(app.store, "SELECT count(*) FROM oke_messages") == 10  # keep_delivered is unset
        points = await ops.history(app.store, "r3.work", 0)
        assert sum(p.pruned_runs for p in points) == old_runs and sum(p.pruned for p in points) == 0


async def test_retention_is_off_by_default(db_url):
    async with oke("r", database_url=db_url) as app:
        assert app.background is not None and app.background.retention is None


@pytest.mark.parametrize("keep", [{"keep_delivered": "1h"}, {"keep_dead": "30m"}, {"keep_runs": "7d"}])
def test_a_keep_option_turns_retention_on(keep):
    app = oke("r", **keep)
    assert app.retention_policy.active
