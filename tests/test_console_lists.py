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
from consolekit import SIZE, wait_for

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
        # the first paint may still be settling under load: wait until the newest row is on top
        await wait_for(pilot, lambda: "newest first" in screen_text(app) and rows_shown(app)[:1] == [ids[119]])
        await pilot.press("A")  # shift+a: attempts, largest first
        await wait_for(pilot, lambda: rows_shown(app)[:4] == [ids[3], ids[5], ids[8], ids[100]])
        shown = screen_text(app)
        assert "Att. ▼" in shown and "by Att. ▼" in shown  # the header carries the sort marker
        first_rows = [line for line in shown.splitlines() if ID.search(line)][:4]
        assert [re.split(r"\s{2,}", line.strip())[3] for line in first_rows] == ["100", "20", "9", "3"]
        await pilot.press("A")  # again: ascending, smallest first, over the whole signal
        await wait_for(pilot, lambda: "Att. ▲" in screen_text(app) and rows_shown(app)[:1] == [ids[0]])
        await pilot.press("C")  # created, newest first; s reverses it: the oldest of all 120
        await wait_for(pilot, lambda: "Created ▼" in screen_text(app) and rows_shown(app)[:1] == [ids[119]])
        await pilot.press("s")
        await wait_for(pilot, lambda: "Created ▲" in screen_text(app) and rows_shown(app)[:1] == [ids[0]])
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
        await wait_for(pilot, lambda: rows_shown(app)[:1] == [ids[119]] and "search '" not in screen_text(app))


async def test_y_copies_the_selected_id_and_says_so(sqlite_url):
    await populate(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=30)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await open_list(app, pilot, 6)
        await pilot.press("down", "y")
        second = rows_shown(app)[1]
        await wait_for(pilot, lambda: f"copied {second}" in screen_text(app))
        assert app.clipboard == second


async def dead_letters(url: str, n: int) -> list[str]:
    """`n` dead letters of t.many, newest first; the odd ones failed with "no 1", the even "no 0"."""
    from engine import flow, on, signal

    jobs = signal.once("t.many", retries=0)

    @on(jobs)
    @flow("w.many")
    async def fail(payload, fx):
        raise RuntimeError(f"no {payload % 2}")

    async with oke("t", database_url=url) as engine_app:
        ids = [await engine_app.emit(jobs, i) for i in range(n)]
        await engine_app.drain()
    return ids[::-1]


async def test_purge_honours_tags_and_filter_with_the_exact_count_and_audit_opens_ids(db_url):
    from okconsole.screens.audit import AuditScreen
    from okconsole.screens.detail import DetailScreen
    from okconsole.screens.dlq import DeadLettersScreen
    from okconsole.screens.modals import ConfirmScreen

    ids = await dead_letters(db_url, 10)
    app = ConsoleApp(db_url, refresh_s=30)
    async with app.run_test(size=SIZE) as pilot:
        app.jump("dlq t.many")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == 10)
        app.screen.query_one("#letters").focus()
        await pilot.press("space", "space", "P")  # tags the newest two
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "Delete 2 tagged dead letters of t.many?" in screen_text(app)
        await pilot.press(*"tagged two", "enter")  # every write asks a reason
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == 8 and "8 dead" in screen_text(app))
        assert ids[0] not in rows_shown(app) and ids[1] not in rows_shown(app)

        await pilot.press("slash", *"no 1", "enter", "P")  # the odd ones left: 7, 5, 3, 1
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "Delete 4 matching 'no 1' dead letters of t.many?" in screen_text(app)
        await pilot.press(*"odd ones", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen) and "4 dead" in screen_text(app))
        await pilot.press("escape", "P")  # no tag, no filter: all of them, counted by the store
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "Delete 4 dead letters of t.many?" in screen_text(app)
        await pilot.press("escape")

        app.open_audit()
        await wait_for(pilot, lambda: isinstance(app.screen, AuditScreen)
                       and app.screen.query_one("#audit").row_count == 2)
        shown = screen_text(app)
        newest = next(line for line in shown.splitlines() if " purge " in line and "matching" not in line)
        odd = [i for i in ids if ids.index(i) % 2 == 0][1:]  # ids[2], [4]… (newest first): emitted 7, 5, 3, 1
        assert "+2" in newest and any(i in newest for i in odd)  # the ids, the first two of four
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen))
        assert app.screen.message_id in odd


async def test_trace_shows_failed_runs_errors_under_the_message_they_handled(db_url):
    from okconsole.screens.trace import TraceScreen

    await populate(db_url)
    store = make_store(db_url)
    await store.open()
    try:
        from engine import ops
        dead = (await ops.dead_letters(store, "tasks.email"))[0]
    finally:
        await store.close()
    app = ConsoleApp(db_url, refresh_s=30)
    async with app.run_test(size=SIZE) as pilot:
        app.open_trace(dead.parent_run_id)
        await wait_for(pilot, lambda: isinstance(app.screen, TraceScreen) and dead.id in screen_text(app))
        lines = screen_text(app).splitlines()
        mail = next(i for i, line in enumerate(lines) if f"✉ tasks.email {dead.id}" in line)
        under = lines[mail + 1]
        assert "workers.email" in under and "failed" in under and f"{dead.key} refused the message" in under
        assert under.index("workers.email") > lines[mail].index("✉")  # nested under the message
        await pilot.press("slash", *"nothing here", "enter")
        await wait_for(pilot, lambda: dead.id not in screen_text(app) and "filter 'nothing here'" in screen_text(app))
        await pilot.press("slash", *dead.id[-8:], "enter")
        await wait_for(pilot, lambda: dead.id in screen_text(app))


async def test_slash_filters_a_messages_failures_and_trace(sqlite_url):
    from okconsole.screens.detail import DetailScreen

    ids = await dead_letters(sqlite_url, 1)
    app = ConsoleApp(sqlite_url, refresh_s=30)
    async with app.run_test(size=SIZE) as pilot:
        app.open_detail(ids[0])
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen) and "no 0" in screen_text(app))
        await pilot.press("slash", *"E_NOPE", "enter")
        # the filter hides the panes' lines; the header's verdict line ("why: dead … last: no 0") stays
        await wait_for(pilot, lambda: "no 0" not in panes_text(app) and "filter 'E_NOPE'" in screen_text(app))
        await pilot.press("escape")
        await wait_for(pilot, lambda: "no 0" in panes_text(app))


def panes_text(app) -> str:
    """The screen's text without the message screen's one-line verdict (`why: …`)."""
    return "\n".join(line for line in screen_text(app).splitlines() if not line.lstrip().startswith("why:"))


async def test_bulk_actions_after_a_filter_take_every_match_in_the_store(db_url):
    """The screen loads the newest 200 letters; 115 of the 230 in the store failed "no 1", 100 of
    them loaded. A and P after `/no 1` ask about all 115 and act on all 115 (the CLI's --match)."""
    from okconsole.screens.dlq import LIMIT, DeadLettersScreen
    from okconsole.screens.modals import ConfirmScreen

    await dead_letters(db_url, LIMIT + 30)
    app = ConsoleApp(db_url, refresh_s=30)
    async with app.run_test(size=SIZE) as pilot:
        app.jump("dlq t.many")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == LIMIT)
        app.screen.query_one("#letters").focus()
        await pilot.press("slash", *"no 1", "enter", "A")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "Replay all 115 dead letters of t.many matching 'no 1'?" in screen_text(app), screen_text(app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen))
        await pilot.press("P")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "Delete 115 matching 'no 1' dead letters of t.many?" in screen_text(app), screen_text(app)
        await pilot.press(*"odd ones", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen) and "115 dead" in screen_text(app))
    store = make_store(db_url)
    await store.open()
    try:
        from engine import ops

        letters = await ops.dead_letters(store, "t.many", 1000)
    finally:
        await store.close()
    assert len(letters) == 115
    assert all(d.failures[-1].message == "no 0" for d in letters)
