"""once under concurrency: many processes, SIGKILL, lost leases, per-key FIFO.

Worker processes are real subprocesses (tests/workers/once_worker.py) on the same database; they
record every handler call by appending lines to files in the test's tmp dir. The test emits through
its own app (bound to nothing: it learns the subscribers the workers recorded at boot) and asserts
on those records and on the stored rows.
"""

from __future__ import annotations

import asyncio
import signal as os_signal
import time
from collections import Counter, defaultdict

import pytest

from engine import flow, oke, signal
from engine.flows import Binding
from prockit import until
from workers.db import fetch, scalar


def _never(payload, fx):
    raise AssertionError("the emitting app runs no workers")


async def _status_count(url: str, signal_name: str, status: str) -> int:
    return await scalar(url, "SELECT count(*) FROM oke_messages WHERE signal = $1 AND status = $2",
                        signal_name, status)


# --------------------------------------------------------------------------- (a) exactly once at scale

async def test_four_processes_deliver_ten_thousand_messages_exactly_once(pg_url, procs):
    total = 10_000
    bulk = signal.once("bulk")
    names = [f"w{i}" for i in range(4)]
    # The backlog is in place before the workers start, and they start at once: four claimers race
    # over one backlog. Four emitting apps (four connection pools) fill it.
    binding = [Binding(bulk, flow("workers.bulk", do=_never))]
    emitters = [oke(f"emitter{i}", database_url=pg_url, bindings=binding) for i in range(4)]

    async def emit_share(app, first: int) -> list[str]:
        out: list[str] = []
        async with app:
            for start in range(first, total, 4 * 100):
                out += await asyncio.gather(*(app.emit(bulk, {"n": n})
                                              for n in range(start, min(start + 100, total))))
        return out

    shares = await asyncio.gather(*(emit_share(app, i * 100) for i, app in enumerate(emitters)))
    emitted = [msg_id for share in shares for msg_id in share]
    assert len(emitted) == total
    for name in names:
        procs.start("bulk", name, pg_url, hold=True)
    await procs.ready(*names)
    procs.go()

    async def all_delivered():
        return await _status_count(pg_url, "bulk", "delivered") == total

    await until(all_delivered, f"{total} deliveries", timeout=150, every=0.2)
    await procs.stop()

    handled = procs.lines("handled-*")
    ids = [msg_id for msg_id, _attempt, _worker in handled]
    twice = [msg_id for msg_id, n in Counter(ids).items() if n > 1]
    assert twice == [], f"{len(twice)} messages were handled more than once"
    assert len(ids) == total and set(ids) == set(emitted)
    assert {attempt for _, attempt, _ in handled} == {"1"}
    per_worker = Counter(worker for _, _, worker in handled)
    assert set(per_worker) == set(names), f"every process takes a share: {per_worker}"

    assert await scalar(pg_url, "SELECT sum(attempts) FROM oke_messages WHERE signal = 'bulk'") == total
    assert await scalar(pg_url, "SELECT count(*) FROM oke_messages WHERE signal = 'bulk' AND "
                                "(status <> 'delivered' OR locked_by IS NOT NULL)") == 0
    assert await scalar(pg_url, "SELECT count(*) FROM oke_failures") == 0
    runs = await fetch(pg_url, "SELECT message_id, worker_id, status FROM oke_runs")
    assert len(runs) == total and {s for _, _, s in runs} == {"succeeded"}
    # the store's record of who ran each message agrees with the handlers' own
    assert {(m, w) for m, w, _ in runs} == {(m, w) for m, _, w in handled}


# --------------------------------------------------------------------------- (b) SIGKILL mid-handler

async def test_a_worker_killed_mid_handler_is_reclaimed_after_its_lease(db_url, procs):
    lease_ms = 1500
    victim = signal.once("victim", retries=3)
    procs.start("crash", "A", db_url, lease_ms=lease_ms)
    await procs.ready("A")
    async with oke("emitter", database_url=db_url, bindings=[]) as app:
        msg_id = await app.emit(victim, {"order": 1}, key="usr_1")

    async def started():
        return any(e[0] == "start" for e in procs.lines("events"))

    await until(started, "worker A to start the handler")
    [(status, attempts, locked_by, lease_a)] = await fetch(
        db_url, "SELECT status, attempts, locked_by, lease_expires_at FROM oke_messages WHERE id = $1", msg_id)
    assert (status, attempts, locked_by) == ("inflight", 1, "A")

    procs.procs["A"].send_signal(os_signal.SIGKILL)
    assert procs.procs["A"].wait(10) == -os_signal.SIGKILL

    procs.start("crash", "B", db_url, lease_ms=lease_ms)
    await procs.ready("B")

    async def delivered():
        return await _status_count(db_url, "victim", "delivered") == 1

    await until(delivered, "worker B to reclaim and deliver")
    await procs.stop()

    starts = [(e[1], int(e[2]), e[3], int(e[4])) for e in procs.lines("events")]
    assert [(m, a, w) for m, a, w, _ in starts] == [(msg_id, 1, "A"), (msg_id, 2, "B")]
    b_started = starts[1][3]
    assert b_started > lease_a, "B may only take the message after A's lease expired"

    [(status, attempts, locked_by)] = await fetch(
        db_url, "SELECT status, attempts, locked_by FROM oke_messages WHERE id = $1", msg_id)
    assert (status, attempts, locked_by) == ("delivered", 2, None)
    runs = await fetch(db_url, "SELECT attempt, worker_id, status FROM oke_runs WHERE message_id = $1", msg_id)
    assert runs == [(2, "B", "succeeded")]  # A died before it could record anything
    assert await fetch(db_url, "SELECT attempt FROM oke_failures WHERE message_id = $1", msg_id) == []


async def test_a_worker_whose_clock_runs_ahead_does_not_steal_a_live_lease(pg_url, procs):
    """Processes on many machines share one PostgreSQL: leases must not depend on their clocks."""
    victim = signal.once("victim", retries=3)
    procs.start("crash", "A", pg_url, lease_ms=30_000, concurrency=1)  # busy with one: takes no more
    await procs.ready("A")
    async with oke("emitter", database_url=pg_url, bindings=[]) as app:
        held = await app.emit(victim, {"hang": True})

        async def a_started():
            return any(e[0] == "start" for e in procs.lines("events"))

        await until(a_started, "worker A to start the handler")
        # B's wall clock is two minutes ahead: by its clock, A's 30 s lease has long expired
        procs.start("crash", "B", pg_url, lease_ms=30_000, clock_skew_ms=120_000)
        await procs.ready("B")
        probe = await app.emit(victim, {"hang": False})

    async def probe_delivered():
        return await scalar(pg_url, "SELECT status FROM oke_messages WHERE id = $1", probe) == "delivered"

    # B claims in seq order: the claim that took the probe saw the held message first and left it
    await until(probe_delivered, "worker B to handle the probe")
    started = [(e[1], e[3]) for e in procs.lines("events")]
    assert started == [(held, "A"), (probe, "B")]
    [(status, attempts, locked_by)] = await fetch(
        pg_url, "SELECT status, attempts, locked_by FROM oke_messages WHERE id = $1", held)
    assert (status, attempts, locked_by) == ("inflight", 1, "A")


# --------------------------------------------------------------------------- (c) stale holders

@pytest.mark.parametrize("a_late", ["succeeds", "fails"])
@pytest.mark.parametrize("b_does", ["succeeds", "fails"])
@pytest.mark.parametrize("a_finishes", ["after_b_settled", "while_b_runs"])
async def test_a_stale_worker_cannot_overwrite_the_new_holder(db_url, a_late, b_does, a_finishes):
    """A holds with a short lease and outlives it; B reclaims. A's late outcome changes nothing."""
    jobs = signal.once("jobs", retries=1)  # attempt 2 is the last: a failure there is final
    a_in_handler = asyncio.Event()
    release_a = asyncio.Event()
    b_in_handler = asyncio.Event()
    release_b = asyncio.Event()
    a_returned = asyncio.Event()

    async def handler_a(payload, fx):
        a_in_handler.set()
        await release_a.wait()
        a_returned.set()
        if a_late == "fails":
            raise RuntimeError("A's late failure")

    async def handler_b(payload, fx):
        assert fx.attempt == 2
        b_in_handler.set()
        await release_b.wait()
        if b_does == "fails":
            raise RuntimeError("B's failure")

    app_a = oke("a", database_url=db_url, lease_ms=300, worker_id="A",
                bindings=[Binding(jobs, flow("workers.jobs", do=handler_a))])
    app_b = oke("b", database_url=db_url, lease_ms=30_000, worker_id="B",
                bindings=[Binding(jobs, flow("workers.jobs", do=handler_b))])
    async with app_a, app_b:
        msg_id = await app_a.emit(jobs, {"x": 1})
        # concurrency 1: A cannot reclaim the message itself while its handler hangs
        running_a = asyncio.create_task(app_a.run(concurrency=1))
        await asyncio.wait_for(a_in_handler.wait(), 30)

        # B drains until its claim finds A's lease expired (judged by the store, whatever our clock)
        deadline = time.monotonic() + 30
        while True:
            draining_b = asyncio.create_task(app_b.drain())
            started_b = asyncio.create_task(b_in_handler.wait())
            await asyncio.wait([draining_b, started_b], return_when=asyncio.FIRST_COMPLETED)
            if b_in_handler.is_set():
                break
            started_b.cancel()
            assert time.monotonic() < deadline, "B never reclaimed the message"
            await asyncio.sleep(0.05)

        if a_finishes == "while_b_runs":
            release_a.set()
            await asyncio.wait_for(a_returned.wait(), 30)

            async def a_settled():
                return await fetch(db_url, "SELECT status FROM oke_runs WHERE worker_id = 'A'")

            assert await until(a_settled, "A's late settle") == [("lease_lost",)]
            row = await fetch(db_url, "SELECT status, locked_by, attempts FROM oke_messages WHERE id = $1",
                              msg_id)
            assert row == [("inflight", "B", 2)], "A's late outcome must not touch B's lease"
            release_b.set()
            await asyncio.wait_for(draining_b, 30)
        else:
            release_b.set()
            await asyncio.wait_for(draining_b, 30)
            release_a.set()
            await asyncio.wait_for(a_returned.wait(), 30)

            async def a_settled():
                return await fetch(db_url, "SELECT status FROM oke_runs WHERE worker_id = 'A'")

            assert await until(a_settled, "A's late settle") == [("lease_lost",)]
        await app_a.stop()
        await asyncio.wait_for(running_a, 30)

    expected = "delivered" if b_does == "succeeds" else "dead"
    row = await fetch(db_url, "SELECT status, locked_by, attempts FROM oke_messages WHERE id = $1", msg_id)
    assert row == [(expected, None, 2)]
    runs = await fetch(db_url, "SELECT worker_id, attempt, status, error FROM oke_runs ORDER BY attempt")
    b_status = "succeeded" if b_does == "succeeds" else "failed"
    assert [(w, a, s) for w, a, s, _ in runs] == [("A", 1, "lease_lost"), ("B", 2, b_status)]
    failures = await fetch(db_url, "SELECT attempt, message FROM oke_failures WHERE message_id = $1", msg_id)
    assert failures == ([(2, "B's failure")] if b_does == "fails" else [])


# --------------------------------------------------------------------------- (d) per-key FIFO

async def test_per_key_fifo_across_two_processes(db_url, procs):
    keys = [f"k{i:02d}" for i in range(16)]
    per_key = 20
    fifo = signal.once("fifo", retries=3)
    for name in ("P1", "P2"):
        procs.start("fifo", name, db_url, concurrency=8)
    await procs.ready("P1", "P2")

    async with oke("emitter", database_url=db_url, bindings=[]) as app:
        for n in range(per_key):
            for key in keys:
                await app.emit(fifo, {"key": key, "n": n}, key=key)

    async def all_delivered():
        return await _status_count(db_url, "fifo", "delivered") == len(keys) * per_key

    await until(all_delivered, "every fifo message delivered", timeout=90, every=0.1)
    await procs.stop()

    events = procs.lines("events")
    by_key: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for kind, key, n, attempt, _worker, _at in events:
        by_key[key].append((kind, int(n), int(attempt)))
    assert sorted(by_key) == keys
    for key, seq in by_key.items():
        expected = []
        for n in range(per_key):
            if n % 5 == 0:
                expected += [("S", n, 1), ("F", n, 1), ("S", n, 2), ("E", n, 2)]
            else:
                expected += [("S", n, 1), ("E", n, 1)]
        # start/end pairs never interleave within a key, and messages come in emit order
        assert seq == expected, f"key {key}: {seq[:12]}..."
    workers = Counter(e[4] for e in events)
    assert set(workers) == {"P1", "P2"}, f"both processes take part: {workers}"
    assert await scalar(db_url, "SELECT sum(attempts) FROM oke_messages WHERE signal = 'fifo'") == \
        len(keys) * per_key + len(keys) * len(range(0, per_key, 5))


# --------------------------------------------------------------------------- (e) one holder per lease

async def test_no_message_is_claimed_twice_under_a_live_lease(db_url, procs):
    lease_ms = 1000
    total = 120
    leased = signal.once("lease", retries=3)
    for name in ("L1", "L2"):
        procs.start("lease", name, db_url, lease_ms=lease_ms, concurrency=8)
    await procs.ready("L1", "L2")
    async with oke("emitter", database_url=db_url, bindings=[]) as app:
        ids = {}
        for n in range(total):
            ids[await app.emit(leased, n)] = n

    async def all_delivered():
        return await _status_count(db_url, "lease", "delivered") == total

    await until(all_delivered, "every lease message delivered", timeout=90, every=0.1)
    await procs.stop()

    attempts: dict[str, dict[int, dict[str, int | str]]] = defaultdict(dict)
    for kind, msg_id, attempt, worker, at, holder, row_attempts, lease in procs.lines("events"):
        rec = attempts[msg_id].setdefault(int(attempt), {"worker": worker})
        assert kind not in rec, f"attempt {attempt} of {msg_id} recorded {kind} twice"
        rec[kind] = int(at)
        if kind == "S":
            # at handler start the store names this worker, this attempt, and a live lease
            assert (holder, int(row_attempts)) == (worker, int(attempt)), (msg_id, attempt, holder)
            assert int(lease) > int(at)
            rec["lease"] = int(lease)
    assert set(attempts) == set(ids)

    runs = await fetch(db_url, "SELECT message_id, attempt, worker_id, status FROM oke_runs")
    run_status = {(m, a): s for m, a, _w, s in runs}
    slow = {m for m, n in ids.items() if n % 10 == 0}
    for msg_id, tries in attempts.items():
        if msg_id in slow:
            # attempt 1 outlived its lease: reclaimed as attempt 2, its own late outcome discarded
            assert sorted(tries) == [1, 2], (msg_id, tries)
            assert run_status[(msg_id, 1)] == "lease_lost"
            assert run_status[(msg_id, 2)] == "succeeded"
            first, second = tries[1], tries[2]
            assert second["S"] > first["lease"], "reclaimed only after the first lease expired"
            assert second["S"] < first["E"], "the first holder was still running: a real reclaim"
        else:
            assert sorted(tries) == [1], (msg_id, tries)
            assert run_status[(msg_id, 1)] == "succeeded"
    statuses = Counter(s for *_, s in runs)
    assert statuses == {"succeeded": total, "lease_lost": len(slow)}


def _open_at_barrier(path: str, barrier, results) -> None:
    """One process's first open of a shared SQLite file, started together with its siblings."""
    from engine.store.sqlite.store import SqliteStore

    async def go() -> None:
        store = SqliteStore(f"sqlite:///{path}")
        barrier.wait()
        try:
            await store.open()
            results.put("ok")
        except Exception as err:  # the test reports every failure's text
            results.put(repr(err))
        finally:
            await store.close()

    asyncio.run(go())


def test_processes_opening_a_fresh_sqlite_file_together_all_succeed(tmp_path):
    # Switching a new file to WAL takes an exclusive lock that SQLite refuses at once (no busy wait)
    # to a second process doing the same: workers started together must wait, not fail at boot.
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    failures: list[str] = []
    for round_no in range(40):
        path = str(tmp_path / f"fresh-{round_no}.db")
        barrier, results = ctx.Barrier(6), ctx.Queue()
        children = [ctx.Process(target=_open_at_barrier, args=(path, barrier, results)) for _ in range(6)]
        for child in children:
            child.start()
        outcomes = [results.get(timeout=60) for _ in children]
        for child in children:
            child.join(30)
            assert child.exitcode == 0, f"round {round_no}: a child exited {child.exitcode}"
        failures += [o for o in outcomes if o != "ok"]
    assert failures == []
