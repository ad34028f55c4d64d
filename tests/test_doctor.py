"""`okconsole doctor`: each check shown ok on a healthy store, and warn / fail on a store
made unhealthy in that one way, with a detail that names the command to run; exit 1 only on a fail.
SQLite and PostgreSQL; the console runs as the installed `okconsole`."""
from __future__ import annotations

import asyncio
import json
from typing import Any

from engine import flow, oke, ops, signal
from engine.flows import Binding
from engine.store.schema import SCHEMA_VERSION
from consolekit import run_okconsole, with_store
from workers.db import execute

CHECKS = ["schema", "search_index", "orphaned leases", "once signals with two flows", "inactive bindings", "paused signals",
          "due messages", "dead_letters", "failure_rate", "blocked_keys"]


async def _noop(payload: Any, fx: Any) -> None:
    return None


def doctor_json(url: str) -> tuple[int, dict[str, dict[str, str]]]:
    done = run_okconsole("--db", url, "doctor", "--json")
    assert done.stderr == "", done.stderr
    return done.returncode, {c["check"]: c for c in json.loads(done.stdout)}


def only_unhealthy(found: dict[str, dict[str, str]]) -> dict[str, str]:
    return {name: c["status"] for name, c in found.items() if c["status"] != "ok"}


async def test_a_healthy_store_passes_every_check_and_doctor_exits_0(db_url):
    jobs = signal.once("jobs")
    async with oke("shop", database_url=db_url, bindings=[Binding(jobs, flow("jobs.work", do=_noop))]) as app:
        await app.emit(jobs, {"n": 1})
        await app.drain()
    code, found = doctor_json(db_url)
    assert code == 0
    assert list(found) == CHECKS and only_unhealthy(found) == {}
    assert found["schema"]["detail"] == f"store schema version {SCHEMA_VERSION}, the version this okengine writes"

    text = run_okconsole("--db", db_url, "doctor")
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["Check", "Status", "Detail"]
    for name in CHECKS:
        [line] = [row for row in lines if row.startswith(name + "  ")]
        assert line[len(name):].split()[0] == "ok"


async def test_a_lease_whose_holder_is_gone_is_a_warning_naming_the_holder_and_the_commands(db_url):
    jobs = signal.once("jobs")
    async with oke("shop", database_url=db_url, bindings=[Binding(jobs, flow("jobs.work", do=_noop))]) as app:
        msg = await app.emit(jobs, {"n": 1})
        await app.store.claim(["jobs"], "ghost-3", 600_000, 1)  # a holder that never recorded itself
    code, found = doctor_json(db_url)
    assert code == 0  # a warning: the lease expires and the message runs again by itself
    assert only_unhealthy(found) == {"orphaned leases": "warn"}
    detail = found["orphaned leases"]["detail"]
    assert detail.startswith("1 message(s) held by workers not seen for 30 s: ghost-3 (unknown, 1 held).")
    assert "okconsole workers" in detail and f"okconsole show {msg}" in detail


async def test_a_once_signal_bound_to_two_flows_fails_with_oke1071_and_the_unbind_to_run(db_url):
    orders = signal.once("orders")
    for name in ("orders.charge", "orders.ship"):
        async with oke(name, database_url=db_url, bindings=[Binding(orders, flow(name, do=_noop))]):
            pass
    code, found = doctor_json(db_url)
    assert code == 1
    assert only_unhealthy(found) == {"once signals with two flows": "fail"}
    detail = found["once signals with two flows"]["detail"]
    assert detail.startswith('OKE1071: Once signal "orders" is bound to more than one Flow (orders.charge, orders.ship).')
    assert "okconsole unbind orders orders.ship" in detail and "signal.broadcast" in detail
    text = run_okconsole("--db", db_url, "doctor")
    assert text.returncode == 1
    [line] = [row for row in text.stdout.splitlines() if row.startswith("once signals with two flows")]
    assert " fail " in line


async def test_an_inactive_binding_still_holding_pending_copies_is_a_warning(db_url):
    news = signal.broadcast("news")
    bindings = [Binding(news, flow("news.mail", do=_noop))]
    async with oke("mailer", database_url=db_url, bindings=bindings, binding_ttl="2s") as app:
        await app.emit(news, {"n": 1})  # a copy for news.mail, which then runs no more
        await app.emit(news, {"n": 2})
        [inactive] = [c for c in await ops.doctor(app.store) if c.check == "inactive bindings"]
        assert inactive.status == "ok"  # still active: a worker may come back within its ttl
    await asyncio.sleep(2.2)
    code, found = doctor_json(db_url)
    assert code == 0 and only_unhealthy(found) == {"inactive bindings": "warn"}
    detail = found["inactive bindings"]["detail"]
    assert detail.startswith("news → news.mail: 2 pending.")
    assert "okconsole unbind news news.mail" in detail


async def test_a_paused_signal_is_a_warning_naming_who_and_why_and_the_resume(db_url):
    jobs = signal.once("jobs")
    async with oke("shop", database_url=db_url, bindings=[Binding(jobs, flow("jobs.work", do=_noop))]):
        pass
    await execute(db_url, "INSERT INTO oke_pauses (signal, paused_at, actor, reason) "
                          "VALUES ('jobs', 1, 'ana', 'smtp down')")
    code, found = doctor_json(db_url)
    assert code == 0 and only_unhealthy(found) == {"paused signals": "warn"}
    assert found["paused signals"]["detail"].startswith("jobs (by ana: smtp down): their messages are stored")
    assert "okconsole resume jobs" in found["paused signals"]["detail"]


async def test_due_messages_waiting_longer_than_the_window_are_a_warning_and_not_yet_due_ones_are_not(db_url):
    jobs = signal.once("jobs")
    later = signal.once("later")
    bindings = [Binding(jobs, flow("jobs.work", do=_noop)), Binding(later, flow("later.work", do=_noop))]
    async with oke("shop", database_url=db_url, bindings=bindings) as app:
        for n in range(3):
            await app.emit(jobs, {"n": n})
        not_due = await app.emit(later, {"n": 0})
        await execute(db_url, "UPDATE oke_messages SET run_at = created_at + 3600000 WHERE id = $1", not_due)
        await asyncio.sleep(0.5)
        [due] = [c for c in await ops.doctor(app.store, due_after_ms=300) if c.check == "due messages"]
        assert due.status == "warn"
        assert due.detail.startswith("jobs: oldest due 0 s ago, 3 pending.")  # `later` is not due yet
        assert "okconsole failures jobs" in due.detail and "okconsole workers" in due.detail
        [default] = [c for c in await ops.doctor(app.store) if c.check == "due messages"]
        assert default.status == "ok"  # 0.5 s is not 5 minutes
    # as a store 6 minutes on would hold it: the CLI's 5-minute window sees them
    await execute(db_url, "UPDATE oke_messages SET created_at = created_at - 360000 WHERE signal = 'jobs'")
    code, found = doctor_json(db_url)
    assert code == 0 and only_unhealthy(found) == {"due messages": "warn"}
    assert found["due messages"]["detail"].startswith("jobs: oldest due 6 min ago, 3 pending.")


async def test_a_store_with_a_newer_schema_fails_the_schema_check_and_exits_1(db_url):
    async with oke("shop", database_url=db_url, bindings=[]):
        pass
    await execute(db_url, "UPDATE oke_meta SET value = '99' WHERE key = 'schema_version'")
    done = run_okconsole("--db", db_url, "doctor", "--json")
    assert done.returncode == 1, done.stderr
    [check] = json.loads(done.stdout)
    assert (check["check"], check["status"]) == ("schema", "fail")
    assert f"the store's schema is version 99; this okengine knows up to {SCHEMA_VERSION}" in check["detail"]
    assert "pip install -U okengine" in check["detail"]
    text = run_okconsole("--db", db_url, "doctor")
    assert text.returncode == 1
    assert text.stdout.splitlines()[1].split()[:2] == ["schema", "fail"]


async def test_doctor_reads_the_same_as_ops(db_url):
    """The command prints what `ops.doctor` returns (one source for the CLI and scripts)."""
    async with oke("shop", database_url=db_url, bindings=[]):
        pass
    _code, found = doctor_json(db_url)
    direct = await with_store(db_url, ops.doctor)
    assert [ops.to_json(c) for c in direct] == list(found.values())


class Bounced(Exception):
    code = "BOUNCED"


async def test_dead_letters_piling_up_warn_with_count_rate_and_top_code_and_a_high_failure_rate(db_url):
    """Five of eight messages end dead in the last minutes: doctor no longer says all is well."""
    jobs = signal.once("jobs", retries=0)

    async def bounce(payload: Any, fx: Any) -> None:
        if payload["n"] < 5:
            raise Bounced(f"mailbox {payload['n']} full")

    async with oke("shop", database_url=db_url, bindings=[Binding(jobs, flow("jobs.work", do=bounce))]) as app:
        for n in range(8):
            await app.emit(jobs, {"n": n})
        await app.drain()
    code, found = doctor_json(db_url)
    assert code == 0  # warnings: work still flows
    assert only_unhealthy(found) == {"dead_letters": "warn", "failure_rate": "warn"}
    dead = found["dead_letters"]["detail"]
    assert dead.startswith("jobs: 5 new in 15 min (0.3/min), top code BOUNCED."), dead
    assert "okconsole failures jobs" in dead
    assert found["failure_rate"]["detail"].startswith("jobs: 62% of 8 attempts failed in the last 5 min.")
    text = run_okconsole("--db", db_url, "doctor")
    [line] = [row for row in text.stdout.splitlines() if row.startswith("dead_letters")]
    assert line.split()[1] == "warn"


async def test_a_key_waiting_behind_a_head_that_failed_three_times_is_a_warning(db_url):
    """The head of key k1 failed three attempts and runs a fourth while two messages wait behind it."""
    jobs = signal.once("jobs", retries=5)
    tries: list[int] = []
    fourth, release = asyncio.Event(), asyncio.Event()

    async def stubborn(payload: Any, fx: Any) -> None:
        if payload["n"] != 0:
            return
        tries.append(1)
        if len(tries) == 4:
            fourth.set()
            await release.wait()
        raise Bounced("still full")

    async with oke("shop", database_url=db_url, bindings=[Binding(jobs, flow("jobs.work", do=stubborn))]) as app:
        head = await app.emit(jobs, {"n": 0}, key="k1")
        for n in (1, 2):
            await app.emit(jobs, {"n": n}, key="k1")
        await app.emit(jobs, {"n": 3}, key="k2")
        draining = asyncio.create_task(app.drain())
        await asyncio.wait_for(fourth.wait(), 60)
        code, found = await asyncio.to_thread(doctor_json, db_url)
        release.set()
        await asyncio.wait_for(draining, 60)
    assert code == 0 and found["blocked_keys"]["status"] == "warn"
    detail = found["blocked_keys"]["detail"]
    assert detail.startswith(f"jobs key 'k1': head {head} failed 3 attempts, 2 waiting."), detail
    assert f"okconsole show {head}" in detail and f"okconsole cancel jobs {head}" in detail
    code, found = doctor_json(db_url)  # the head ended dead: the key moved on
    assert found["blocked_keys"]["status"] == "ok"
