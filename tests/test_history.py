"""History per signal and minute (engine/store/history.py, engine/history.py, ops.history) on
SQLite and PostgreSQL: the counts match what happened (emitted, delivered, failed and retried,
dead, unbound copies), two apps counting into the same minute add up, history_ttl prunes, and
the rows are gap-free minutes, oldest first."""

from __future__ import annotations

import asyncio
import pytest
from sqlalchemy import text

from engine import flow, oke, on, ops, signal
from engine.ids import now_ms
from engine.store import history as stored
from engine.store.history import MINUTE_MS


class Boom(Exception):
    code = "E_BOOM"


def _totals(points: list[ops.HistoryPoint]) -> dict[str, int]:
    names = ("emitted", "delivered", "failed", "dead", "pruned", "pruned_runs")
    return {name: sum(getattr(p, name) for p in points) for name in names}


async def test_history_counts_what_happened(db_url):
    work = signal.once("h.work", retries=2)  # dead letters on (the default)
    dropped = signal.once("h.dropped", retries=0, dead_letter=False)
    tries: dict[int, int] = {}

    @on(work)
    @flow("h.work.flow")
    async def handle(n, fx):
        tries[n] = tries.get(n, 0) + 1
        if n % 5 == 0:
            raise Boom("always")  # 3 attempts: failed, failed, dead
        if n % 5 == 1 and tries[n] == 1:
            raise Boom("once")  # failed once, then delivered

    @on(dropped)
    @flow("h.dropped.flow")
    async def drop(n, fx):
        raise Boom("no dead letters")

    async with oke("h", database_url=db_url) as app:
        for n in range(20):
            await app.emit(work, n)
        await app.emit(dropped, 1)
        await app.drain(concurrency=4)
        points = await ops.history(app.store, "h.work", now_ms() - 3_600_000)
        other = await ops.history(app.store, "h.dropped", now_ms() - 3_600_000)
    totals = _totals(points)
    # 4 messages fail every attempt (2 retried failures, then dead); 4 fail once then succeed
    assert totals == {"emitted": 20, "delivered": 16, "failed": 4 * 2 + 4, "dead": 4, "pruned": 0, "pruned_runs": 0}
    # without dead letters a last failed attempt ends delivered, as its status says
    assert _totals(other)["delivered"] == 1 and _totals(other)["failed"] == 0
    assert [p.at for p in points] == sorted(p.at for p in points)
    assert all(p.at % MINUTE_MS == 0 for p in points)


async def test_history_is_gap_free_oldest_first_and_pruned_after_ttl(db_url):
    jobs = signal.once("h.gaps")

    @on(jobs)
    @flow("h.gaps.flow")
    async def handle(n, fx):
        pass

    now = now_ms()
    this_minute = now - now % MINUTE_MS
    async with oke("h", database_url=db_url, history_ttl="1h") as app:
        await app.emit(jobs, 1)
        await app.drain()
        # two older minutes as another process would have flushed them: 5 and 90 minutes ago
        old = stored.HistoryTally()
        old.add("h.gaps", this_minute - 5 * MINUTE_MS, stored.EMITTED, 3)
        old.add("h.gaps", this_minute - 90 * MINUTE_MS, stored.EMITTED, 7)
        await app.store.write(lambda conn: stored.write_counts(conn, old.take()))
        points = await ops.history(app.store, "h.gaps", now - 10 * MINUTE_MS)
        assert [p.at for p in points] == [this_minute - k * MINUTE_MS for k in range(10, -1, -1)]
        assert [p.emitted for p in points] == [0] * 5 + [3] + [0] * 4 + [1]
        everything = await ops.history(app.store, "h.gaps", 0)
        assert everything[0].at == this_minute - 90 * MINUTE_MS and len(everything) == 91

        await app.background.history.step()  # the writer's beat: the 90-minute-old row is past the 1h ttl
        everything = await ops.history(app.store, "h.gaps", 0)
    assert everything[0].at == this_minute - 5 * MINUTE_MS and _totals(everything)["emitted"] == 4


async def test_two_apps_count_into_the_same_minute(db_url):
    jobs = signal.once("h.shared")

    @on(jobs)
    @flow("h.shared.flow")
    async def handle(n, fx):
        pass

    async with oke("h1", database_url=db_url) as one, oke("h2", database_url=db_url) as two:
        assert one.store is not two.store
        await asyncio.gather(*(one.emit(jobs, n) for n in range(30)), *(two.emit(jobs, n) for n in range(12)))
        await asyncio.gather(one.drain(concurrency=4), two.drain(concurrency=4))
        # both flushed into the same rows: the upsert adds, it does not overwrite
        points = await ops.history(one.store, "h.shared", now_ms() - MINUTE_MS * 5)
        rows = await one.store.read(
            lambda conn: conn.execute(text("SELECT count(*) FROM oke_history WHERE signal = 'h.shared'")).scalar()
        )
    totals = _totals(points)
    assert totals["emitted"] == 42 and totals["delivered"] == 42
    assert rows <= 2  # one row per minute touched (a minute boundary may fall inside the test)


async def test_counts_wait_in_memory_until_the_flush(db_url):
    jobs = signal.once("h.mem", optional=True)
    async with oke("h", database_url=db_url) as app:
        for n in range(5):
            await app.emit(jobs, n)
        before = await ops.history(app.store, "h.mem", 0)
        assert before == []  # no write per message: counted in memory until the writer's beat
        await app.background.history.step()
        after = await ops.history(app.store, "h.mem", 0)
    assert _totals(after)["emitted"] == 5


async def test_unbind_counts_its_dead_copies(db_url):
    fan = signal.broadcast("h.fan")

    @on(fan)
    @flow("h.fan.a")
    async def a(n, fx):
        pass

    @on(fan)
    @flow("h.fan.b")
    async def b(n, fx):
        pass

    async with oke("h", database_url=db_url) as app:
        for n in range(3):
            await app.emit(fan, n)
        ended = await ops.unbind(app.store, "h.fan", "h.fan.b", actor="t")
        assert ended.dead == 3
        points = await ops.history(app.store, "h.fan", 0)  # unbind counted in its own transaction
        assert _totals(points)["dead"] == 3
        await app.drain()
        points = await ops.history(app.store, "h.fan", 0)
    totals = _totals(points)
    assert (totals["emitted"], totals["delivered"], totals["dead"], totals["failed"]) == (6, 3, 3, 0)


async def test_history_of_an_unknown_signal_names_it(db_url):
    async with oke("h", database_url=db_url) as app:
        with pytest.raises(ops.UnknownSignal):
            await ops.history(app.store, "h.nope", 0)


@pytest.mark.parametrize("option", ["history_ttl", "keep_delivered", "keep_dead", "keep_runs"])
@pytest.mark.parametrize("bad", ["", "7", "1w", "-1d", "0s", 7, "7d "])
def test_bad_durations_are_refused(option, bad):
    with pytest.raises(ValueError, match=option):
        oke("h", **{option: bad})


async def test_tally_survives_a_failed_flush():
    tally = stored.HistoryTally()
    tally.add("s", 61_000, stored.DELIVERED, 2)
    taken = tally.take()
    tally.add("s", 62_000, stored.DELIVERED, 1)
    tally.put_back(taken)
    assert tally.take() == {("s", 60_000): [0, 3, 0, 0, 0, 0]}
