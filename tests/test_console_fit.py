"""The overview fits an 80×24 terminal: every count column is drawn whole, the sparkline only
where there is room for it, and a resize brings it back (read from the rendered screen)."""
from __future__ import annotations

from console_workers.shop import populate
from okconsole.app import ConsoleApp
from okconsole.screens.overview import OverviewScreen
from screenkit import screen_lines
from test_console_tui import wait_for


def header_of(app) -> str:
    return next((line for line in screen_lines(app) if line.strip().startswith("Signal")), "")


async def test_overview_fits_80x24_and_shows_the_sparkline_when_wide(db_url):
    await populate(db_url)
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen) and "tasks.email" in
                       "\n".join(screen_lines(app)))
        header = header_of(app)
        for label in ("Signal", "Kind", "Pending", "Inflight", "Delivered", "Dead", "Lag", "Done/s"):
            assert label in header, header
        assert "Activity" not in header
        table = app.screen.query_one("#signals")
        assert table.virtual_size.width <= table.size.width  # nothing hidden past the right edge
        await pilot.resize_terminal(160, 40)
        await wait_for(pilot, lambda: "Activity" in header_of(app))
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: "Activity" not in header_of(app) and "Done/s" in header_of(app))
