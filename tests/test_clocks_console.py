"""`okconsole clocks [--json]`, pause / resume of a clock, and the TUI's clocks view (`:clocks`),
on SQLite and PostgreSQL: a real app ticks, the real CLI and the Textual app under Pilot read it."""

from __future__ import annotations

import asyncio
import json

from engine import clock, flow, oke, on
from engine.clocks import Cron
from okconsole.app import ConsoleApp
from okconsole.screens.clocks import ClocksScreen
from consolekit import run_okconsole, wait_for
from screenkit import screen_lines, screen_text


async def _ticked(db_url: str) -> None:
    """An app with two clocks: one ticks every second (run until one tick is delivered), one hourly."""
    delivered = asyncio.Event()

    @on(clock.every("1s"))
    @flow("reports.beat")
    async def beat(tick, fx):
        delivered.set()

    on(clock.cron("0 * * * *", tz="Europe/Berlin"), flow("reports.hourly", do=lambda tick, fx: None))
    async with oke("clocked", database_url=db_url) as app:
        running = asyncio.create_task(app.run())
        await asyncio.wait_for(delivered.wait(), 30)
        await app.stop()
        await asyncio.wait_for(running, 30)


async def test_clocks_lists_each_clock_with_its_next_and_last_tick_and_pause_takes_its_signal(db_url):
    await _ticked(db_url)
    rows = json.loads(run_okconsole("--db", db_url, "clocks", "--json").stdout)
    assert [r["flow"] for r in rows] == ["reports.beat", "reports.hourly"]
    beat, hourly = rows
    fields = {"flow", "spec", "tz", "next_at", "last_at", "last_id", "last_status", "paused"}
    assert fields <= set(beat)
    assert (beat["spec"], beat["tz"], beat["paused"], beat["last_status"]) == ("every 1s", "UTC", False, "delivered")
    assert beat["last_at"] % 1000 == 0 and beat["next_at"] > beat["last_at"] and beat["last_id"].startswith("msg_")
    assert (hourly["spec"], hourly["tz"], hourly["last_id"], hourly["last_at"]) == (
        "0 * * * *",
        "Europe/Berlin",
        None,
        None,
    )
    assert hourly["next_at"] == Cron("0 * * * *", "Europe/Berlin").next_after(hourly["next_at"] - 1)

    paused = run_okconsole("--db", db_url, "pause", "clock.reports.beat", "--yes", "--reason", "t")
    assert paused.returncode == 0, paused.stderr
    rows = json.loads(run_okconsole("--db", db_url, "clocks", "--json").stdout)
    assert [r["paused"] for r in rows] == [True, False]
    table = run_okconsole("--db", db_url, "clocks").stdout
    assert "reports.beat" in table and "every 1s" in table and "delivered" in table
    assert run_okconsole("--db", db_url, "resume", "clock.reports.beat", "--yes", "--reason", "t").returncode == 0
    assert [r["paused"] for r in json.loads(run_okconsole("--db", db_url, "clocks", "--json").stdout)] == [False, False]


async def test_the_clocks_view_shows_each_clock_and_enter_opens_its_messages(sqlite_url):
    await _ticked(sqlite_url)
    console = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with console.run_test(size=(160, 40)) as pilot:
        assert "clocks" in console.jump_choices()
        console.jump("clocks")
        await wait_for(
            pilot,
            lambda: isinstance(console.screen, ClocksScreen) and console.screen.query_one("#clocks").row_count == 2,
        )
        await wait_for(pilot, lambda: "2 clocks · 0 paused" in screen_text(console))
        await pilot.pause(0.3)
        lines = screen_lines(console)
        [beat] = [line for line in lines if line.lstrip().startswith("reports.beat")]
        assert "every 1s" in beat and "delivered" in beat and "UTC" in beat
        [hourly] = [line for line in lines if line.lstrip().startswith("reports.hourly")]
        assert "0 * * * *" in hourly and "Europe/Berlin" in hourly
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: "clock.reports.beat" in screen_text(console) and not isinstance(console.screen, ClocksScreen)
        )


async def test_no_clocks_says_so(sqlite_url):
    async with oke("empty", database_url=sqlite_url, bindings=[]):
        pass
    assert run_okconsole("--db", sqlite_url, "clocks").stdout.startswith("No clocks recorded")
    assert json.loads(run_okconsole("--db", sqlite_url, "clocks", "--json").stdout) == []
