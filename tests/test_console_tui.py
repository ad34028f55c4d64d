"""The TUI driven by Pilot over a real populated store, on SQLite and PostgreSQL."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


from console_workers.shop import declare, populate
from engine import oke, ops
from engine.store import make_store
from okconsole.app import ConsoleApp
from okconsole.screens.detail import DetailScreen
from okconsole.screens.dlq import DeadLettersScreen
from okconsole.screens.messages import MessagesScreen
from okconsole.screens.overview import OverviewScreen
from okconsole.screens.tail import TailScreen
from okconsole.screens.trace import TraceScreen
from screenkit import screen_text
from consolekit import SIZE, wait_for

TESTS = Path(__file__).resolve().parent


async def read_stats(url: str):
    store = make_store(url)
    await store.open()
    try:
        return {s.signal: s for s in await ops.stats(store)}, await ops.dead_letters(store, "tasks.email")
    finally:
        await store.close()


def cell(table, row: str, column: str) -> str:
    return str(table.get_cell(row, column))


async def test_overview_counts_match_the_store(db_url):
    await populate(db_url)
    stats, _dead = await read_stats(db_url)
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen)
                       and app.screen.query_one("#signals").row_count == 3)
        table = app.screen.query_one("#signals")
        assert {k.value for k in table.rows} == {"orders.placed", "tasks.email", "order-status"}
        assert cell(table, "tasks.email", "delivered") == str(stats["tasks.email"].delivered) == "4"
        assert "2" in cell(table, "tasks.email", "dead")
        assert cell(table, "order-status", "kind") == "live"
        assert cell(table, "order-status", "delivered") == "6 kept"


async def test_dead_letter_story_trace_and_replay_delivered_by_another_process(db_url):
    await populate(db_url)
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.screen.query("#signals") and app.screen.query_one("#signals").row_count)
        app.jump("dlq tasks.email")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == 2)
        groups = app.screen.query_one("#groups")  # filled just after the letters
        await wait_for(pilot, lambda: groups.row_count == 2)  # two addresses, two distinct messages
        assert "2 dead" in str(app.screen.query_one("#title").render())
        # open the first dead letter: failures newest first, payload, trace
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen) and app.screen.detail is not None)
        detail = app.screen.detail
        assert detail.status == "dead" and detail.attempts == 2
        await wait_for(pilot, lambda: "attempt 2 · REFUSED" in screen_text(app))
        shown = screen_text(app)
        assert shown.index("attempt 2 · REFUSED") < shown.index("attempt 1 · REFUSED")  # newest first
        assert "refused the message" in shown
        await pilot.press("t")
        await wait_for(pilot, lambda: isinstance(app.screen, TraceScreen) and app.screen.rendered is not None)
        root = app.screen.rendered
        assert root.flow == "workers.orders"
        assert any(m.id == detail.id for m in root.messages)
        await pilot.press("escape", "escape")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen))
        # tag both and replay: the confirmation names the count; Enter without a reason does nothing
        await pilot.press("space", "space", "R")
        await wait_for(pilot, lambda: "Replay 2 dead letters" in screen_text(app))
        await pilot.press("enter")
        await wait_for(pilot, lambda: "a reason is required" in screen_text(app))
        assert type(app.screen).__name__ == "ConfirmScreen"
        await pilot.press(*"smtp fixed", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == 0)
    # a second process's worker delivers the replayed messages (they fail again: retries 1 → dead)
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run([sys.executable, "-m", "console_workers.shop", db_url], check=True, env=env, timeout=120)
    stats, dead = await read_stats(db_url)
    assert stats["tasks.email"].dead == 2 and stats["tasks.email"].pending == 0
    history = [f.code for f in dead[0].failures]
    assert history == ["REFUSED", "REFUSED", "replayed", "REFUSED", "REFUSED"]
    store = make_store(db_url)
    await store.open()
    try:
        entries = await ops.audit(store)
    finally:
        await store.close()
    assert entries[0].action == "replay" and entries[0].count == 2 and entries[0].reason == "smtp fixed"


async def test_edited_payload_replay_is_delivered(db_url):
    await populate(db_url, orders=3, bounces=1)
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        app.jump("dlq tasks.email")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == 1)
        await pilot.press("e")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "EditPayloadScreen")
        editor = app.screen.query_one("#payload-editor")
        editor.text = '{"to": "user0@bounce.test", "n": 0, "fixed": true}'
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: "why (recorded in the audit log)" in screen_text(app)
                       and "edited" in screen_text(app))  # "Replay … with the edited payload?" (wraps)
        await pilot.press(*"address fixed", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == 0)
    declare_app = oke("shop", database_url=db_url)
    async with declare_app:
        await declare_app.drain()
    stats, dead = await read_stats(db_url)
    assert stats["tasks.email"].dead == 0 and stats["tasks.email"].delivered == 3


async def test_read_only_refuses_writes(db_url):
    await populate(db_url)
    app = ConsoleApp(db_url, read_only=True, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        app.jump("dlq tasks.email")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == 2)
        await pilot.press("space", "R", "A", "P", "e")
        await pilot.pause(0.3)
        assert isinstance(app.screen, DeadLettersScreen)  # no confirmation was even offered
    stats, dead = await read_stats(db_url)
    assert stats["tasks.email"].dead == 2


async def test_messages_paging_and_status_keys(db_url):
    declare()
    async with oke("shop", database_url=db_url) as app_engine:
        for n in range(120):
            await app_engine.emit("tasks.email", {"to": f"u{n}@example.com", "n": n})
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        app.open_messages("tasks.email")
        await wait_for(pilot, lambda: isinstance(app.screen, MessagesScreen)
                       and app.screen.query_one("#messages").row_count == 50)
        await pilot.press("n")
        await wait_for(pilot, lambda: len(app.screen.cursors) == 2 and app.screen.next_cursor is not None)
        await pilot.press("n")
        await wait_for(pilot, lambda: app.screen.query_one("#messages").row_count == 20)
        await pilot.press("p")
        await wait_for(pilot, lambda: len(app.screen.cursors) == 2)
        await pilot.press("5")  # dead: none yet
        await wait_for(pilot, lambda: app.screen.query_one("#messages").row_count == 0)
        await pilot.press("2")
        await wait_for(pilot, lambda: app.screen.query_one("#messages").row_count == 50)
        # '/' filters the page; '!' inverts
        await pilot.press("slash", *"u119@", "enter")
        await wait_for(pilot, lambda: app.screen.query_one("#messages").row_count <= 1)


async def test_tail_from_store_follows_and_badges_when_scrolled_up(db_url):
    await populate(db_url)
    sigs = declare()
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        app.jump("tail order-status")
        await wait_for(pilot, lambda: isinstance(app.screen, TailScreen) and app.screen.received == 6)
        log = app.screen.query_one("#tail-log")
        async with oke("shop", database_url=db_url) as engine_app:
            for n in range(60):
                await engine_app.emit(sigs["status"], {"orderId": f"x{n}", "status": "shipped"})
            await wait_for(pilot, lambda: app.screen.received == 66)
            await pilot.pause(0.1)
            assert log.is_vertical_scroll_end
            await pilot.press("home")
            await pilot.pause(0.1)
            assert log.scroll_y == 0
            for n in range(3):
                await engine_app.emit(sigs["status"], {"orderId": f"y{n}", "status": "late"})
            await wait_for(pilot, lambda: app.screen.received == 69)
            assert app.screen.unseen == 3
            assert app.screen.query_one("#badge").has_class("shown")
            assert log.scroll_y == 0  # paused: the view did not move
            await pilot.press("end")
            await pilot.pause(0.1)
            assert not app.screen.query_one("#badge").has_class("shown")
            assert log.is_vertical_scroll_end


async def test_unreachable_store_says_so_and_recovers(tmp_path: Path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store's directory should be")
    url = f"sqlite+aiosqlite:///{blocker / 'oke.db'}"
    app = ConsoleApp(url, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        status = app.screen.query_one("#status") if app.screen.query("#status") else None
        await wait_for(pilot, lambda: app.store_ok is False)
        status = app.screen.query_one("#status")
        assert "store unreachable" in str(status.render())
        blocker.unlink()
        await wait_for(pilot, lambda: app.store_ok is True)
        assert "ok" in str(app.screen.query_one("#status").render())
        assert "No signals in this store yet" in str(app.screen.query_one("#empty").render())


async def test_jump_help_and_palette(sqlite_url):
    await populate(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "HelpScreen")
        await pilot.press("escape")
        await pilot.press("colon", *"messages tasks.email dead", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, MessagesScreen) and app.screen.status == "dead")
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen))
        commands = [c.title for c in app.get_system_commands(app.screen)]
        assert {"Audit log", "Jump…", "Dead letters & failures", "Tail"} <= set(commands)


async def test_dead_letters_beyond_one_page_show_the_exact_total(sqlite_url):
    from engine import flow, on, signal
    from okconsole.screens.dlq import LIMIT

    jobs = signal.once("t.many", retries=0)

    @on(jobs)
    @flow("w.many")
    async def fail(payload, fx):
        raise RuntimeError(f"no {payload % 2}")

    async with oke("t", database_url=sqlite_url) as engine_app:
        for n in range(LIMIT + 7):
            await engine_app.emit(jobs, n)
        await engine_app.drain(concurrency=16)

    app = ConsoleApp(sqlite_url, refresh_s=5)
    async with app.run_test(size=SIZE) as pilot:
        app.jump("dlq t.many")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == LIMIT)
        await wait_for(pilot, lambda: app.screen.query_one("#groups").row_count == 2)
        title = str(app.screen.query_one("#title").render())
        assert f"{LIMIT + 7} dead (showing the newest {LIMIT})" in title


async def test_lease_columns_follow_the_stores_clock_not_the_consoles(db_url, monkeypatch):
    """The console's machine runs two minutes ahead: a live 30 s lease is still shown with its
    time left, never as "reclaimable now" (leases are judged by the store's clock)."""
    from holdkit import one_message_held
    from okconsole import fmt

    async with one_message_held(db_url, "t.leased") as (_engine_app, msg):
        real_now = fmt.now_ms
        monkeypatch.setattr(fmt, "now_ms", lambda: real_now() + 120_000)
        app = ConsoleApp(db_url, refresh_s=5)
        async with app.run_test(size=SIZE) as pilot:
            app.jump("messages t.leased inflight")
            await wait_for(pilot, lambda: isinstance(app.screen, MessagesScreen)
                           and app.screen.query_one("#messages").row_count == 1)
            table = app.screen.query_one("#messages")
            row = " ".join(str(c) for c in table.get_row(msg))
            assert "reclaimable now" not in row and "expired" not in row, row
            assert "s" in str(table.get_cell(msg, "lease"))  # time left, e.g. "29s"


async def test_overview_shows_the_selected_signals_description(db_url):
    """The description of the selected signal is on screen, and follows the cursor."""
    from engine import signal
    from screenkit import screen_lines

    signal.once("a.first", optional=True, description="Charges the customer's card")
    signal.broadcast("b.second", optional=True)  # no description: the name stands in
    async with oke("t", database_url=db_url, bindings=[]):
        pass
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen)
                       and app.screen.query_one("#signals").row_count == 2)
        await wait_for(pilot, lambda: "a.first — Charges the customer's card" in screen_lines(app)[-2])
        await pilot.press("down")
        await wait_for(pilot, lambda: "b.second — b.second" in screen_lines(app)[-2])
        assert not any("Charges the customer's card" in line for line in screen_lines(app))
