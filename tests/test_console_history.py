"""The TUI's history screen (SPEC §13), read from the rendered screen on SQLite and PostgreSQL:
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


async def test_history_screen_charts_the_signal_and_switches_windows(db_url):
    await populate(db_url)
    points = await _points(db_url)
    peaks = {name: max(getattr(p, name) for p in points) / 60 for name in ("delivered", "failed", "dead")}
    assert peaks["delivered"] > 0 and peaks["dead"] > 0 and peaks["failed"] > 0
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen) and "tasks.email" in screen_text(app))
        app.jump("history tasks.email")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and "delivered/s" in screen_text(app))
        await wait_for(pilot, lambda: "last 15 min" in screen_text(app))
        for name in ("delivered", "failed", "dead"):
            words = _line(app, f"{name}/s").split()
            assert words[-2:] == ["peak", f"{peaks[name]:.2f}"], words
        text = screen_text(app)
        assert "tasks.email — per second, each minute" in text
        assert any(ch in text for ch in "▂▃▄▅▆▇█")  # the bars are drawn
        await pilot.press("3")
        await wait_for(pilot, lambda: "last 24 h" in screen_text(app))
        await pilot.press("w")
        await wait_for(pilot, lambda: "last 7 d" in screen_text(app))
        assert _line(app, "dead/s").split()[-1] == f"{peaks['dead']:.2f}"  # the same minutes, a wider window
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen))


async def test_h_on_the_overview_opens_the_selected_signals_history(sqlite_url):
    """And Deliv/s stands beside Dead/s in the overview's header (SPEC §13)."""
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
