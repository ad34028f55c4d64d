"""Operator controls through engine.ops, on SQLite and PostgreSQL: pause / resume,
cancel, delete, retry now. Stores are filled through the real engine; the state each control
leaves is read back with plain SQL and through ops (stats, show, audit)."""
from __future__ import annotations

import asyncio
import json

import pytest

from engine import flow, oke, on, ops, signal
from holdkit import one_message_held
from test_ops import by_signal, sql, sql_write


class Recorder:
    """A handler that records each payload's "n" and fails while `broken`."""

    def __init__(self, broken: bool = False) -> None:
        self.seen: list[int] = []
        self.broken = broken

    async def __call__(self, payload, fx) -> None:
        self.seen.append(payload["n"])
        if self.broken:
            raise RuntimeError(f"broken {payload['n']}")


def once_app(db_url: str, name: str = "c.jobs", retries: int = 0, broken: bool = False):
    """A once signal with one recording flow; the app's workers run only under drain()."""
    jobs = signal.once(name, retries=retries)
    handler = Recorder(broken)
    on(jobs)(flow(f"w.{name}", do=handler))
    return jobs, handler


async def statuses(store, *ids: str) -> list[str]:
    return [(await ops.show(store, i)).status for i in ids]


async def last_audit(store, action: str) -> ops.AuditEntry:
    return (await ops.audit(store, action=action))[0]


# ------------------------------------------------------------------------------------ pause / resume

async def test_paused_signal_is_not_claimed_emits_are_stored_and_resume_lets_it_go_on(db_url):
    jobs, handler = once_app(db_url)
    async with oke("t", database_url=db_url) as app:
        state = await ops.pause(app.store, "c.jobs", actor="ana", reason="smtp down")
        assert (state.paused, state.changed) == (True, True)
        ids = [await app.emit(jobs, {"n": n}) for n in range(3)]
        await asyncio.wait_for(app.drain(), 10)  # nothing claimable: the drain ends
        assert handler.seen == []
        assert await statuses(app.store, *ids) == ["pending"] * 3
        row = by_signal(await ops.stats(app.store))["c.jobs"]
        assert (row.paused, row.pending) == (True, 3)
        assert ops.to_json(row)["paused"] is True
        again = await ops.pause(app.store, "c.jobs", actor="ana")
        assert (again.paused, again.changed) == (True, False)
        entry = await last_audit(app.store, "pause")
        assert (entry.actor, entry.signal, entry.reason) == ("ana", "c.jobs", "smtp down")
        assert len(await ops.audit(app.store, action="pause")) == 1  # the no-op is not audited

        resumed = await ops.resume(app.store, "c.jobs", actor="bo")
        assert (resumed.paused, resumed.changed) == (False, True)
        await asyncio.wait_for(app.drain(), 10)
        assert sorted(handler.seen) == [0, 1, 2]
        assert by_signal(await ops.stats(app.store))["c.jobs"].paused is False
        assert (await last_audit(app.store, "resume")).actor == "bo"


async def test_a_pause_survives_a_restart(db_url):
    jobs, handler = once_app(db_url)
    async with oke("t", database_url=db_url) as app:
        await ops.pause(app.store, "c.jobs", actor="ana")
        await app.emit(jobs, {"n": 1})
    async with oke("t", database_url=db_url) as app:  # the boot upserts the signal: the pause stays
        await asyncio.wait_for(app.drain(), 10)
        assert handler.seen == []
        assert by_signal(await ops.stats(app.store))["c.jobs"].paused is True
        await ops.resume(app.store, "c.jobs", actor="ana")
        await asyncio.wait_for(app.drain(), 10)
        assert handler.seen == [1]


async def test_a_running_handler_finishes_when_its_signal_is_paused(db_url):
    async with one_message_held(db_url, "c.held") as (app, msg):
        await ops.pause(app.store, "c.held", actor="ana")
    async with oke("t2", database_url=db_url) as app:
        assert await statuses(app.store, msg) == ["delivered"]


async def test_a_live_signal_cannot_be_paused_and_an_unknown_one_is_named(db_url):
    signal.live("c.tape")
    async with oke("t", database_url=db_url) as app:
        with pytest.raises(ops.NotPausable, match='"c.tape" is live'):
            await ops.pause(app.store, "c.tape", actor="ana")
        with pytest.raises(ops.UnknownSignal, match='unknown signal "c.nope"'):
            await ops.pause(app.store, "c.nope", actor="ana")
        with pytest.raises(ops.UnknownSignal):
            await ops.resume(app.store, "c.nope", actor="ana")
        assert await sql(app.store, "SELECT count(*) FROM oke_pauses") == [(0,)]
        assert await ops.audit(app.store, action="pause") == []


# ------------------------------------------------------------------------------------------- cancel

async def test_cancel_ends_pending_messages_dead_and_asks_a_live_leases_holder_to_stop(db_url):
    async with one_message_held(db_url, "c.held") as (app, held):
        jobs = signal.once("c.more", retries=0)
        on(jobs)(flow("w.c.more", do=Recorder()))
        async with oke("t2", database_url=db_url) as other:
            due = await other.emit(jobs, {"n": 1})
            later = await other.emit(jobs, {"n": 2})
            lost = await other.emit(jobs, {"n": 3})
        await sql_write(
            app.store,
            f"UPDATE oke_messages SET run_at = 99999999999999 WHERE id = '{later}'",  # not yet due
            f"UPDATE oke_messages SET status = 'inflight', locked_by = 'gone', attempts = 2, "
            f"lease_expires_at = 1 WHERE id = '{lost}'",  # its worker died: the lease expired
        )
        done = await ops.cancel(app.store, "c.more", [due, later, lost], actor="ana", reason="bad batch")
        assert isinstance(done, ops.Cancelled)
        assert (done.cancelled, done.ids, done.skipped) == (3, [due, later, lost], [])

        nothing = await ops.cancel(app.store, "c.more", all=True, actor="ana", reason="x")
        assert (nothing.cancelled, nothing.skipped, nothing.requested) == (0, [], [])
        assert len(await ops.audit(app.store, action="cancel")) == 1  # a cancel that changed nothing is not audited
        assert await statuses(app.store, due, later, lost, held) == ["dead", "dead", "dead", "inflight"]
        failure = (await ops.show(app.store, lost)).failures[-1]
        assert (failure.code, failure.message, failure.attempt) == ("Cancelled", "bad batch", 2)
        counts = by_signal(await ops.stats(app.store))["c.more"]
        assert (counts.pending, counts.inflight, counts.dead) == (0, 0, 3)
        entry = await last_audit(app.store, "cancel")
        assert (entry.actor, entry.count, entry.ids, entry.reason) == ("ana", 3, [due, later, lost], "bad batch")

        replayed = await ops.replay(app.store, "c.more", [due], actor="ana")
        assert replayed.ids == [due] and await statuses(app.store, due) == ["pending"]

        asked = await ops.cancel(app.store, "c.held", [held], actor="ana", reason="x")
        assert (asked.cancelled, asked.skipped, asked.requested) == (0, [], [held])  # its handler is stopped
        assert len(await ops.audit(app.store, action="cancel")) == 2  # the request is audited too


async def test_cancel_all_of_a_key_and_its_dry_run(db_url):
    jobs, _ = once_app(db_url)
    async with oke("t", database_url=db_url) as app:
        keyed = [await app.emit(jobs, {"n": n}, key="k1") for n in range(3)]
        other = await app.emit(jobs, {"n": 9}, key="k2")
        preview = await ops.cancel(app.store, "c.jobs", all=True, key="k1", dry_run=True)
        assert isinstance(preview, ops.CancelPreview)
        assert (preview.cancelled, preview.would_cancel, preview.ids) == (0, 3, keyed)
        assert await statuses(app.store, *keyed) == ["pending"] * 3  # a dry run writes nothing
        assert await ops.audit(app.store, action="cancel") == []
        done = await ops.cancel(app.store, "c.jobs", all=True, key="k1", actor="ana", reason=None)
        assert (done.cancelled, done.ids) == (3, keyed)
        assert await statuses(app.store, *keyed, other) == ["dead", "dead", "dead", "pending"]
        assert (await ops.show(app.store, keyed[0])).failures[-1].message == "cancelled by ana"


async def test_cancel_with_an_unknown_id_changes_nothing(db_url):
    jobs, _ = once_app(db_url)
    async with oke("t", database_url=db_url) as app:
        msg = await app.emit(jobs, {"n": 1})
        with pytest.raises(ops.UnknownMessage, match="no-such-id"):
            await ops.cancel(app.store, "c.jobs", [msg, "no-such-id"], actor="ana")
        with pytest.raises(ValueError, match="name the messages to cancel"):
            await ops.cancel(app.store, "c.jobs", [], actor="ana")
        with pytest.raises(ValueError, match="not both"):
            await ops.cancel(app.store, "c.jobs", [msg], all=True, actor="ana")
        assert await statuses(app.store, msg) == ["pending"]


# ------------------------------------------------------------------------------------------- delete

async def test_delete_removes_finished_messages_only_and_counters_follow(db_url):
    jobs, handler = once_app(db_url, broken=True)
    async with oke("t", database_url=db_url) as app:
        dead = await app.emit(jobs, {"n": 1})
        await app.drain()
        handler.broken = False
        delivered = await app.emit(jobs, {"n": 2})
        await app.drain()
        pending = await app.emit(jobs, {"n": 3})
        done = await ops.delete(app.store, "c.jobs", [dead, delivered, pending], actor="ana")
        assert (done.deleted, done.ids, done.skipped) == (2, [dead, delivered], [ops.Skipped(pending, "pending")])
        assert await sql(app.store, "SELECT id FROM oke_messages WHERE signal = 'c.jobs'") == [(pending,)]
        assert await sql(app.store, f"SELECT count(*) FROM oke_failures WHERE message_id = '{dead}'") == [(0,)]
        counts = by_signal(await ops.stats(app.store))["c.jobs"]
        assert (counts.pending, counts.delivered, counts.dead) == (1, 0, 0)
        entry = await last_audit(app.store, "delete")
        assert (entry.count, entry.ids) == (2, [dead, delivered])
        with pytest.raises(ops.UnknownMessage):
            await ops.delete(app.store, "c.jobs", [dead], actor="ana")  # gone now


# -------------------------------------------------------------------------------------------- retry

async def test_retry_makes_a_waiting_message_due_now_and_skips_the_rest(db_url):
    jobs, handler = once_app(db_url, broken=True)
    async with oke("t", database_url=db_url) as app:
        dead = await app.emit(jobs, {"n": 1})
        await app.drain()
        waiting = await app.emit(jobs, {"n": 2})
        due = await app.emit(jobs, {"n": 3})
        await sql_write(app.store, f"UPDATE oke_messages SET run_at = 99999999999999 WHERE id = '{waiting}'")
        done = await ops.retry(app.store, "c.jobs", [waiting, due, dead], actor="ana")
        assert (done.retried, done.ids) == (1, [waiting])
        assert done.skipped == [ops.Skipped(due, "pending"), ops.Skipped(dead, "dead")]
        assert await sql(app.store, f"SELECT run_at, status FROM oke_messages WHERE id = '{waiting}'") == [
            (None, "pending")
        ]
        entry = await last_audit(app.store, "retry")
        assert (entry.actor, entry.ids) == ("ana", [waiting])
        assert json.loads(json.dumps(ops.to_json(done))) == {
            "retried": 1,
            "ids": [waiting],
            "skipped": [{"id": due, "status": "pending"}, {"id": dead, "status": "dead"}],
        }
