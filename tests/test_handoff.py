"""Hand-offs on PostgreSQL: an emit gives its message straight to an idle worker's offer, which then
runs it without a claim (engine/store/sql/handoff.py, engine/worker/handoff.py). Real PostgreSQL,
real worker processes (tests/workers/once_worker.py, mode "bulk")."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from engine import flow, oke, ops, signal
from engine.flows import Binding
from engine.store.sql.handoff import HOLD_LISTENER_LOCK
from prockit import until

HOLD_MS = 3_000


def _dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


def _sync(check: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
    """`until` awaits its predicate: a plain check, awaitable."""

    async def run() -> Any:
        return check()

    return run


def _recorder() -> tuple[list[tuple[str, int]], Callable[[Any, Any], Awaitable[None]]]:
    """A handler that records (message id, attempt) of each run, and its record."""
    ran: list[tuple[str, int]] = []

    async def handle(payload: Any, fx: Any) -> None:
        ran.append((fx.message_id, fx.attempt))

    return ran, handle


async def _take_notices(conn: asyncpg.Connection) -> asyncio.Queue[str]:
    """Every `oke_take` payload `conn` hears from now on."""
    notices: asyncio.Queue[str] = asyncio.Queue()
    await conn.add_listener("oke_take", lambda _c, _p, _ch, payload: notices.put_nowait(payload))
    return notices


def _never(payload: Any, fx: Any) -> None:
    raise AssertionError("this app runs no workers")


async def _offer(conn: asyncpg.Connection, worker: str, queues: list[str], lease_ms: int = 30_000,
                 hold_ms: int = HOLD_MS, listener_pid: int | None = None) -> None:  # fmt: skip
    """An offer as an idle pool makes it, written by hand: no process behind it takes anything. Its
    listener is `conn`'s backend (alive, holding the listener's lock, but it never takes) unless
    another pid is given."""
    if listener_pid is None:
        await conn.execute(HOLD_LISTENER_LOCK)
    await conn.execute(
        "INSERT INTO oke_idle_workers VALUES ($1, $2, $3, (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $4, $5)",
        worker, queues, lease_ms, hold_ms, conn.get_server_pid() if listener_pid is None else listener_pid,
    )  # fmt: skip


async def _row(conn: asyncpg.Connection, message_id: str) -> asyncpg.Record:
    return await conn.fetchrow(
        "SELECT seq, status, locked_by, attempts, lease_expires_at - created_at AS lease FROM oke_messages WHERE id = $1",
        message_id,
    )


async def _offers(conn: asyncpg.Connection) -> list[str]:
    return [r[0] for r in await conn.fetch("SELECT worker_id FROM oke_idle_workers ORDER BY worker_id")]


async def test_an_emit_hands_its_message_to_an_offer_inflight_under_that_workers_lease(pg_url):
    jobs = signal.once("jobs")
    async with oke("emitter", database_url=pg_url, bindings=[Binding(jobs, flow("workers.jobs", do=_never))]) as app:
        conn = await asyncpg.connect(_dsn(pg_url))
        notices = await _take_notices(conn)
        try:
            await _offer(conn, "w-idle", ["other", "jobs"], lease_ms=45_000)
            handed = await app.emit(jobs, {"n": 1})
            row = await _row(conn, handed)
            assert (row["status"], row["locked_by"], row["attempts"]) == ("inflight", "w-idle", 1)
            assert 45_000 <= row["lease"] < 46_000  # the lease runs from the emit, by the database's clock
            assert await asyncio.wait_for(notices.get(), 10) == f"w-idle {row['seq']}"
            assert await _offers(conn) == []  # the offer is used up

            pending = await app.emit(jobs, {"n": 2})  # no offer left: stored pending, as always
            assert (await _row(conn, pending))["status"] == "pending"
            assert (await ops.show(app.store, handed)).status == "inflight"
        finally:
            await conn.close()


async def test_no_hand_off_to_a_lapsed_offer_nor_of_a_paused_signal_or_an_emit_with_options(pg_url):
    jobs = signal.once("jobs")
    async with oke("emitter", database_url=pg_url, bindings=[Binding(jobs, flow("workers.jobs", do=_never))]) as app:
        conn = await asyncpg.connect(_dsn(pg_url))
        try:
            await _offer(conn, "w-lapsed", ["jobs"], hold_ms=-1)
            assert (await _row(conn, await app.emit(jobs, {"n": 0})))["status"] == "pending"
            assert await _offers(conn) == ["w-lapsed"]  # left alone
            await conn.execute("DELETE FROM oke_idle_workers")

            await _offer(conn, "w-idle", ["jobs"])
            emits = [
                app.emit(jobs, {"n": 1}, key="k1"),
                app.emit(jobs, {"n": 2}, delay="5m"),
                app.emit(jobs, {"n": 3}, priority=5),
                app.emit(jobs, {"n": 4}, dedupe="d4"),
            ]
            for emit in emits:
                assert (await _row(conn, await emit))["status"] == "pending"
            await ops.pause(app.store, "jobs", actor="ana")
            assert (await _row(conn, await app.emit(jobs, {"n": 5})))["status"] == "pending"
            assert await _offers(conn) == ["w-idle"]  # still there for the next plain emit
            await ops.resume(app.store, "jobs", actor="ana")
            assert (await _row(conn, await app.emit(jobs, {"n": 6})))["locked_by"] == "w-idle"
        finally:
            await conn.close()


async def test_no_hand_off_to_an_offer_whose_listener_is_gone(pg_url):
    """A worker SIGKILLed while idle leaves its offer behind for up to its hold, but its LISTEN
    connection's backend ends with it: emits pass the offer over instead of stranding a message."""
    jobs = signal.once("jobs")
    async with oke("emitter", database_url=pg_url, bindings=[Binding(jobs, flow("workers.jobs", do=_never))]) as app:
        conn = await asyncpg.connect(_dsn(pg_url))
        listener = await asyncpg.connect(_dsn(pg_url))
        try:
            await listener.execute(HOLD_LISTENER_LOCK)  # as a worker's LISTEN connection does
            gone = listener.get_server_pid()
            await listener.close()
            await until(lambda: _backend_gone(conn, gone), "the closed connection's backend to exit", 10)
            await _offer(conn, "w-killed", ["jobs"], listener_pid=gone)
            assert (await _row(conn, await app.emit(jobs, {"n": 1})))["status"] == "pending"
            assert await _offers(conn) == ["w-killed"]  # it lapses by itself
        finally:
            await conn.close()


async def _backend_gone(conn: asyncpg.Connection, pid: int) -> bool:
    return not await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)


async def test_a_message_handed_to_a_worker_that_never_takes_it_is_reclaimed_after_its_lease(pg_url):
    """A worker cut off by a silent partition keeps a backend the server thinks alive: what it is
    handed in its offer's last seconds waits out the (here short) lease, and another worker runs
    it: nothing is lost."""
    jobs = signal.once("jobs")
    ran, handle = _recorder()

    async with oke("emitter", database_url=pg_url, bindings=[Binding(jobs, flow("workers.jobs", do=_never))]) as app:
        conn = await asyncpg.connect(_dsn(pg_url))
        try:
            await _offer(conn, "w-cut-off", ["jobs"], lease_ms=800)
            stranded = await app.emit(jobs, {"n": 1})
            assert (await _row(conn, stranded))["locked_by"] == "w-cut-off"
        finally:
            await conn.close()
    signal.once("jobs")  # the declaration again, for the worker app below (engine.reset between apps)
    async with oke("worker", database_url=pg_url, bindings=[Binding(jobs, flow("workers.jobs", do=handle))]) as app:
        runner = asyncio.create_task(app.run(concurrency=2))
        try:
            await until(_sync(lambda: ran), "the stranded message to be reclaimed and run", timeout=15)
        finally:
            await app.stop()
            await runner
        assert ran == [(stranded, 2)]  # attempt 1 was the cut-off worker's
        assert (await ops.show(app.store, stranded)).status == "delivered"


async def test_an_idle_worker_process_is_handed_messages_and_withdraws_its_offer_at_stop(pg_url, procs):
    bulk = signal.once("bulk")
    procs.start("bulk", "w0", pg_url)
    await procs.ready("w0")
    conn = await asyncpg.connect(_dsn(pg_url))
    notices = await _take_notices(conn)
    try:
        async with oke("emitter", database_url=pg_url, bindings=[Binding(bulk, flow("workers.bulk", do=_never))]) as app:
            handed = []
            for n in range(5):
                await until(lambda: _offers(conn), "the idle worker to offer itself", timeout=30)
                worker_id = (await _offers(conn))[0]
                message = await app.emit(bulk, {"n": n})
                notice = await asyncio.wait_for(notices.get(), 10)
                assert notice == f"{worker_id} {(await _row(conn, message))['seq']}"
                handed.append(message)
            await until(_sync(lambda: len(procs.lines("handled-*")) == 5), "the worker to run what it was handed", 30)
            assert sorted(line[:2] for line in procs.lines("handled-*")) == sorted([m, "1"] for m in handed)
            await until(lambda: _all_delivered(app, handed), "the handed messages to be settled", 30)
            await until(lambda: _offers(conn), "the worker to offer itself again", timeout=30)
        await procs.stop()
        assert await _offers(conn) == []  # a clean stop withdraws the offer
    finally:
        await conn.close()


async def _all_delivered(app: Any, ids: list[str]) -> bool:
    return [(await ops.show(app.store, i)).status for i in ids] == ["delivered"] * len(ids)


async def test_an_in_process_pool_runs_a_hand_off_and_its_stop_withdraws_the_offer(pg_url):
    jobs = signal.once("jobs")
    ran, handle = _recorder()

    async with oke("worker", database_url=pg_url, bindings=[Binding(jobs, flow("workers.jobs", do=handle))]) as app:
        conn = await asyncpg.connect(_dsn(pg_url))
        try:
            runner = asyncio.create_task(app.run(concurrency=2))
            await until(lambda: _offers(conn), "the pool to offer itself", timeout=30)
            message = await app.emit(jobs, {"n": 1})  # this process's own emit: handed over too
            assert (await _row(conn, message))["attempts"] == 1
            await until(_sync(lambda: ran), "the pool to run the handed message", timeout=10)
            await until(lambda: _all_delivered(app, [message]), "the handed message to be settled", 10)
            await app.stop()
            await runner
            assert ran == [(message, 1)]
            assert await _offers(conn) == []
        finally:
            await conn.close()


async def test_two_apps_on_one_database_in_one_process_run_each_hand_off_once(pg_url):
    """Both apps' LISTEN connections hear every take notice; only the pool it names takes it."""
    jobs = signal.once("jobs")
    runs: list[str] = []

    async def handle(payload: Any, fx: Any) -> None:
        runs.append(fx.message_id)

    binding = Binding(jobs, flow("workers.jobs", do=handle))
    first, second = oke("a", database_url=pg_url, bindings=[binding]), oke("b", database_url=pg_url, bindings=[binding])
    async with first, second:
        conn = await asyncpg.connect(_dsn(pg_url))
        notices = await _take_notices(conn)
        runners = [asyncio.create_task(app.run(concurrency=2)) for app in (first, second)]
        try:
            await until(lambda: _offers(conn), "a pool to offer itself", timeout=30)
            emitted = []
            for n in range(20):
                emitted.append(await first.emit(jobs, {"n": n}))
                await until(_sync(lambda: len(runs) == len(emitted)), "the message to run", timeout=10)
            await until(lambda: _all_delivered(first, emitted), "every message to be settled", 30)
            await asyncio.sleep(0.3)  # a second run of any of them would have started by now
            assert sorted(runs) == sorted(emitted)
            assert notices.qsize() >= 10  # most went by hand-off (an offer is renewed after each take)
        finally:
            for app in (first, second):
                await app.stop()
            await asyncio.gather(*runners)
            await conn.close()
