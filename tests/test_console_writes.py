"""The TUI's write dialogs as a person meets them, driven by Pilot over a real store on SQLite and
PostgreSQL and read from the rendered screen: a single-row write names the message (id and key)
and acts on it even when the list has moved under the dialog; a control the status does not allow
is not offered, saying why; edit-and-replay checks the schema in the editor and keeps the edit; the
palette lists each command once; the tail's save counts the lines it saves."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from console_workers.shop import declare, populate
from consolekit import SIZE, wait_for, with_store
from engine import oke, ops
from okconsole.app import ConsoleApp
from okconsole.screens.audit import AuditScreen
from okconsole.screens.messages import PAGE, MessagesScreen
from okconsole.screens.overview import OverviewScreen
from okconsole.screens.tail import TailScreen
from screenkit import flat_text, screen_lines, screen_text, toast_text


async def emit_pending(url: str, *keys: str) -> Any:
    """Pending tasks.email messages nobody takes (no worker runs after the emit): the id, or ids."""
    sigs = declare()
    async with oke("shop", database_url=url) as app:
        ids = [await app.emit(sigs["emails"], {"to": key, "n": 1}, key=key) for key in keys]
    return ids[0] if len(ids) == 1 else ids


async def status_of(url: str, msg_id: str) -> str:
    return (await with_store(url, lambda store: ops.show(store, msg_id))).status


def words(app) -> str:
    """The screen's words (a dialog's border glyphs dropped): a question that wraps is found whole."""
    return " ".join(flat_text(app).replace("█", " ").split())


def cursor_id(screen) -> str:
    table = screen.query_one("#messages")
    return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value


async def test_a_single_row_write_names_the_message_and_acts_on_it_after_the_list_moved(db_url):
    await populate(db_url)
    older = await emit_pending(db_url, "older@example.com")
    named = await emit_pending(db_url, "named@example.com")
    app = ConsoleApp(db_url, refresh_s=0.2, actor="ana")
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        app.open_messages("tasks.email", "pending")
        await wait_for(pilot, lambda: isinstance(app.screen, MessagesScreen) and named in screen_text(app))
        messages = app.screen
        assert cursor_id(messages) == named  # newest first: the cursor is on it
        await pilot.press("x")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen")
        question = words(app)
        assert f"Cancel {named} (key named@example.com) of tasks.email?" in question, question

        # the list moves under the dialog (a load that was running when it opened lands): a page of
        # newer messages pushes the named one off it, and the cursor's row is another message now
        newer = await emit_pending(db_url, *[f"newer{n}@example.com" for n in range(PAGE)])
        await messages.load()
        assert named not in messages.query_one("#messages").rows and cursor_id(messages) in newer
        await pilot.press(*"wrong address", "enter")
        await wait_for(pilot, lambda: "cancelled 1 message(s) of tasks.email" in toast_text(app))
    assert await status_of(db_url, named) == "dead"
    assert await status_of(db_url, newer[-1]) == "pending" and await status_of(db_url, older) == "pending"
    [entry] = [e for e in await with_store(db_url, ops.audit) if e.action == "cancel"]
    assert (entry.ids, entry.reason, entry.actor) == ([named], "wrong address", "ana")


async def test_a_control_the_status_does_not_allow_is_not_offered_and_says_why(db_url):
    await populate(db_url)
    due = await emit_pending(db_url, "due@example.com")
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        app.open_messages("tasks.email", "dead")
        await wait_for(pilot, lambda: isinstance(app.screen, MessagesScreen) and app.screen.rows
                       and "bounce.test" in screen_text(app))
        dead = cursor_id(app.screen)
        await pilot.press("x")
        await wait_for(pilot, lambda: f"{dead} is dead: nothing to cancel" in toast_text(app))
        await pilot.press("N")
        await wait_for(pilot, lambda: f"{dead} is dead: nothing to retry" in toast_text(app))
        assert isinstance(app.screen, MessagesScreen)  # no dialog, no reason asked

        await pilot.press("2")  # pending: due already, so nothing to retry; nor is it finished
        await wait_for(pilot, lambda: due in screen_text(app) and cursor_id(app.screen) == due)
        await pilot.press("N")
        await wait_for(pilot, lambda: f"{due} is pending and already due: nothing to retry" in toast_text(app))
        await pilot.press("X")
        await wait_for(pilot, lambda: f"{due} is pending: only delivered or dead messages are deleted"
                       in toast_text(app))
        assert isinstance(app.screen, MessagesScreen)
    assert await status_of(db_url, dead) == "dead" and await status_of(db_url, due) == "pending"
    assert await with_store(db_url, ops.audit) == []


async def test_the_palette_lists_each_command_once(db_url):
    await populate(db_url)
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen)
                       and app.screen.query_one("#signals").row_count == 3)
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "CommandPalette")
        await pilot.press(*"audit log")
        await wait_for(pilot, lambda: "Audit log" in screen_text(app))
        await pilot.pause(0.5)  # every provider has answered
        listed = screen_lines(app)[:-1]  # the palette's list; the last line is the footer (`a Audit log`)
        assert sum(line.count("Audit log") for line in listed) == 1, "\n".join(listed)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, AuditScreen))


async def test_the_tail_save_counts_the_lines_when_it_saves(db_url, tmp_path: Path):
    sigs = declare()
    async with oke("shop", database_url=db_url) as engine_app:
        for n in range(10):
            await engine_app.emit(sigs["status"], {"orderId": f"o{n}", "status": "paid"})
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        app.jump("tail order-status")
        await wait_for(pilot, lambda: isinstance(app.screen, TailScreen) and app.screen.received == 10)
        tail = app.screen
        await pilot.press("s")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "PromptScreen")
        asked = words(app)
        # events keep coming while the question is open
        async with oke("shop", database_url=db_url) as engine_app:
            for n in range(3):
                await engine_app.emit(sigs["status"], {"orderId": f"late{n}", "status": "late"})
        await wait_for(pilot, lambda: tail.received == 13)
        assert not re.search(r"\b10 lines\b", asked), asked  # no count that is stale by the time it saves
        target = tmp_path / "saved.txt"
        app.screen.query_one("#prompt-input").value = str(target)
        await pilot.press("enter")
        await wait_for(pilot, lambda: "saved 13 lines to" in toast_text(app))
    saved = target.read_text().splitlines()
    assert len(saved) == 13 and '"late2"' in saved[-1]


async def test_cancel_of_a_running_message_names_it_and_stops_its_handler(db_url):
    """`x` on an inflight message under a live lease: the question names the id and key and says its
    handler stops; confirmed, the holder (here, an app in this process) cancels the handler and the
    message ends dead, Cancelled with the reason typed."""
    import asyncio

    from engine import flow, on, signal

    started, stopped = asyncio.Event(), asyncio.Event()

    async def slow(payload, fx):
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()

    jobs = signal.once("t.slow", retries=3)
    on(jobs, flow("w.t.slow", do=slow))
    async with oke("holder", database_url=db_url) as holder:
        msg = await holder.emit(jobs, {"n": 1}, key="cust-17")
        drain = asyncio.create_task(holder.drain(concurrency=1))
        await asyncio.wait_for(started.wait(), 20)
        app = ConsoleApp(db_url, refresh_s=0.2, actor="ana")
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            app.open_messages("t.slow", "inflight")
            await wait_for(pilot, lambda: isinstance(app.screen, MessagesScreen) and msg in screen_text(app))
            await pilot.press("x")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen")
            question = words(app)
            assert f"Stop the running handler of {msg} (key cust-17) of t.slow?" in question, question
            await pilot.press(*"runaway job", "enter")
            await wait_for(pilot, lambda: "asked the worker of 1 running message(s) to stop" in toast_text(app))
        await asyncio.wait_for(drain, 20)
    assert stopped.is_set() and await status_of(db_url, msg) == "dead"
    failure = (await with_store(db_url, lambda store: ops.show(store, msg))).failures[-1]
    assert (failure.code, failure.message) == ("Cancelled", "runaway job")
