"""`ops.why` and `ops.keys` read from a real store (a SQLite file and PostgreSQL): each verdict from the
state a real app leaves, and the keys board with its heads, failures, waiting counts and pages."""

from __future__ import annotations

import re
from typing import Any

import pytest
from workers.db import execute

from engine import flow, oke, ops, signal
from engine.flows import Binding
from engine.store import workers as worker_rows


async def _noop(payload: Any, fx: Any) -> None:
    return None


def shop(db_url: str, *signals: Any):
    """An app bound to each signal (recorded now: a process bound to them was just seen); no workers run."""
    return oke("shop", database_url=db_url, bindings=[Binding(s, flow(f"{s.name}.work", do=_noop)) for s in signals])


async def fail_once(db_url: str, message_id: str, code: str = "TimeoutError", text: str = "smtp silent") -> None:
    """As a failed attempt leaves a message: attempts counted up, a failure row, back to pending."""
    await execute(db_url, "UPDATE oke_messages SET attempts = attempts + 1 WHERE id = $1", message_id)
    await execute(
        db_url,
        "INSERT INTO oke_failures (message_id, attempt, code, message, at, kind) VALUES ($1, 1, $2, $3, 1, 'failure')",
        message_id,
        code,
        text,
    )


async def test_due_delivered_and_dead_and_cancelled(db_url):
    jobs = signal.once("jobs", retries=0)
    async with shop(db_url, jobs) as app:
        due = await app.emit(jobs, {"n": 1})
        why = await ops.why(app.store, due)
        assert (why.id, why.signal, why.status, why.verdict) == (due, "jobs", "pending", "due")
        assert why.detail.endswith("waiting for a free worker")
        await app.drain()
        assert (await ops.why(app.store, due)).verdict == "delivered"
        cancelled = await app.emit(jobs, {"n": 2})
        await ops.cancel(app.store, "jobs", [cancelled], reason="duplicate")
        why = await ops.why(app.store, cancelled)
        assert (why.status, why.verdict) == ("dead", "dead")
        assert why.detail.startswith("cancelled by an operator (duplicate)")


async def test_not_due_paused_and_no_worker(db_url):
    jobs = signal.once("jobs")
    async with shop(db_url, jobs) as app:
        later = await app.emit(jobs, {"n": 1}, delay="1h")
        assert (await ops.why(app.store, later)).verdict == "not_due"
        await ops.pause(app.store, "jobs", reason="smtp down", actor="ana")
        why = await ops.why(app.store, later)
        assert why.verdict == "paused"
        assert why.detail.startswith("signal jobs paused by ana: smtp down") and why.detail.endswith("(also: not_due)")
    await execute(db_url, "UPDATE oke_bindings SET last_seen = last_seen - 600000")  # its process gone 10 min
    async with oke("emitter", database_url=db_url) as app:
        await ops.resume(app.store, "jobs")
        why = await ops.why(app.store, later)
        assert why.verdict == "no_worker"
        assert "(last seen 10 min" in why.detail


async def test_a_message_of_a_signal_nobody_binds_is_no_worker(db_url):
    lonely = signal.once("lonely", optional=True)
    async with oke("emitter", database_url=db_url) as app:
        msg = await app.emit(lonely, {"n": 1})
        why = await ops.why(app.store, msg)
        assert why.verdict == "no_worker" and "no process bound to it was ever recorded" in why.detail


async def test_running_and_orphaned_name_the_holder(db_url):
    jobs = signal.once("jobs")
    async with shop(db_url, jobs) as app:
        held = await app.emit(jobs, {"n": 1})
        start = {"app": "shop", "host": "box", "pid": 42, "concurrency": 1}
        await app.store.write(lambda conn: worker_rows.beat(conn, "w-3", 1, start=start))
        await app.store.claim(["jobs"], "w-3", 600_000, 1)
        why = await ops.why(app.store, held)
        assert why.verdict == "running"
        assert why.detail.startswith("held by worker w-3 (box:42), seen ")
        await execute(db_url, "UPDATE oke_workers SET last_seen = last_seen - 45000")
        why = await ops.why(app.store, held)
        assert why.verdict == "orphaned" and "reclaimable at " in why.detail
        assert why.since is not None


async def test_blocked_by_key_names_the_head_and_its_last_failure(db_url):
    jobs = signal.once("jobs")
    async with shop(db_url, jobs) as app:
        head = await app.emit(jobs, {"n": 0}, key="k1")
        behind = await app.emit(jobs, {"n": 1}, key="k1")
        await fail_once(db_url, head)
        why = await ops.why(app.store, behind)
        assert why.verdict == "blocked_by_key"
        assert why.detail.startswith(
            f"waits behind {head} (pending, 1 failed attempt, last: TimeoutError: smtp silent)"
        )
        assert (await ops.why(app.store, head)).verdict == "due"


@pytest.mark.parametrize("bad", ["msg_01nosuchmessage", "42", "show me"])
async def test_an_unknown_or_malformed_id_says_what_ids_look_like(db_url, bad):
    async with oke("emitter", database_url=db_url) as app:
        with pytest.raises(ops.UnknownMessage, match=rf"{re.escape(bad)}.*ids look like msg_"):
            await ops.why(app.store, bad)


async def test_keys_lists_each_head_with_its_failures_and_waiting_and_blocked_keeps_failed_heads(db_url):
    jobs = signal.once("jobs")
    async with shop(db_url, jobs) as app:
        heads = {}
        for key, n in (("a", 3), ("b", 1), ("c", 2)):
            for i in range(n):
                msg = await app.emit(jobs, {"i": i}, key=key)
                heads.setdefault(key, msg)
        await app.emit(jobs, {"unkeyed": True})
        await fail_once(db_url, heads["a"], "Boom", "it broke")
        await fail_once(db_url, heads["b"])  # failed, but nothing waits behind it
        page = await ops.keys(app.store, "jobs")
        assert [(k.key, k.head_id, k.head_status, k.head_attempts, k.waiting) for k in page.items] == [
            ("a", heads["a"], "pending", 1, 2),
            ("b", heads["b"], "pending", 1, 0),
            ("c", heads["c"], "pending", 0, 1),
        ]
        assert page.items[0].head_last_failure.code == "Boom" and page.items[2].head_last_failure is None
        assert page.next_after is None
        blocked = await ops.keys(app.store, "jobs", blocked_only=True)
        assert [k.key for k in blocked.items] == ["a"]


async def test_keys_pages_by_limit_and_says_there_are_more(db_url):
    jobs = signal.once("jobs")
    async with shop(db_url, jobs) as app:
        for n in range(7):
            await app.emit(jobs, {"n": n}, key=f"k{n}")
        seen, after = [], None
        while True:
            page = await ops.keys(app.store, "jobs", limit=3, after=after)
            seen.append([k.key for k in page.items])
            after = page.next_after
            if after is None:
                break
        assert seen == [["k0", "k1", "k2"], ["k3", "k4", "k5"], ["k6"]]
        with pytest.raises(ops.UnknownSignal, match="known signals: jobs"):
            await ops.keys(app.store, "nope")
        with pytest.raises(ValueError, match="not a keys cursor"):
            await ops.keys(app.store, "jobs", after="%%%")
        with pytest.raises(ValueError, match="limit must be"):
            await ops.keys(app.store, "jobs", limit=0)


async def test_keys_of_a_broadcast_signal_list_each_flows_copy_head(db_url):
    news = signal.broadcast("news")
    bindings = [Binding(news, flow("news.mail", do=_noop)), Binding(news, flow("news.sms", do=_noop))]
    async with oke("shop", database_url=db_url, bindings=bindings) as app:
        await app.emit(news, {"n": 0}, key="k")
        await app.emit(news, {"n": 1}, key="k")
        page = await ops.keys(app.store, "news")
        assert [(k.key, k.flow, k.waiting) for k in page.items] == [("k", "news.mail", 1), ("k", "news.sms", 1)]
