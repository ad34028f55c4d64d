"""The TUI's answers to "why is it not running": the message screen's `why:` line (refreshed with the
screen) and the keys board (`k` on a signal's messages), read from the rendered screen on SQLite
and PostgreSQL, with `?` and the command palette listing the board, and hostile keys drawn inert."""

from __future__ import annotations

import re
from typing import Any

from consolekit import wait_for
from engine import flow, oke, ops, signal
from engine.flows import Binding
from hostilekit import HOSTILE_ERROR, HOSTILE_KEY, assert_inert, visible
from okconsole.app import ConsoleApp
from okconsole.screens.detail import DetailScreen
from okconsole.screens.keys import KeysScreen
from okconsole.screens.messages import MessagesScreen
from screenkit import flat_text, screen_text
from workers.db import execute

SIZE = (200, 50)


async def _noop(payload: Any, fx: Any) -> None:
    return None


async def seed(db_url: str, key: str = "k1", error: str = "smtp silent") -> dict[str, str]:
    """Key `key`: a head that failed once and two messages behind it; key k2: one fresh message."""
    jobs = signal.once("jobs")
    async with oke("shop", database_url=db_url, bindings=[Binding(jobs, flow("jobs.work", do=_noop))]) as app:
        ids = {"head": await app.emit(jobs, {"n": 0}, key=key)}
        ids["behind"] = await app.emit(jobs, {"n": 1}, key=key)
        await app.emit(jobs, {"n": 2}, key=key)
        ids["other"] = await app.emit(jobs, {"n": 3}, key="k2")
    await execute(db_url, "UPDATE oke_messages SET attempts = 1 WHERE id = $1", ids["head"])
    await execute(
        db_url,
        "INSERT INTO oke_failures (message_id, attempt, code, message, at, kind) "
        "VALUES ($1, 1, 'TimeoutError', $2, 1, 'failure')",
        ids["head"],
        error,
    )
    return ids


async def test_the_message_screen_shows_the_why_line_and_it_follows_the_store(db_url):
    ids = await seed(db_url)
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        app.open_detail(ids["behind"])
        line = (
            f"why: blocked_by_key waits behind {ids['head']} (pending, 1 failed attempt, last: TimeoutError: "
            "smtp silent), the head of key 'k1'"
        )
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen) and line in flat_text(app))
        async with oke("ops", database_url=db_url) as engine_app:  # the key moves on: its head is cancelled
            await ops.cancel(engine_app.store, "jobs", [ids["head"]], reason="poison")
        await wait_for(pilot, lambda: "why: due due for" in flat_text(app))


async def test_k_opens_the_keys_board_b_keeps_blocked_keys_and_enter_opens_the_head(db_url):
    ids = await seed(db_url)
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        app.open_messages("jobs")
        await wait_for(pilot, lambda: isinstance(app.screen, MessagesScreen) and ids["other"] in screen_text(app))
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, KeysScreen) and ids["other"] in screen_text(app))
        text = screen_text(app)
        assert "jobs · keys with unfinished messages · page 1 (2 keys)" in text
        assert re.search(r"Key\s+Flow\s+Head\s+Status\s+Failed\s+Waiting\s+Last failure", text)
        assert re.search(rf"k1\s+—\s+{ids['head']}\s+pending\s+1\s+2\s+TimeoutError: smtp silent", text), text
        assert re.search(rf"k2\s+—\s+{ids['other']}\s+pending\s+0\s+0\s+—", text), text
        await pilot.press("b")
        await wait_for(pilot, lambda: "blocked keys" in screen_text(app) and ids["other"] not in screen_text(app))
        assert ids["head"] in screen_text(app)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen) and app.screen.message_id == ids["head"])
        await wait_for(pilot, lambda: "why: due" in flat_text(app))


async def test_help_and_the_palette_list_the_keys_board_and_jump_opens_it(sqlite_url):
    await seed(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        app.open_messages("jobs")
        await wait_for(pilot, lambda: isinstance(app.screen, MessagesScreen))
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: "Keys · messages" in screen_text(app))
        assert re.search(r"\sk\s+Keys board\s", screen_text(app))
        await pilot.press("escape")
        await pilot.press("ctrl+p")
        await pilot.press(*"keys board")
        await wait_for(pilot, lambda: "Keys board" in screen_text(app) and "key k" in screen_text(app))
        await pilot.press("escape")
        app.jump("keys jobs")
        await wait_for(pilot, lambda: isinstance(app.screen, KeysScreen) and "k1" in screen_text(app))


async def test_hostile_keys_and_failures_render_inert_on_the_board_and_the_why_line(sqlite_url):
    ids = await seed(sqlite_url, key=HOSTILE_KEY, error=HOSTILE_ERROR)
    app = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        app.open_keys("jobs")
        await wait_for(pilot, lambda: isinstance(app.screen, KeysScreen) and ids["head"] in screen_text(app))
        text = screen_text(app)
        assert_inert(text)
        assert visible(HOSTILE_KEY) in text
        app.open_detail(ids["behind"])
        await wait_for(
            pilot, lambda: isinstance(app.screen, DetailScreen) and "why: blocked_by_key" in screen_text(app)
        )
        await wait_for(pilot, lambda: f"the head of key '{visible(HOSTILE_KEY)}'" in flat_text(app))
        assert_inert(screen_text(app))
