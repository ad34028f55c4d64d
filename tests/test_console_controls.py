"""The operator controls in the TUI, driven by Pilot over a real store on SQLite and
PostgreSQL: pause / resume on the overview, cancel / delete / retry on the screens that list
messages, each confirmed with the count and a reason, refused (and hidden) under --read-only."""
from __future__ import annotations

from console_workers.shop import declare, populate
from consolekit import SIZE, wait_for, with_store
from engine import oke, ops
from okconsole.app import ConsoleApp
from okconsole.screens.detail import DetailScreen
from okconsole.screens.dlq import DeadLettersScreen
from okconsole.screens.messages import MessagesScreen
from okconsole.screens.overview import OverviewScreen
from screenkit import screen_text, toast_text
from test_ops import sql_write


async def one_pending(url: str) -> str:
    """A pending tasks.email message nobody has taken (no worker runs after the emit)."""
    sigs = declare()
    async with oke("shop", database_url=url) as app:
        return await app.emit(sigs["emails"], {"to": "later@example.com", "n": 99}, key="later@example.com")


async def status_of(url: str, msg_id: str) -> str:
    return (await with_store(url, lambda store: ops.show(store, msg_id))).status


async def confirm_with(pilot, app, question: str, reason: str) -> None:
    await wait_for(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen" and question in screen_text(app)
                   and getattr(app.focused, "id", None) == "reason")  # typed keys go to the reason
    await pilot.press(*reason, "enter")


async def test_pause_and_resume_from_the_overview_mark_the_signal(db_url):
    await populate(db_url)
    app = ConsoleApp(db_url, refresh_s=0.2, actor="ana")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen)
                       and app.screen.query_one("#signals").row_count == 3)
        table = app.screen.query_one("#signals")
        table.move_cursor(row=table.get_row_index("tasks.email"))
        await pilot.press("p")
        await confirm_with(pilot, app, "Pause tasks.email? No worker will take its messages", "incident 42")
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen) and "once paused" in screen_text(app))
        row = next(line for line in screen_text(app).splitlines() if "tasks.email" in line and "once" in line)
        assert "paused" in row
        assert "paused: no worker takes its messages (u resumes)" in screen_text(app)
        stats = {s.signal: s for s in await with_store(db_url, ops.stats)}
        assert stats["tasks.email"].paused is True
        await pilot.press("u")
        await confirm_with(pilot, app, "Resume tasks.email?", "fixed")
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen) and "once paused" not in screen_text(app))
    entries = await with_store(db_url, lambda store: ops.audit(store))
    assert [(e.action, e.actor, e.reason) for e in entries[:2]] == [("resume", "ana", "fixed"),
                                                                    ("pause", "ana", "incident 42")]


async def test_cancel_on_the_messages_list_and_retry_on_the_detail(db_url):
    await populate(db_url)
    pending = await one_pending(db_url)
    app = ConsoleApp(db_url, refresh_s=0.2, actor="ana")
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        app.open_messages("tasks.email", "pending")
        await wait_for(pilot, lambda: isinstance(app.screen, MessagesScreen) and pending in screen_text(app))
        await pilot.press("question_mark")  # the help lists every key of the screen
        await wait_for(pilot, lambda: "Keys · messages" in screen_text(app))
        assert all(k in screen_text(app) for k in ("Cancel message", "Delete finished", "Retry now"))
        await pilot.press("escape")
        await pilot.press("x")
        await confirm_with(pilot, app, f"Cancel {pending} (key later@example.com) of", "wrong address")
        await wait_for(pilot, lambda: "cancelled 1 message(s) of tasks.email" in toast_text(app))
        assert await status_of(db_url, pending) == "dead"
        await wait_for(pilot, lambda: pending not in screen_text(app))  # the pending list reloaded

        waiting = await one_pending(db_url)
        await with_store(db_url, lambda store: sql_write(
            store, f"UPDATE oke_messages SET run_at = 99999999999999 WHERE id = '{waiting}'"))
        app.open_detail(waiting)
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen) and app.screen.detail is not None)
        await pilot.press("N")
        await confirm_with(pilot, app, f"Retry now {waiting}", "customer waiting")
        await wait_for(pilot, lambda: "retried 1 message(s) of tasks.email" in toast_text(app))
        await wait_for(pilot, lambda: app.screen.detail.due_at is None)  # reloaded: due now
        await pilot.press("N")  # nothing left to retry: not offered, and said why
        await wait_for(pilot, lambda: f"{waiting} is pending and already due: nothing to retry" in toast_text(app))
        assert isinstance(app.screen, DetailScreen)


async def test_delete_tagged_dead_letters(db_url):
    await populate(db_url)
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        app.jump("dlq tasks.email")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == 2)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: "Keys · dead letters" in screen_text(app))
        assert "Delete finished" in screen_text(app) and "Cancel message" not in screen_text(app)
        await pilot.press("escape")
        await pilot.press("space", "space", "X")
        await confirm_with(pilot, app, "Delete 2 messages of tasks.email?", "old bounces")
        await wait_for(pilot, lambda: "deleted 2 message(s) of tasks.email" in toast_text(app))
        await wait_for(pilot, lambda: app.screen.query_one("#letters").row_count == 0)
    stats = {s.signal: s for s in await with_store(db_url, ops.stats)}
    assert stats["tasks.email"].dead == 0


async def test_read_only_hides_and_refuses_the_controls(db_url):
    await populate(db_url)
    pending = await one_pending(db_url)
    app = ConsoleApp(db_url, read_only=True, refresh_s=0.2)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen)
                       and app.screen.query_one("#signals").row_count == 3)
        assert "Pause" not in screen_text(app) and "Resume" not in screen_text(app)
        await pilot.press("p")
        app.open_messages("tasks.email", "pending")
        await wait_for(pilot, lambda: isinstance(app.screen, MessagesScreen) and pending in screen_text(app))
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: "Keys · messages" in screen_text(app))
        assert "Cancel message" not in screen_text(app) and "Retry now" not in screen_text(app)
        await pilot.press("escape")
        await pilot.press("x", "X", "N")
        await pilot.pause(0.3)
        assert isinstance(app.screen, MessagesScreen)  # no confirmation was offered
        app.screen.action_control("cancel")  # even when asked directly: refused, with a notice
        await wait_for(pilot, lambda: "read-only mode: writes are disabled" in toast_text(app))
    assert await status_of(db_url, pending) == "pending"
    stats = {s.signal: s for s in await with_store(db_url, ops.stats)}
    assert stats["tasks.email"].paused is False
