"""The TUI's history screen, read from the rendered screen on SQLite and PostgreSQL:
delivered/s, failed/s and dead/s charts of the selected signal, their now / avg / peak figures
from the store's history, keys 1-4 switching the window, and the overview's Deliv/s beside Dead/s."""

from __future__ import annotations

from console_workers.shop import populate
from engine import ops
from engine.ids import now_ms
from engine.store import make_store
from okconsole.app import ConsoleApp
from okconsole.screens.history import HistoryScreen
from okconsole.screens.overview import OverviewScreen
from screenkit import screen_lines, screen_text
from consolekit import wait_for


async def _points(url: str) -> list[ops.HistoryPoint]:
    store = make_store(url)
    await store.open()
    try:
        return await ops.history(store, "tasks.email", now_ms() - 3_600_000)
    finally:
        await store.close()


def _line(app, start: str) -> str:
    return next((line.strip() for line in screen_lines(app) if line.strip().startswith(start)), "")


def _peak_range(points: list[ops.HistoryPoint], name: str, since_ms: int, until_ms: int) -> tuple[float, float]:
    """The peak a chart may show between two moments: the current minute's rate is its count over
    the elapsed part of the minute (okconsole/charts.py), which shrinks as time passes."""
    from okconsole.charts import seconds_of

    lo = max(getattr(p, name) / seconds_of(p.at, until_ms) for p in points)
    hi = max(getattr(p, name) / seconds_of(p.at, since_ms) for p in points)
    return round(lo, 2), round(hi, 2)


def _peak_shown(app, name: str) -> float:
    words = _line(app, f"{name}/s").split()
    assert words[-2] == "peak", words
    return float(words[-1])


async def test_history_screen_charts_the_signal_and_switches_windows(db_url):
    await populate(db_url)
    points = await _points(db_url)
    assert all(max(getattr(p, name) for p in points) > 0 for name in ("delivered", "failed", "dead"))
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen) and "tasks.email" in screen_text(app))
        since = now_ms()
        app.jump("history tasks.email")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and "delivered/s" in screen_text(app))
        await wait_for(pilot, lambda: "last 15 min" in screen_text(app))
        shown = {name: _peak_shown(app, name) for name in ("delivered", "failed", "dead")}
        until = now_ms()
        for name, peak in shown.items():
            lo, hi = _peak_range(points, name, since, until)
            assert lo <= peak <= hi, (name, peak, lo, hi)
        text = screen_text(app)
        assert "tasks.email — per second, each minute" in text
        assert any(ch in text for ch in "▂▃▄▅▆▇█")  # the bars are drawn
        await pilot.press("3")
        await wait_for(pilot, lambda: "last 24 h" in screen_text(app))
        await pilot.press("w")
        await wait_for(pilot, lambda: "last 7 d" in screen_text(app))
        dead = _peak_shown(app, "dead")
        lo, hi = _peak_range(points, "dead", since, now_ms())
        assert lo <= dead <= hi, (dead, lo, hi)  # the same minutes, a wider window
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen))


async def test_h_on_the_overview_opens_the_selected_signals_history(sqlite_url):
    """And Deliv/s stands beside Dead/s in the overview's header."""
    await populate(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen) and "tasks.email" in screen_text(app))
        header = _line(app, "Signal")
        assert "Deliv/s" in header and "Dead/s" in header and "Done/s" not in header
        assert header.index("Deliv/s") < header.index("Dead/s")
        await pilot.press("h")  # the first row is the live tape order-status: it has no history
        await wait_for(pilot, lambda: "live tape" in " ".join(screen_text(app).split()))
        while app.screen.selected_signal() != "tasks.email":
            await pilot.press("down")
        await pilot.press("h")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen))
        await wait_for(pilot, lambda: "tasks.email — per second" in screen_text(app))


async def test_history_screen_fits_80x24(sqlite_url):
    await populate(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        try:
            await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen) and "tasks.email" in screen_text(app))
        except AssertionError:
            raise AssertionError(screen_text(app)) from None
        app.jump("history tasks.email")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and "dead/s" in screen_text(app))
        lines = screen_lines(app)
        for label in ("delivered/s", "failed/s", "dead/s"):
            assert any(line.strip().startswith(label) and "peak" in line for line in lines), label
        assert any("… now" in line for line in lines)


async def _add_delivered(url: str, signal: str, minute: int, n: int) -> None:
    from engine.store.history import DELIVERED, HistoryTally, write_counts

    tally = HistoryTally()
    tally.add(signal, minute, DELIVERED, n)
    counts = tally.take()
    store = make_store(url)
    await store.open()
    try:
        await store.write(lambda conn: write_counts(conn, counts))
    finally:
        await store.close()


async def test_now_rate_divides_the_unfinished_minute_by_its_elapsed_part(db_url):
    """600 delivered so far in the current minute, 20 s into it, is 30/s, not 10/s (600 / 60 s):
    the header's "now" and the chart's last bar use the elapsed part of the minute."""
    import asyncio
    import time

    await populate(db_url)
    # 600 in a minute tells the elapsed part from the whole minute (by more than 0.5/s) until 57 s
    # into it: start by 45 s, so the screen has 12 s to render.
    if time.time() % 60 > 45:
        await asyncio.sleep(61 - time.time() % 60)
    minute = now_ms() - now_ms() % 60_000
    await _add_delivered(db_url, "tasks.email", minute, 600)
    count = next(p.delivered for p in await _points(db_url) if p.at == minute)
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen) and "tasks.email" in screen_text(app))
        before = max((now_ms() - minute) / 1000, 5.0)
        app.jump("history tasks.email")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and "delivered/s" in screen_text(app))
        await wait_for(pilot, lambda: "last 15 min" in screen_text(app))
        shown = float(_line(app, "delivered/s").split()[2])
        bar = app.screen.query_one("#chart-delivered").data[-1]
        after = max((now_ms() - minute) / 1000, 5.0)
        assert after < 59, "the minute ended while the screen loaded: the machine is too slow for this test"
        assert count / after - 0.01 <= shown <= count / before + 0.01, (shown, count, before, after)
        assert shown > count / 60 + 0.5  # not the whole minute's divisor
        assert count / after - 0.01 <= bar <= count / before + 0.01
