"""Time and order options: delay / at, priority, dedupe and back-off, on SQLite and
PostgreSQL. Real apps on real databases; every assertion reads the stored rows or what handlers saw.
What the claim alone promises (priority order, not before run_at, dedupe) is in tests/conformance/.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import flow, oke, on, signal
from engine.ids import now_ms
from workers.db import fetch, is_sqlite, scalar

REPO = Path(__file__).resolve().parents[1]
EMITTER = Path(__file__).resolve().parent / "workers" / "dedupe_emitter.py"


async def store_clock_ms(url: str) -> int:
    """Now by the clock the claim judges run_at by: PostgreSQL's own, or this machine's."""
    if is_sqlite(url):
        return now_ms()
    return int(await scalar(url, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"))


async def _message(url: str, msg_id: str) -> dict:
    names = ("status", "attempts", "run_at", "priority", "dedupe", "created_at")
    [row] = await fetch(url, f"SELECT {', '.join(names)} FROM oke_messages WHERE id = $1", msg_id)
    return dict(zip(names, row))


async def _until(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


# --------------------------------------------------------------------------- delay and at


async def test_a_delayed_message_is_pending_with_run_at_and_never_starts_before_it(db_url):
    jobs = signal.once("jobs")
    started: dict[str, int] = {}

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        started[fx.message_id] = await store_clock_ms(db_url)

    async with oke("t", database_url=db_url) as app:
        before = await store_clock_ms(db_url)
        msg_id = await app.emit(jobs, {"n": 1}, delay="400ms")
        after = await store_clock_ms(db_url)
        row = await _message(db_url, msg_id)
        assert row["status"] == "pending"
        assert before + 400 <= row["run_at"] <= after + 400
        await app.drain()  # nothing is due: the drain ends without running it
        assert started == {}
        running = asyncio.create_task(app.run())
        await _until(lambda: asyncio.sleep(0, msg_id in started), "the delayed message to run")
        await app.stop()
        await asyncio.wait_for(running, 20)
    assert started[msg_id] >= row["run_at"]
    assert (await _message(db_url, msg_id))["status"] == "delivered"


@pytest.mark.parametrize("delay", [0, 0.25, datetime.timedelta(milliseconds=250), "250ms"])
async def test_delay_is_a_duration_string_a_timedelta_or_seconds(db_url, delay):
    jobs = signal.once("jobs", optional=True)
    async with oke("t", database_url=db_url) as app:
        before = await store_clock_ms(db_url)
        row = await _message(db_url, await app.emit(jobs, delay=delay))
        after = await store_clock_ms(db_url)
    expected = 0 if delay == 0 else 250
    assert before + expected <= row["run_at"] <= after + expected


async def test_at_is_an_aware_datetime_or_epoch_ms_and_a_past_at_is_due_at_once(db_url):
    jobs = signal.once("jobs")
    handled: list[str] = []

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        handled.append(fx.message_id)

    when = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))
    async with oke("t", database_url=db_url) as app:
        future = await app.emit(jobs, at=when)
        past = await app.emit(jobs, at=now_ms() - 60_000)
        await app.drain()
    assert (await _message(db_url, future))["run_at"] == int(when.timestamp() * 1000)
    assert handled == [past]
    assert (await _message(db_url, future))["status"] == "pending"


async def test_a_later_message_of_a_key_waits_behind_a_delayed_head(db_url):
    jobs = signal.once("jobs")
    order: list[str] = []

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        order.append(payload["n"])

    async with oke("t", database_url=db_url) as app:
        await app.emit(jobs, {"n": "first"}, key="k", delay="300ms")
        await app.emit(jobs, {"n": "second"}, key="k")
        await app.emit(jobs, {"n": "other key"}, key="j")
        await app.drain()
        assert order == ["other key"]  # "second" is held back by its key's head
        running = asyncio.create_task(app.run())
        await _until(lambda: asyncio.sleep(0, len(order) == 3), "the key's messages to run")
        await app.stop()
        await asyncio.wait_for(running, 20)
    assert order == ["other key", "first", "second"]


async def test_an_idle_worker_wakes_when_the_earliest_delayed_message_is_due(db_url):
    """The idle poll is 1 s; a 150 ms delay emitted to an idle worker starts well before that."""
    jobs = signal.once("jobs")
    started: dict[str, int] = {}

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        started[fx.message_id] = await store_clock_ms(db_url)

    async with oke("t", database_url=db_url) as app:
        running = asyncio.create_task(app.run())
        await asyncio.sleep(0.3)  # the worker is idle, waiting
        msg_id = await app.emit(jobs, delay="150ms")
        run_at = (await _message(db_url, msg_id))["run_at"]
        await _until(lambda: asyncio.sleep(0, msg_id in started), "the delayed message to run")
        await app.stop()
        await asyncio.wait_for(running, 20)
    assert run_at <= started[msg_id] < run_at + 600, started[msg_id] - run_at


# --------------------------------------------------------------------------- dedupe across processes


async def test_concurrent_dedupe_emits_from_four_processes_store_exactly_one(db_url, tmp_path):
    async with oke("setup", database_url=db_url):
        pass  # the schema exists before the emitters race
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [
        subprocess.Popen(
            [sys.executable, str(EMITTER), "--url", db_url, "--dir", str(tmp_path), "--id", str(i), "--emits", "25"],
            env=env,
            cwd=str(REPO),
        )
        for i in range(4)
    ]
    try:
        await _until(lambda: asyncio.sleep(0, all((tmp_path / f"ready-{i}").exists() for i in range(4))), "boot", 60)
        (tmp_path / "go").touch()
        for proc in procs:
            assert await asyncio.to_thread(proc.wait, 60) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    ids = {line for i in range(4) for line in (tmp_path / f"ids-{i}").read_text().split()}
    rows = await fetch(db_url, "SELECT id FROM oke_messages WHERE dedupe = 'report:1'")
    assert len(rows) == 1
    assert ids == {rows[0][0]}


# --------------------------------------------------------------------------- back-off


async def test_backoff_makes_each_retry_wait_initial_times_two_to_the_n_capped_by_max(db_url):
    jobs = signal.once("jobs", retries=3, backoff={"initial": "100ms", "max": "250ms"})
    starts: list[int] = []

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        starts.append(await store_clock_ms(db_url))
        raise RuntimeError(f"attempt {fx.attempt}")

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs)
        running = asyncio.create_task(app.run())

        async def dead() -> bool:
            return (await _message(db_url, msg_id))["status"] == "dead"

        await _until(dead, "the message to end dead")
        await app.stop()
        await asyncio.wait_for(running, 20)
    failed = [r[0] for r in await fetch(db_url, "SELECT at FROM oke_failures WHERE message_id = $1 ORDER BY id", msg_id)]
    assert len(starts) == 4 and len(failed) == 4
    for n, expected in ((1, 100), (2, 200), (3, 250)):
        waited = starts[n] - starts[n - 1]
        assert waited >= expected, (n, waited)
        assert waited < expected * 1.1 + 700, (n, waited)  # + the handler and a claim on a busy machine


async def test_a_pending_back_off_shows_its_next_attempt_time_in_run_at(db_url):
    jobs = signal.once("jobs", retries=1, backoff={"initial": "1h", "max": "2h"})

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        raise RuntimeError("down")

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs)
        before = await store_clock_ms(db_url)
        await app.drain()  # one attempt; the retry is an hour away
        after = await store_clock_ms(db_url)
    row = await _message(db_url, msg_id)
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert before + 3_600_000 <= row["run_at"] <= after + 3_960_000


async def test_without_backoff_a_failed_delayed_message_is_due_again_at_once(db_url):
    jobs = signal.once("jobs", retries=1)
    attempts: list[int] = []

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        attempts.append(fx.attempt)
        raise RuntimeError("no")

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs, at=now_ms() - 1)
        await app.drain()
    assert attempts == [1, 2]
    assert (await _message(db_url, msg_id))["status"] == "dead"


# --------------------------------------------------------------------------- bad input


NAIVE = datetime.datetime(2030, 1, 1)


class _Uncomparable:
    """A priority whose == raises, as an array's truth value does: checked by type before value."""

    def __eq__(self, other):
        raise RuntimeError("not comparable")

    __hash__ = object.__hash__


@pytest.mark.parametrize(
    "options, error, words",
    [
        ({"delay": "1s", "at": 1}, TypeError, "not both"),
        ({"delay": -1}, ValueError, "zero or more"),
        ({"delay": "soon"}, ValueError, "duration"),
        ({"delay": True}, TypeError, "duration"),
        ({"delay": [1]}, TypeError, "duration"),
        ({"delay": float("nan")}, ValueError, "zero or more"),
        ({"at": NAIVE}, ValueError, "time zone"),
        ({"at": "2030-01-01"}, TypeError, "aware datetime"),
        ({"at": -5}, ValueError, "between"),
        ({"priority": 1.5}, TypeError, "int"),
        ({"priority": True}, TypeError, "int"),
        ({"priority": False}, TypeError, "int"),
        ({"priority": 0.0}, TypeError, "int"),
        ({"priority": _Uncomparable()}, TypeError, "int"),
        ({"priority": 2**40}, ValueError, "between"),
        ({"dedupe": 7}, TypeError, "string"),
        ({"dedupe": ""}, ValueError, "1 to"),
        ({"dedupe": "a\x00b"}, ValueError, "NUL"),
    ],
)
async def test_bad_emit_options_raise_at_the_call_and_store_nothing(db_url, options, error, words):
    jobs = signal.once("jobs", optional=True)
    async with oke("t", database_url=db_url) as app:
        with pytest.raises(error, match=words):
            await app.emit(jobs, {"n": 1}, **options)
    assert await scalar(db_url, "SELECT count(*) FROM oke_messages") == 0


@pytest.mark.parametrize("options", [{"delay": "1s"}, {"priority": 1}, {"dedupe": "x"}, {"at": 1}])
async def test_a_live_signal_refuses_time_and_order_options(db_url, options):
    ticks = signal.live("ticks", optional=True)
    async with oke("t", database_url=db_url) as app:
        with pytest.raises(TypeError, match="a live tape is not a queue"):
            await app.emit(ticks, 1, **options)
    assert await scalar(db_url, "SELECT count(*) FROM oke_tape_events") == 0


@pytest.mark.parametrize(
    "backoff, words",
    [
        ({"initial": "10m", "max": "1s"}, "below initial"),
        ({"initial": "1s", "max": "1m", "factor": 2}, "unknown backoff option 'factor'"),
        ({"initial": "1s"}, "needs both"),
        ({"initial": "soon", "max": "1m"}, "durations"),
        ("1s", "must be None or a dict"),
    ],
)
def test_a_bad_backoff_is_a_value_error_at_declaration(backoff, words):
    with pytest.raises(ValueError, match=words):
        signal.once("jobs", backoff=backoff)


def test_backoff_is_not_an_option_of_a_live_signal():
    with pytest.raises(TypeError, match="backoff is for once and broadcast"):
        signal.live("ticks", backoff={"initial": "1s", "max": "1m"})


# --------------------------------------------------------------------------- the claim's plan


async def test_the_sqlite_claim_reads_the_ready_index_in_order_without_a_sort(sqlite_url):
    import sqlite3

    from engine.store.sql.claim import sqlite_claim_statement
    from workers.db import sqlite_file

    jobs = signal.once("jobs", optional=True)
    async with oke("t", database_url=sqlite_url) as app:
        for n in range(50):
            await app.emit(jobs, n, delay="1h" if n % 2 else None, priority=n % 3)
    conn = sqlite3.connect(sqlite_file(sqlite_url))
    try:
        conn.execute("ANALYZE")
        params = {"worker": "w", "lease_until": 1, "now": 1, "limit": 8, "q0": "jobs"}
        plan = "\n".join(str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + sqlite_claim_statement(1), params))
    finally:
        conn.close()
    assert "oke_messages_ready" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


# --------------------------------------------------------------------------- stats


async def test_stats_count_scheduled_messages_and_lag_only_counts_due_ones(db_url):
    from engine import ops

    jobs = signal.once("jobs", optional=True)
    async with oke("t", database_url=db_url) as app:
        await app.emit(jobs, 1, delay="1h")
        await app.emit(jobs, 2, at=now_ms() + 3_600_000)
        [only_later] = [s for s in await ops.stats(app.store) if s.signal == "jobs"]
        assert (only_later.pending, only_later.scheduled, only_later.lag_ms) == (2, 2, None)
        await app.emit(jobs, 3)
        await asyncio.sleep(0.05)
        [mixed] = [s for s in await ops.stats(app.store) if s.signal == "jobs"]
    assert (mixed.pending, mixed.scheduled) == (3, 2)
    assert mixed.lag_ms is not None and 40 <= mixed.lag_ms < 10_000


async def test_fx_emit_takes_the_same_options_and_keeps_its_parent_run(db_url):
    jobs = signal.once("jobs")
    follow = signal.once("follow", optional=True)
    runs: list[str] = []

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        runs.append(fx.run_id)
        first = await fx.emit(follow, 1, delay="1h", priority=3, dedupe="f")
        assert await fx.emit(follow, 2, dedupe="f") == first
        with pytest.raises(TypeError, match="not both"):
            await fx.emit(follow, 3, delay=1, at=1)

    async with oke("t", database_url=db_url) as app:
        await app.emit(jobs)
        await app.drain()
    rows = await fetch(db_url, "SELECT parent_run_id, priority, dedupe, run_at FROM oke_messages WHERE signal = 'follow'")
    assert len(rows) == 1 and len(runs) == 1  # one attempt: every check in the handler held
    parent, priority, dedupe, run_at = rows[0]
    assert (parent, priority, dedupe) == (runs[0], 3, "f") and run_at is not None
