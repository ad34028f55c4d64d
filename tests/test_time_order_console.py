"""The time and order options on the read side (last line): `messages --json` and
`show --json` carry run_at / priority / dedupe, and a pending message that waits (a delay, or a
back-off's next attempt) shows when it is due in `show`, `messages` and the TUI."""

from __future__ import annotations

import asyncio
import json

from typer.testing import CliRunner

from consolekit import wait_for
from engine import flow, oke, on, signal
from okconsole.app import ConsoleApp
from okconsole.cli import app as cli_app
from okconsole.screens.detail import DetailScreen
from okconsole.screens.messages import MessagesScreen
from screenkit import screen_text

runner = CliRunner()


async def cli(*args: str) -> str:
    """The real CLI, on a thread of its own (it runs its own event loop)."""
    result = await asyncio.to_thread(runner.invoke, cli_app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return result.stdout


async def _fill(db_url: str) -> dict[str, str]:
    """A delayed message, a prioritised one with a dedupe key, and one failed under a back-off."""
    jobs = signal.once("jobs", retries=2, backoff={"initial": "1h", "max": "2h"})

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        if payload == "fails":
            raise RuntimeError("smtp down")

    async with oke("t", database_url=db_url) as app:
        ids = {"retry": await app.emit(jobs, "fails")}
        await app.drain()  # one attempt; the next is an hour away
        ids["later"] = await app.emit(jobs, "later", delay="2h")
        ids["urgent"] = await app.emit(jobs, "urgent", priority=7, dedupe="once-a-day", delay="3h")
    return ids


async def test_messages_and_show_json_carry_run_at_priority_and_dedupe(db_url):
    ids = await _fill(db_url)
    rows = {r["id"]: r for r in json.loads(await cli("--db", db_url, "messages", "jobs", "--json"))}
    assert rows[ids["urgent"]]["priority"] == 7 and rows[ids["urgent"]]["dedupe"] == "once-a-day"
    assert rows[ids["later"]]["priority"] == 0 and rows[ids["later"]]["dedupe"] is None
    assert rows[ids["later"]]["run_at"] - rows[ids["later"]]["created_at"] >= 2 * 3_600_000 - 1000
    assert rows[ids["retry"]]["status"] == "pending" and rows[ids["retry"]]["run_at"] is not None
    shown = json.loads(await cli("--db", db_url, "show", ids["retry"], "--json"))
    assert shown["run_at"] == rows[ids["retry"]]["run_at"] == shown["due_at"]
    assert (shown["priority"], shown["dedupe"], shown["attempts"]) == (0, None, 1)


async def test_show_and_messages_tables_say_when_a_waiting_message_is_due(db_url):
    ids = await _fill(db_url)
    text = await cli("--db", db_url, "show", ids["retry"])
    assert "due at" in text and "not claimed before" in text
    table = await cli("--db", db_url, "messages", "jobs")
    assert "Due at" in table
    line = next(line for line in table.splitlines() if ids["later"] in line)
    assert any(ch.isdigit() for ch in line.split(ids["later"])[1])


async def test_the_tui_shows_due_and_retry_times_in_the_list_and_the_detail(db_url):
    ids = await _fill(db_url)
    # Refreshing every half second, as the console does by default every second: one load that misses
    # the rows on a loaded machine must not leave the screen empty for the test's whole wait.
    app = ConsoleApp(db_url, refresh_s=0.5)
    async with app.run_test(size=(160, 40)) as pilot:
        app.open_messages("jobs")
        await wait_for(pilot, lambda: isinstance(app.screen, MessagesScreen) and ids["retry"] in screen_text(app))
        shown = screen_text(app)
        retry_line = next(line for line in shown.splitlines() if ids["retry"] in line)
        later_line = next(line for line in shown.splitlines() if ids["later"] in line)
        assert "retry in 59m" in retry_line or "retry in 1h" in retry_line, retry_line
        assert "due in 1h59m" in later_line or "due in 2h" in later_line, later_line
        app.open_detail(ids["urgent"])
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen) and "not claimed before" in screen_text(app))
        detail = screen_text(app)
        assert "due at" in detail and "priority 7 · dedupe once-a-day" in detail
