"""Timers: the raw engine.ops calls, and the TUI driven headless by Textual's Pilot."""
from __future__ import annotations

import asyncio
import re
import statistics
import time
from typing import Any, Awaitable, Callable

from textual.css.query import NoMatches

from engine import ops
from engine.store import make_store
from okconsole.app import ConsoleApp
from okconsole.screens.dlq import LIMIT as DLQ_LIMIT, DeadLettersScreen
from okconsole.screens.overview import OverviewScreen

from .fill import Expected

SIZE = (160, 48)
DLQ_SIGNAL = "tasks.email"
POLL_S = 0.002
TIMEOUT_S = 60.0
MARKUP = re.compile(r"\[/?[^\]]*\]")


def summary(samples: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "samples": samples}


# -- raw ops ------------------------------------------------------------------------------------
def op_calls(store: Any) -> dict[str, Callable[[], Awaitable[Any]]]:
    return {
        "ops.stats": lambda: ops.stats(store),
        "ops.dead_letters(200)": lambda: ops.dead_letters(store, DLQ_SIGNAL, DLQ_LIMIT),
        "ops.failures": lambda: ops.failures(store, DLQ_SIGNAL),
        "ops.message_page(50)": lambda: ops.message_page(store, DLQ_SIGNAL, None, None, 50),
        **{name: (lambda kw=kw: ops.message_page(store, DLQ_SIGNAL, limit=50, **kw))
           for name, kw in STORE_SORT_SEARCH.items()},
    }


# Store-side sort and search of a message list (issue 12): a page of 50 over the whole signal.
STORE_SORT_SEARCH: dict[str, dict[str, Any]] = {
    "sort created_at ▲ (50)": {"sort": "created_at", "descending": False},
    "sort attempts ▼ (50)": {"sort": "attempts"},
    "sort key ▲ (50)": {"sort": "key", "descending": False},
    "search 'mailbox unavailable' (50)": {"search": "mailbox unavailable"},  # last failures: rare hits
    "search no match (one page)": {"search": "no such text anywhere"},  # worst case: a cut page
    "sort attempts + search (50)": {"sort": "attempts", "search": "@example"},
}


def result_size(result: Any) -> int:
    items = getattr(result, "items", result)
    return len(items)


# -- the TUI ------------------------------------------------------------------------------------
def _holds(predicate: Callable[[], bool]) -> bool:
    try:
        return bool(predicate())
    except NoMatches:  # still composing
        return False


async def _until(predicate: Callable[[], bool], what: str) -> None:
    """Poll every 2 ms with a bare sleep: the app runs on this loop, and a Pilot pause would
    also wait for the screen's message queues, adding its own latency to the measure."""
    deadline = time.perf_counter() + TIMEOUT_S
    while not _holds(predicate):
        if time.perf_counter() > deadline:
            raise AssertionError(f"{what}: not reached in {TIMEOUT_S}s")
        await asyncio.sleep(POLL_S)


def overview_ok(app: ConsoleApp, exp: Expected) -> bool:
    """The #signals table shows every signal with the counts the fill wrote."""
    if not isinstance(app.screen, OverviewScreen):
        return False
    table = app.screen.query_one("#signals")
    if table.row_count != len(exp.counts):
        return False
    for signal, counts in exp.counts.items():
        for status, n in counts.items():
            if MARKUP.sub("", str(table.get_cell(signal, status))) != str(n):
                return False
    return True


def dlq_ok(app: ConsoleApp, want: int) -> bool:
    return (isinstance(app.screen, DeadLettersScreen) and app.screen.signal == DLQ_SIGNAL
            and app.screen.query_one("#letters").row_count == want)


OVERVIEW = "overview first paint"
DLQ = f"dlq page ({DLQ_SIGNAL})"
QUIET = " [no bg refresh]"  # diagnostic variant: refresh_s = 1 h, so no screen reloads during the measure


async def time_ui_once(url: str, exp: Expected, refresh_s: float = 1.0) -> dict[str, float]:
    """(a) construct ConsoleApp → overview painted with the right counts;
    (b) app.jump("dlq tasks.email") → #letters holds its rows."""
    want = min(DLQ_LIMIT, exp.dead(DLQ_SIGNAL))
    t0 = time.perf_counter()
    app = ConsoleApp(url, refresh_s=refresh_s)
    async with app.run_test(size=SIZE):
        await _until(lambda: overview_ok(app, exp), "overview counts")
        painted = time.perf_counter() - t0
        t1 = time.perf_counter()
        app.jump(f"dlq {DLQ_SIGNAL}")
        await _until(lambda: dlq_ok(app, want), "dead-letter rows")
        dlq = time.perf_counter() - t1
    return {"overview first paint": painted, f"dlq page ({DLQ_SIGNAL})": dlq, "dlq_rows": want}


async def time_open(url: str) -> float:
    """make_store + open + close: the fixed cost ahead of the console's first query (diagnostic)."""
    t = time.perf_counter()
    store = make_store(url)
    await store.open()
    await store.close()
    return time.perf_counter() - t


async def time_sizes(targets: list[tuple[int, str, Expected]], ui_reps: int, reps: int,
                     log: Callable[[str], None]) -> dict[int, dict[str, dict[str, Any]]]:
    """Time every size in interleaved rounds, so a shared machine's noise hits them alike.

    Round 0 warms up (imports, CSS parse, caches) and is dropped. Each later round, for each
    size (order alternating between rounds): the TUI as shipped (refresh every 1 s, so the covered
    overview keeps reloading while the dead-letter screen loads) and with the periodic refresh
    out of the way (diagnostic), for the first `ui_reps` rounds; then each engine.ops call once
    on a store kept open per size, and one open+close.
    """
    samples: dict[int, dict[str, list[float]]] = {n: {} for n, _, _ in targets}
    rows: dict[int, dict[str, int]] = {n: {} for n, _, _ in targets}
    stores = {}
    for n, url, _ in targets:
        stores[n] = make_store(url)
        await stores[n].open()
    try:
        rounds = max(ui_reps, reps)
        for r in range(rounds + 1):
            order = targets if r % 2 == 0 else targets[::-1]
            for n, url, exp in order:
                keep = r > 0
                if r <= ui_reps:
                    for refresh_s, suffix in ((1.0, ""), (3600.0, QUIET)):
                        run = await time_ui_once(url, exp, refresh_s)
                        for key in (OVERVIEW, DLQ):
                            if keep:
                                samples[n].setdefault(key + suffix, []).append(run[key])
                            rows[n][key + suffix] = len(exp.counts) if key == OVERVIEW else int(run["dlq_rows"])
                if r <= reps:
                    for name, call in op_calls(stores[n]).items():
                        t = time.perf_counter()
                        result = await call()
                        if keep:
                            samples[n].setdefault(name, []).append(time.perf_counter() - t)
                        rows[n][name] = result_size(result)
                    took = await time_open(url)
                    if keep:
                        samples[n].setdefault("store open+close", []).append(took)
                    rows[n]["store open+close"] = 0
            if r:
                log(f"    round {r}/{rounds} done")
    finally:
        for store in stores.values():
            await store.close()
    return {n: {name: {**summary(v), "rows": rows[n][name]} for name, v in cells.items()}
            for n, cells in samples.items()}


class CpuMeter:
    """Whole-machine CPU busy share between start() and stop() (/proc/stat; this bench included)."""

    def __init__(self) -> None:
        self.start_ticks = self._ticks()

    @staticmethod
    def _ticks() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                parts = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
        return sum(parts), idle

    def busy(self) -> float | None:
        end = self._ticks()
        if end is None or self.start_ticks is None or end[0] == self.start_ticks[0]:
            return None
        total, idle = end[0] - self.start_ticks[0], end[1] - self.start_ticks[1]
        return 1.0 - idle / total


async def wait_for_quiet(max_busy: float, log: Callable[[str], None], give_up_s: float = 900.0) -> float | None:
    """Wait (up to give_up_s) until the machine is below `max_busy` CPU over a 2 s sample."""
    deadline = time.perf_counter() + give_up_s
    said = 0.0
    while True:
        meter = CpuMeter()
        await asyncio.sleep(2.0)
        busy = meter.busy()
        if busy is None or busy <= max_busy or time.perf_counter() > deadline:
            return busy
        if time.perf_counter() - said > 30:
            said = time.perf_counter()
            log(f"    machine {busy:.0%} busy (other work); waiting for ≤ {max_busy:.0%} …")
