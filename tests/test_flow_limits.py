"""Flow limits across processes, on SQLite and PostgreSQL: three worker processes
(tests/workers/once_worker.py, mode "limits") share one concurrency limit, one rate limit and a
broadcast's per-copy limit. The counts come from the intervals the handlers record: never more
than N running at once, never more than N starts in a window; and an operator's override reaches
every process within a second, until a reset."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine import flow, oke, ops, signal
from engine.durations import parse_rate
from engine.flows import Binding
from consolekit import wait_for
from okconsole.app import ConsoleApp
from limitkit import most_at_once, most_in_window
from prockit import WorkerProcs, until
from screenkit import screen_lines
from workers.once_worker import FAN_CONCURRENCY, LIMITED_CONCURRENCY, LIMITED_RATE

# A start is counted when its claim commits, by the store's clock; the handler starts when the
# claim's answer has reached its process and the loop runs it. On a loaded machine that hand-over
# takes up to this long, so handler starts a window apart are checked with this margin (the store's
# own log of starts is exact: docs/design/flow-limits.md).
HANDOVER_MS = 300


@pytest.fixture
def procs(tmp_path):
    group = WorkerProcs(tmp_path)
    try:
        yield group
    finally:
        group.kill_all()


def intervals(procs: WorkerProcs, queue: str) -> list[tuple[int, int]]:
    """(start, end) in epoch ms of every handler run of `queue`, paired by message and attempt."""
    starts: dict[tuple[str, str], int] = {}
    out = []
    for kind, q, msg, attempt, _worker, at in procs.lines("events"):
        if q != queue:
            continue
        if kind == "S":
            starts[(msg, attempt)] = int(at)
        else:
            out.append((starts.pop((msg, attempt)), int(at)))
    return out


def _row(app: ConsoleApp, name: str) -> str:
    return next((line for line in screen_lines(app) if line.strip().startswith(name + " ")), "")


async def _start_three(procs: WorkerProcs, url: str) -> None:
    for n in range(3):
        procs.start("limits", f"w{n}", url, concurrency=8)
    await procs.ready("w0", "w1", "w2")


async def _ended(procs: WorkerProcs, queue: str, count: int) -> bool:
    return len(intervals(procs, queue)) >= count


async def test_processes_share_one_concurrency_limit_one_rate_limit_and_a_per_copy_limit(db_url, procs):
    capped = signal.once("lim.conc", concurrency=LIMITED_CONCURRENCY)
    paced = signal.once("lim.rate", rate=LIMITED_RATE)
    fan = signal.broadcast("lim.fan", concurrency=FAN_CONCURRENCY)
    await _start_three(procs, db_url)
    async with oke("emitter", database_url=db_url, bindings=[]) as app:
        ids = [await app.emit(capped, {"ms": 60}) for _ in range(40)]
        ids += [await app.emit(paced, {"ms": 5}) for _ in range(20)]
        ids += [await app.emit(fan, {"ms": 40}) for _ in range(20)]
        for queue, count in [("lim.conc", 40), ("lim.rate", 20), ("lim.fan/a", 20), ("lim.fan/b", 20)]:
            await until(lambda q=queue, c=count: _ended(procs, q, c), f"{count} runs of {queue}", timeout=90)
        await procs.stop()
        shown = [await ops.show(app.store, i) for i in ids]
    assert {(m.status, m.attempts) for m in shown} == {("delivered", 1)}  # held back, never failed

    # 24 slots in three processes: the limit, not the slots, is what kept it to N, and N was reached
    assert most_at_once(intervals(procs, "lim.conc")) == LIMITED_CONCURRENCY
    for copy in ("lim.fan/a", "lim.fan/b"):  # per flow copy queue
        assert most_at_once(intervals(procs, copy)) == FAN_CONCURRENCY
    count, window_ms = parse_rate(LIMITED_RATE)
    starts = [start for start, _ in intervals(procs, "lim.rate")]
    assert most_in_window(starts, window_ms - HANDOVER_MS) <= count
    assert max(starts) - min(starts) >= (20 // count - 1) * window_ms - HANDOVER_MS  # paced, not a burst
    assert len({worker for kind, q, *_, worker, _ in procs.lines("events") if q == "lim.rate"}) >= 2


async def test_an_override_reaches_every_process_within_a_second_until_reset(db_url, procs):
    capped = signal.once("lim.conc", concurrency=LIMITED_CONCURRENCY)
    await _start_three(procs, db_url)
    async with oke("operator", database_url=db_url, bindings=[]) as app:
        state = await ops.limit(app.store, "lim.conc", concurrency=1, actor="ana", reason="API slow")
        assert (state.concurrency, state.overridden, state.changed) == (1, True, True)
        set_at = time.time() * 1000
        await asyncio.sleep(1.0)
        held = [await app.emit(capped, {"ms": 80}) for _ in range(12)]
        await until(lambda: _ended(procs, "lim.conc", 1), "the first run under the override")

        # held back: a pending message says so (read while one runs: between two 80 ms runs none
        # does for a moment, and the verdict then is rightly `due`), and the overview marks the signal
        async def limited_verdict():
            pending = [i for i in held if (await ops.show(app.store, i)).status == "pending"]
            got = await ops.why(app.store, pending[-1]) if len(pending) > 1 else None
            return got if got is not None and got.verdict == "concurrency_limited" else None

        verdict = None
        for _ in range(50):
            if (verdict := await limited_verdict()) is not None:
                break
            await asyncio.sleep(0.02)
        assert verdict is not None, "no pending message was said to be concurrency_limited"
        assert "1 of at most 1 running" in verdict.detail
        [row] = [s for s in await ops.stats(app.store) if s.signal == "lim.conc"]
        assert (row.concurrency, row.rate) == (1, None)
        assert row.running <= 1

        await until(lambda: _ended(procs, "lim.conc", 12), "every run under the override", timeout=90)
        under = [run for run in intervals(procs, "lim.conc") if run[0] > set_at + 1000]
        assert len(under) == 12 and most_at_once(under) == 1

        reset = await ops.limit(app.store, "lim.conc", reset=True, actor="ana")
        assert (reset.concurrency, reset.overridden, reset.changed) == (LIMITED_CONCURRENCY, False, True)
        await asyncio.sleep(1.0)
        reset_at = time.time() * 1000
        for _ in range(30):
            await app.emit(capped, {"ms": 100})
        await until(lambda: _ended(procs, "lim.conc", 42), "every run after the reset", timeout=90)
        after = [run for run in intervals(procs, "lim.conc") if run[0] > reset_at]
        assert most_at_once(after) == LIMITED_CONCURRENCY
        audit = [e for e in await ops.audit(app.store) if e.action == "limit"]
        assert [e.reason for e in audit][-2:] in (
            ["concurrency 1: API slow", "reset to the declared limits"],
            ["reset to the declared limits", "concurrency 1: API slow"],
        )
        await procs.stop()


async def test_a_rate_limited_message_says_until_when_it_waits(db_url):
    paced = signal.once("lim.slow", rate="2/1h")
    async with oke("emitter", database_url=db_url, bindings=[]) as app:
        seen: list[str] = []

        async def handle(payload, fx):
            seen.append(fx.message_id)

        bound = [Binding(paced, flow("slow.work", do=handle))]
        async with oke("slow", database_url=db_url, bindings=bound) as worker:
            ids = [await worker.emit(paced, {"n": n}) for n in range(3)]
            await asyncio.wait_for(worker.drain(), 30)
        assert seen == ids[:2]
        verdict = await ops.why(app.store, ids[2])
        assert verdict.verdict == "rate_limited"
        assert "2/1h" in verdict.detail and "next start fits at" in verdict.detail
        [row] = [s for s in await ops.stats(app.store) if s.signal == "lim.slow"]
        assert (row.rate, row.held_by, row.health) == ("2/1h", "rate", ["rate 2/1h"])

    # the TUI overview marks it, in the health column and in its colour
    console = ConsoleApp(db_url, refresh_s=0.2)
    async with console.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: "rate 2/1h" in _row(console, "lim.slow"))
        cell = console.screen.query_one("#signals").get_cell("lim.slow", "health")
        assert cell.plain == "rate 2/1h" and {str(span.style) for span in cell.spans} == {"yellow"}
