"""Workers: every running pool records itself in oke_workers at start and every beat, a
lease whose holder is gone is `orphaned` (in `show`, `workers`, the TUI), rows gone for an hour are
removed; on SQLite and PostgreSQL.

The killed worker is a real process (tests/workers/once_worker.py) SIGKILLed while its handler
holds a lease. The orphan window is passed as `orphan_after_ms` rather than waited out for 30 s;
where the CLI (which uses the 30 s default) must see it, the dead worker's last beat is moved back
in the store, which is what 30 s of silence would leave there.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal as os_signal
import socket
from typing import Any

import pytest

from engine import flow, oke, ops, signal
from engine.flows import Binding
from okconsole.app import ConsoleApp
from okconsole.screens.detail import DetailScreen
from okconsole.screens.workers import WorkersScreen
from consolekit import run_okconsole, wait_for, with_store
from prockit import until, worker_procs
from screenkit import screen_lines, screen_text
from workers.db import execute, fetch

HOUR_MS = 3_600_000


@pytest.fixture
def procs(tmp_path):
    yield from worker_procs(tmp_path)


async def _worker_rows(url: str) -> list[tuple]:
    return await fetch(url, "SELECT worker_id, app, host, pid, concurrency, held, last_seen, stopped_at "
                            "FROM oke_workers ORDER BY worker_id")


async def _noop(payload: Any, fx: Any) -> None:
    return None


def _by_id(found: list[ops.WorkerInfo]) -> dict[str, ops.WorkerInfo]:
    return {w.worker_id: w for w in found}


# ------------------------------------------------------------------ a running app records itself

async def test_a_running_app_is_recorded_before_it_claims_beats_with_its_held_count_and_stops(db_url):
    jobs = signal.once("jobs", retries=0)
    started, release = asyncio.Event(), asyncio.Event()
    seen_at_first_claim: list[list[tuple]] = []

    async def hold(payload: Any, fx: Any) -> None:
        seen_at_first_claim.append(await _worker_rows(db_url))
        started.set()
        await release.wait()

    app = oke("shop", database_url=db_url, worker_id="w-1", worker_heartbeat_s=0.2,
              bindings=[Binding(jobs, flow("jobs.hold", do=hold))])
    async with app:
        await app.emit(jobs, {"n": 1})
        runner = asyncio.create_task(app.run(concurrency=3))
        await asyncio.wait_for(started.wait(), 20)
        [row] = seen_at_first_claim[0]  # written before the pool's first claim
        assert row[:5] == ("w-1", "shop", socket.gethostname(), os.getpid(), 3)
        assert row[7] is None

        async def beat_with_the_lease():
            [(_id, *_rest, held, last_seen, _stopped)] = await _worker_rows(db_url)
            return held == 1 and last_seen > row[6]

        await until(beat_with_the_lease, "a beat that reports the held lease", timeout=10)
        first = (await _worker_rows(db_url))[0][6]
        await asyncio.sleep(0.6)
        assert (await _worker_rows(db_url))[0][6] > first, "last_seen advances at every beat"

        [w] = await ops.workers(app.store)
        assert (w.state, w.held, w.leases, w.orphaned) == ("running", 1, 1, 0)
        release.set()
        await app.stop()
        await asyncio.wait_for(runner, 20)
        [(*_head, held, last_seen, stopped_at)] = await _worker_rows(db_url)
        assert stopped_at is not None and stopped_at == last_seen and held == 0
        [w] = await ops.workers(app.store)
        assert (w.state, w.leases, w.orphaned) == ("stopped", 0, 0)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (6, ValueError), (-1, ValueError), ("5", TypeError),
                                        (True, TypeError), (None, TypeError)])
def test_the_heartbeat_interval_is_checked(bad, error):
    with pytest.raises(error, match=r"oke\(worker_heartbeat_s=\.\.\.\)"):
        oke("t", worker_heartbeat_s=bad)
    assert oke("t").worker_heartbeat_s == 5.0


# ------------------------------------------------------------------ SIGKILL: the lease is orphaned

async def test_a_sigkilled_worker_holding_a_lease_shows_orphaned_in_ops_show_and_workers(db_url, procs):
    victim = signal.once("victim", retries=3)
    procs.start("crash", "A", db_url, lease_ms=600_000, heartbeat_s=0.2)  # a lease that outlives the test
    await procs.ready("A")
    async with oke("emitter", database_url=db_url, bindings=[]) as app:
        msg_id = await app.emit(victim, {"order": 1})
        store = app.store

        async def held_by_a():
            return (await ops.show(store, msg_id)).lease.locked_by == "A"

        await until(held_by_a, "worker A to take the message")
        assert (await ops.show(store, msg_id, orphan_after_ms=1500)).lease.orphaned is False
        assert _by_id(await ops.workers(store, orphan_after_ms=1500))["A"].orphaned == 0

        procs.procs["A"].send_signal(os_signal.SIGKILL)
        assert procs.procs["A"].wait(10) == -os_signal.SIGKILL

        async def orphaned():
            return (await ops.show(store, msg_id, orphan_after_ms=1500)).lease.orphaned

        await until(orphaned, "the lease to be orphaned 1.5 s after A's last beat", timeout=20)
        a = _by_id(await ops.workers(store, orphan_after_ms=1500))["A"]
        assert (a.state, a.leases, a.orphaned) == ("lost", 1, 1)
        detail = await ops.show(store, msg_id)
        assert detail.lease.orphaned is False and detail.lease.reclaimable is False  # 30 s not over yet

    # 30 s of silence, as the store would hold it: the CLI's default window now sees it
    await execute(db_url, "UPDATE oke_workers SET last_seen = last_seen - 31000 WHERE worker_id = 'A'")
    shown = run_okconsole("--db", db_url, "show", msg_id, "--json")
    assert shown.returncode == 0, shown.stderr
    lease = json.loads(shown.stdout)["lease"]
    assert (lease["locked_by"], lease["orphaned"], lease["reclaimable"]) == ("A", True, False)
    text = run_okconsole("--db", db_url, "show", msg_id)
    assert "orphaned       yes: its holder has not been seen for 30 s (stuck, not slow" in text.stdout

    listed = run_okconsole("--db", db_url, "workers", "--json")
    assert listed.returncode == 0, listed.stderr
    [a_json] = [w for w in json.loads(listed.stdout) if w["worker_id"] == "A"]
    assert (a_json["state"], a_json["leases"], a_json["orphaned"], a_json["host"]) == ("lost", 1, 1,
                                                                                       socket.gethostname())
    table = run_okconsole("--db", db_url, "workers").stdout.splitlines()
    assert table[0].split()[:5] == ["Worker", "State", "Leased", "now", "Orphaned"]
    [a_line] = [line for line in table if line.startswith("A ")]
    assert " lost " in a_line and "⚠ 1 orphaned" in a_line


async def test_a_live_holder_is_not_orphaned_and_a_holder_with_no_record_is(db_url):
    jobs = signal.once("jobs", retries=0)
    started, release = asyncio.Event(), asyncio.Event()

    async def hold(payload: Any, fx: Any) -> None:
        started.set()
        await release.wait()

    app = oke("shop", database_url=db_url, worker_id="alive", bindings=[Binding(jobs, flow("jobs.hold", do=hold))])
    async with app:
        held_id = await app.emit(jobs, {"n": 1})
        runner = asyncio.create_task(app.run(concurrency=1))
        await asyncio.wait_for(started.wait(), 20)
        ghost_id = await app.emit(jobs, {"n": 2})
        [claimed] = await app.store.claim(["jobs"], "ghost", 600_000, 1)  # a claim by a process never recorded
        assert claimed.id == ghost_id
        assert (await ops.show(app.store, held_id)).lease.orphaned is False
        assert (await ops.show(app.store, ghost_id)).lease.orphaned is True
        found = _by_id(await ops.workers(app.store))
        assert (found["alive"].state, found["alive"].orphaned) == ("running", 0)
        ghost = found["ghost"]
        assert (ghost.state, ghost.leases, ghost.orphaned, ghost.host, ghost.last_seen) == ("unknown", 1, 1,
                                                                                            None, None)
        release.set()
        await app.stop()
        await asyncio.wait_for(runner, 20)


# ------------------------------------------------------------------ forgotten after an hour

async def test_workers_gone_for_an_hour_are_removed_by_any_beat_and_not_listed(db_url):
    jobs = signal.once("jobs", retries=0)
    bindings = [Binding(jobs, flow("jobs.noop", do=_noop))]
    for name in ("old", "recent"):
        async with oke("shop", database_url=db_url, worker_id=name, bindings=bindings) as app:
            await app.drain()
    await execute(db_url, f"UPDATE oke_workers SET last_seen = last_seen - {HOUR_MS + 1000} "
                          "WHERE worker_id = 'old'")
    await execute(db_url, f"UPDATE oke_workers SET last_seen = last_seen - {HOUR_MS - 60_000} "
                          "WHERE worker_id = 'recent'")
    listed = json.loads(run_okconsole("--db", db_url, "workers", "--json").stdout)
    assert [w["worker_id"] for w in listed] == ["recent"]  # seen in the last hour only
    assert [r[0] for r in await _worker_rows(db_url)] == ["old", "recent"]  # nobody beat since

    async with oke("shop", database_url=db_url, worker_id="new", bindings=bindings) as app:
        await app.drain()  # its first beat removes the row gone for an hour
    assert [r[0] for r in await _worker_rows(db_url)] == ["new", "recent"]


# ------------------------------------------------------------------ the TUI

async def test_the_workers_screen_lists_workers_and_marks_orphaned_leases(db_url):
    jobs = signal.once("jobs", retries=0)
    bindings = [Binding(jobs, flow("jobs.noop", do=_noop))]
    async with oke("shop", database_url=db_url, worker_id="shop-1", bindings=bindings) as app:
        await app.drain()
        ghost_id = await app.emit(jobs, {"n": 1})
        await app.store.claim(["jobs"], "gone-7", 600_000, 1)

    console = ConsoleApp(db_url, refresh_s=0.2)
    async with console.run_test(size=(160, 40)) as pilot:
        assert "workers" in console.jump_choices()
        console.jump("workers")
        await wait_for(pilot, lambda: isinstance(console.screen, WorkersScreen)
                       and console.screen.query_one("#workers").row_count == 2)
        await wait_for(pilot, lambda: "⚠ 1 orphaned" in screen_text(console))
        await pilot.pause(0.3)  # the table sizes its columns to the new rows on its next refresh
        lines = screen_lines(console)
        header = next(line for line in lines if line.lstrip().startswith("Worker"))
        assert header.split()[:5] == ["Worker", "State", "Leased", "now", "Orphaned"]
        [shop] = [line for line in lines if line.lstrip().startswith("shop-1")]
        [gone] = [line for line in lines if line.lstrip().startswith("gone-7")]
        assert "stopped" in shop and "orphaned" not in shop
        assert "unknown" in gone and "⚠ 1 orphaned" in gone and "never recorded" in gone
        assert "⚠ 1 orphaned: held by workers not seen for 30 s" in screen_text(console)

        console.jump(f"show {ghost_id}")
        await wait_for(pilot, lambda: isinstance(console.screen, DetailScreen) and console.screen.detail is not None)
        await wait_for(pilot, lambda: "⚠ orphaned" in screen_text(console))
        assert "lease: held by gone-7" in screen_text(console)


async def test_the_workers_screen_says_when_no_worker_was_seen(sqlite_url):
    async with oke("empty", database_url=sqlite_url, bindings=[]):
        pass
    console = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with console.run_test(size=(120, 30)) as pilot:
        console.jump("workers")
        await wait_for(pilot, lambda: "0 running of 0 seen in the last hour" in screen_text(console))
    assert run_okconsole("--db", sqlite_url, "workers").stdout.startswith("No worker seen in the last hour")
    assert json.loads(run_okconsole("--db", sqlite_url, "workers", "--json").stdout) == []
