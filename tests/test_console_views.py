"""What the console's screens show, read from the rendered screen: the overview fits an 80×24
terminal (every count column whole, the sparkline only where there is room), and '/' filters a tail."""
from __future__ import annotations

from console_workers.shop import populate
from okconsole.app import ConsoleApp
from okconsole.screens.overview import OverviewScreen
from screenkit import screen_lines
from consolekit import wait_for


def header_of(app) -> str:
    return next((line for line in screen_lines(app) if line.strip().startswith("Signal")), "")


async def test_overview_fits_80x24_and_shows_the_sparkline_when_wide(db_url):
    await populate(db_url)
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen) and "tasks.email" in
                       "\n".join(screen_lines(app)))
        await wait_for(pilot, lambda: "left out at 80" in "\n".join(screen_lines(app)))
        await pilot.pause(0.3)  # the note follows the table's layout by one message
        header = header_of(app)
        # the health column comes first after the name and stays, with the counts and Dead/s; what
        # yields at 80 columns (Kind, an empty Lag, Activity) is named under the table
        for label in ("Signal", "Health", "Pending", "Dead", "Dead/s"):
            assert label in header, header
        note = next((line for line in screen_lines(app) if "left out at 80" in line), "")
        for label in ("Kind", "Inflight", "Delivered", "Lag", "Deliv/s", "Activity"):
            assert label in header.split() or label in note, (label, header, note)
        assert "Activity" not in header
        table = app.screen.query_one("#signals")
        assert table.virtual_size.width <= table.size.width  # nothing hidden past the right edge
        await pilot.resize_terminal(160, 40)
        await wait_for(pilot, lambda: "Activity" in header_of(app) and "Dead/s" in header_of(app))
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: "Activity" not in header_of(app) and "Health" in header_of(app))


async def test_slash_filters_the_tail_as_drawn_and_new_events_too(db_url):
    """'/' on the tail keeps the lines whose id or JSON has the text: old ones redrawn, new ones
    drawn only when they match, and esc shows everything again (read from the rendered screen)."""
    from console_workers.shop import declare
    from engine import oke
    from okconsole.screens.tail import TailScreen
    from screenkit import screen_text

    sigs = declare()
    async with oke("shop", database_url=db_url) as engine_app:
        for n in range(10):
            await engine_app.emit(sigs["status"], {"orderId": f"o{n}", "status": "late" if n % 2 else "paid"})
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=(120, 30)) as pilot:
        app.jump("tail order-status")
        await wait_for(pilot, lambda: isinstance(app.screen, TailScreen) and app.screen.received == 10)
        await pilot.press("slash", *"late", "enter")
        await wait_for(pilot, lambda: "showing 5 matching 'late'" in screen_text(app))
        shown = screen_text(app)
        assert '"o1"' in shown and '"o9"' in shown and '"o0"' not in shown and '"o8"' not in shown
        async with oke("shop", database_url=db_url) as engine_app:
            await engine_app.emit(sigs["status"], {"orderId": "p1", "status": "paid"})
            await engine_app.emit(sigs["status"], {"orderId": "l1", "status": "late"})
        await wait_for(pilot, lambda: app.screen.received == 12 and '"l1"' in screen_text(app))
        assert '"p1"' not in screen_text(app) and "showing 6 matching" in screen_text(app)
        await pilot.press("escape")  # esc clears the filter: everything is drawn again
        await wait_for(pilot, lambda: '"p1"' in screen_text(app) and '"o0"' in screen_text(app))
