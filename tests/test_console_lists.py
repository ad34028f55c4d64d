"""The TUI's lists as an operator reads them (issue 12): sorting and search answered by the store
over the whole signal, `y` copies, audit ids open, bulk purge counts, traces show errors.
Every check reads the rendered screen (export_screenshot text), on SQLite and PostgreSQL."""
from __future__ import annotations

import re

from sqlalchemy import text

from console_workers.shop import declare, populate
from engine import oke
from engine.store import make_store
from okconsole.app import ConsoleApp
from okconsole.screens.messages import MessagesScreen
from screenkit import screen_text
from test_console_tui import SIZE, wait_for

ID = re.compile(r"msg_[0-9a-z]{26}")


async def emails(url: str, n: int, attempts: dict[int, int] | None = None) -> list[str]:
    """`n` pending emails u0..u{n-1} (newest last), with some attempts counts set apart."""
    declare()
    async with oke("shop", database_url=url) as app:
        ids = [await app.emit("tasks.email", {"to": f"u{i}@example.com", "n": i}) for i in range(n)]
    store = make_store(url)
    await store.open()
    try:
        for i, value in (attempts or {}).items():
            await store.write(lambda conn, i=i, value=value: conn.execute(
                text("UPDATE oke_messages SET attempts = :a WHERE id = :id"), {"a": value, "id": ids[i]}))
    finally:
        await store.close()
    return ids


def rows_shown(app) -> list[str]:
    """The message ids on screen, top to bottom."""
    return ID.findall(screen_text(app))


async def open_list(app, pilot, rows: int) -> None:
    app.open_messages("tasks.email")
    await wait_for(pilot, lambda: isinstance(app.screen, MessagesScreen)
                   and app.screen.query_one("#messages").row_count == rows and rows_shown(app))


async def test_sort_by_any_column_is_by_value_over_the_whole_signal(db_url):
    # the largest attempts are on old messages, beyond the newest page of 50
    ids = await emails(db_url, 120, attempts={3: 100, 5: 20, 8: 9, 100: 3})
    app = ConsoleApp(db_url, refresh_s=30)
    async with app.run_test(size=SIZE) as pilot:
        await open_list(app, pilot, 50)
        assert "newest first" in screen_text(app) and rows_shown(app)[0] == ids[119]
        await pilot.press("A")  # shift+a: attempts, largest first
        await wait_for(pilot, lambda: rows_shown(app)[:4] == [ids[3], ids[5], ids[8], ids[100]])
        shown = screen_text(app)
        assert "Att. ▼" in shown and "by Att. ▼" in shown  # the header carries the sort marker
        first_rows = [line for line in shown.splitlines() if ID.search(line)][:4]
        assert [re.split(r"\s{2,}", line.strip())[3] for line in first_rows] == ["100", "20", "9", "3"]
        await pilot.press("A")  # again: ascending, smallest first, over the whole signal
        await wait_for(pilot, lambda: "Att. ▲" in screen_text(app) and rows_shown(app)[0] == ids[0])
        await pilot.press("C")  # created, newest first; s reverses it: the oldest of all 120
        await wait_for(pilot, lambda: "Created ▼" in screen_text(app) and rows_shown(app)[0] == ids[119])
        await pilot.press("s")
        await wait_for(pilot, lambda: "Created ▲" in screen_text(app) and rows_shown(app)[0] == ids[0])
        await pilot.press("n")  # keyset paging in that order
        await wait_for(pilot, lambda: rows_shown(app)[:1] == [ids[50]] and "page 2" in screen_text(app))
        # a click on a header sorts by it too
        table = app.screen.query_one("#messages")
        header = next(line for line in screen_text(app).splitlines() if " Status" in line and " Key" in line)
        await pilot.click("#messages", offset=(header.index(" Key") + 1 - table.region.x, 0))
        await wait_for(pilot, lambda: "Key ▼" in screen_text(app) and "page 1" in screen_text(app))


async def test_slash_searches_payload_key_and_failure_in_the_store(db_url):
    ids = await emails(db_url, 120)
    app = ConsoleApp(db_url, refresh_s=30)
    async with app.run_test(size=SIZE) as pilot:
        await open_list(app, pilot, 50)
        assert ids[7] not in rows_shown(app)  # an old message: not on the first page
        await pilot.press("slash", *"U7@EXAMPLE", "enter")
        await wait_for(pilot, lambda: rows_shown(app) == [ids[7]])
        assert "search 'U7@EXAMPLE'" in screen_text(app)
        await pilot.press("slash", *"nothing like it", "enter")
        await wait_for(pilot, lambda: "No messages here." in screen_text(app))
        await pilot.press("escape")  # clears the search: the newest page again
        await wait_for(pilot, lambda: rows_shown(app)[0] == ids[119] and "search '" not in screen_text(app))


async def test_y_copies_the_selected_id_and_says_so(sqlite_url):
    await populate(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=30)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await open_list(app, pilot, 6)
        await pilot.press("down", "y")
        second = rows_shown(app)[1]
        await wait_for(pilot, lambda: f"copied {second}" in screen_text(app))
        assert app.clipboard == second
