"""What the TUI draws, read from the rendered screen (export_screenshot text), on SQLite and PostgreSQL:
numbers in full, the newest sparkline samples, live rates, the tail, writes with actor and reason,
jumps, keys and help, 80×24, a store that does not answer."""
from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path

import engine
from console_workers.shop import declare, populate
from engine import flow, oke, on, ops, signal
from engine.store import make_store
from livekit import serving
from okconsole.app import ConsoleApp
from okconsole.screens.detail import DetailScreen
from okconsole.screens.dlq import DeadLettersScreen
from okconsole.screens.overview import OverviewScreen
from okconsole.screens.tail import TailScreen
from screenkit import screen_lines, screen_text, toast_text
from consolekit import wait_for

SIZE = (160, 48)


def footer_of(app) -> str:
    """The bottom line of the screen (the footer)."""
    lines = [line for line in screen_lines(app) if line.strip()]
    return lines[-1] if lines else ""


def row_of(app, name: str) -> str:
    """The rendered line of the table row that starts with `name` ('' when not drawn)."""
    return next((line for line in screen_lines(app) if line.strip().startswith(name)), "")


async def test_numbers_widen_past_their_first_paint(db_url):
    """Lag was '—' at first paint (column 3 wide): a later '35ms' or '1.2s' is drawn whole, not '35m'."""
    await populate(db_url)
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_for(pilot, lambda: "tasks.email" in row_of(app, "tasks.email"))
        assert re.search(r"\s—\s", row_of(app, "tasks.email"))
        declare()
        async with oke("shop", database_url=db_url) as engine_app:  # no workers: they stay pending
            for n in range(12):
                await engine_app.emit("tasks.email", {"to": f"late{n}@example.com", "n": n})
        await wait_for(pilot, lambda: re.search(r"\s12\s", row_of(app, "tasks.email")))
        await pilot.pause(1.2)
        await wait_for(pilot, lambda: re.search(r"\s\d+\.\ds\s", row_of(app, "tasks.email")))


async def test_sparkline_draws_the_newest_samples(sqlite_url):
    """After 16 idle ticks a burst shows at the right end within a tick or two, not 8 ticks later."""
    await populate(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen)
                       and len(app.screen.history.get("tasks.email", ())) >= 17)
        assert row_of(app, "tasks.email").endswith("▁" * 16)
        sigs = declare()
        async with oke("shop", database_url=sqlite_url) as engine_app:
            for n in range(20):
                await engine_app.emit(sigs["emails"], {"to": f"b{n}@example.com", "n": n})
            await engine_app.drain()
        await wait_for(pilot, lambda: re.search(r"[▂▃▄▅▆▇█]▁{0,3}$", row_of(app, "tasks.email")), timeout=1.2)


async def test_live_rate_counts_from_the_tape_head_past_the_retention_cap(db_url):
    engine.reset()
    tape = signal.live("t.capped", retention={"max_count": 5}, optional=True)
    async with oke("t", database_url=db_url) as engine_app:
        for n in range(5):
            await engine_app.emit(tape, {"n": n})
        app = ConsoleApp(db_url, refresh_s=0.2)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await wait_for(pilot, lambda: "5 kept" in row_of(app, "t.capped"))
            rates = set()
            for n in range(30):  # the tape stays at its cap of 5 the whole time
                await engine_app.emit(tape, {"n": n})
                await pilot.pause(0.05)
                found = re.search(r"kept\s+—\s+—\s+(\d+\.\d)", row_of(app, "t.capped"))
                if found:
                    rates.add(float(found.group(1)))
            assert "5 kept" in row_of(app, "t.capped")
            assert max(rates) > 1.0, rates


async def test_tail_starts_at_the_last_10_badges_pauses_wraps_stamps_and_saves(db_url, tmp_path: Path):
    sigs = declare()
    async with oke("shop", database_url=db_url) as engine_app:
        for n in range(30):
            await engine_app.emit(sigs["status"], {"orderId": f"o{n}", "status": "paid"})
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=(100, 24), notifications=True) as pilot:
        app.jump("tail order-status")
        await wait_for(pilot, lambda: isinstance(app.screen, TailScreen) and app.screen.received == 10)
        await pilot.pause(0.5)
        shown = screen_text(app)
        assert '"o20"' in shown and '"o29"' in shown and '"o19"' not in shown
        screen = app.screen
        await pilot.press("p")  # pause
        async with oke("shop", database_url=db_url) as engine_app:
            for n in range(3):
                await engine_app.emit(sigs["status"], {"orderId": f"new{n}", "status": "late"})
        await wait_for(pilot, lambda: screen.received == 13)
        await pilot.pause(0.1)
        lines = screen_lines(app)
        badge = next(i for i, line in enumerate(lines) if "3 new" in line)
        assert "paused" in lines[badge] and badge < len(lines) - 1  # drawn, above the footer
        assert "? Help" in footer_of(app) and "? Help" not in lines[badge]
        await pilot.press("p")  # follow again
        await wait_for(pilot, lambda: "3 new" not in screen_text(app) and '"new2"' in screen_text(app))
        await pilot.press("t")
        await wait_for(pilot, lambda: re.search(r"^\s*\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}  \S+\.\d+  ",
                                                screen_text(app), re.M))
        await pilot.press("w")  # wrap: the long stamped lines fold instead of running off the edge
        await wait_for(pilot, lambda: any(line.lstrip().startswith('"status"') or line.lstrip().startswith("late")
                                          or line.strip().endswith("}") and "." not in line[:12]
                                          for line in screen_lines(app)))
        await pilot.press("t", "w")
        target = tmp_path / "saved.txt"
        await pilot.press("s")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "PromptScreen")
        field = app.screen.query_one("#prompt-input")
        field.value = str(target)
        await pilot.press("enter")
        await wait_for(pilot, lambda: target.exists())
        await wait_for(pilot, lambda: "saved 13 lines to" in screen_text(app))
        assert "saved.txt" in screen_text(app)  # the toast says where (a long path wraps in it)
        saved = target.read_text().splitlines()
        assert len(saved) == 13 and saved[0].endswith('{"orderId": "o20", "status": "paid"}')


async def test_tail_over_sse_starts_at_the_last_10(sqlite_url):
    sigs = declare()
    engine_app = oke("shop", database_url=sqlite_url)
    async with engine_app:
        for n in range(40):
            await engine_app.emit(sigs["status"], {"orderId": f"o{n}", "status": "paid"})
        async with serving(engine_app) as base:
            app = ConsoleApp(sqlite_url, refresh_s=0.2, tail_url=base)
            async with app.run_test(size=SIZE, notifications=True) as pilot:
                app.jump("tail order-status")
                await wait_for(pilot, lambda: isinstance(app.screen, TailScreen) and app.screen.received >= 10)
                await pilot.pause(0.5)
                assert app.screen.received == 10
                shown = screen_text(app)
                assert '"o30"' in shown and '"o39"' in shown and '"o29"' not in shown


async def test_tail_timestamps_are_the_events_own_from_the_store_and_say_so(db_url):
    """An event appended an hour ago is stamped with that time, not when the console read it, and
    the title says whose time the column holds."""
    from okconsole import fmt
    from workers.db import execute, fetch

    sigs = declare()
    async with oke("shop", database_url=db_url) as engine_app:
        for n in range(3):
            await engine_app.emit(sigs["status"], {"orderId": f"o{n}", "status": "paid"})
    await execute(db_url, "UPDATE oke_tape_events SET created_at = created_at - 3600000 WHERE seq = 2")
    [(at,)] = await fetch(db_url, "SELECT created_at FROM oke_tape_events WHERE seq = 2")
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        app.jump("tail order-status")
        await wait_for(pilot, lambda: isinstance(app.screen, TailScreen) and app.screen.received == 3)
        assert "times:" not in screen_text(app)  # no stamps, no label
        await pilot.press("t")
        await wait_for(pilot, lambda: "times: appended (the event's own)" in screen_text(app))
        [line] = [one.strip() for one in screen_lines(app) if '"o1"' in one]
        assert line.startswith(f"{fmt.clock(int(at))}  "), line


async def test_tail_over_sse_labels_its_timestamps_received(sqlite_url):
    sigs = declare()
    engine_app = oke("shop", database_url=sqlite_url)
    async with engine_app:
        await engine_app.emit(sigs["status"], {"orderId": "o1", "status": "paid"})
        async with serving(engine_app) as base:
            app = ConsoleApp(sqlite_url, refresh_s=0.2, tail_url=base)
            async with app.run_test(size=SIZE) as pilot:
                app.jump("tail order-status")
                await wait_for(pilot, lambda: isinstance(app.screen, TailScreen) and app.screen.received == 1)
                await pilot.press("t")
                await wait_for(pilot, lambda: "times: received (SSE carries no event time)" in screen_text(app))


async def read_audit(url: str):
    store = make_store(url)
    await store.open()
    try:
        return await ops.audit(store)
    finally:
        await store.close()


async def test_writes_ask_a_reason_and_record_the_actor(db_url):
    await populate(db_url)
    app = ConsoleApp(db_url, refresh_s=0.2, actor="alice")
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        app.jump("dlq tasks.email")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == 2)
        await pilot.press("R")
        await wait_for(pilot, lambda: "why (recorded in the audit log)" in screen_text(app))
        await pilot.press(*"smtp back up", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == 1)
        app.jump("audit")
        await wait_for(pilot, lambda: "smtp back up" in screen_text(app))
        assert re.search(r"alice\s+replay\s+tasks\.email\s+1\s+msg_\S+\s+smtp back up", screen_text(app))  # at, actor, action, signal, count, ids, reason
    [entry] = await read_audit(db_url)
    assert (entry.actor, entry.reason, entry.count) == ("alice", "smtp back up", 1)


async def notice_shown(pilot, app, text: str) -> None:
    await wait_for(pilot, lambda: text in screen_text(app) or text in toast_text(app))


async def test_jump_completes_names_and_refuses_unknown_ones(sqlite_url):
    await populate(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_for(pilot, lambda: "order-status" in row_of(app, "order-status"))
        await pilot.press("colon", *"dlq tas")
        await wait_for(pilot, lambda: "dlq tasks.email" in screen_text(app))  # the suggestion, drawn
        await pilot.press("right", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen) and app.screen.signal == "tasks.email")
        await pilot.press("escape")
        for jump, said in (("messages nope", "unknown signal 'nope'"), ("dlq nope", "unknown signal 'nope'"),
                           ("tail tasks.email", "only live signals have a tape"),
                           ("dlq order-status", "is a live tape")):
            app.jump(jump)
            try:
                await notice_shown(pilot, app, said)
            except AssertionError:
                raise AssertionError(f"{jump}: {toast_text(app)!r}\n{screen_text(app)}")
            assert isinstance(app.screen, OverviewScreen), jump
        app.screen.query_one("#signals").move_cursor(row=[k.value for k in app.screen.query_one("#signals").rows]
                                                     .index("tasks.email"))
        await pilot.press("t")
        await pilot.pause(0.3)
        assert isinstance(app.screen, OverviewScreen)


async def test_help_lists_every_key_of_the_screen_and_the_footer_leads_with_enter_help_jump_quit(sqlite_url):
    await populate(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await wait_for(pilot, lambda: "tasks.email" in row_of(app, "tasks.email"))
        await wait_for(pilot, lambda: "Help" in footer_of(app))
        footer = footer_of(app).split()
        assert footer[:7] == ["enter", "Open", "?", "Help", ":", "Jump", "q"], footer
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: "Keys · signals" in screen_text(app))
        for key, description in (("a", "Audit log"), ("d", "Dead letters & failures"), ("t", "Tail"),
                                 ("/", "Filter"), ("esc", "Back")):
            assert re.search(rf"\s{re.escape(key)}\s+{re.escape(description)}\s", screen_text(app)), key
        await pilot.press("escape")
        app.jump("tail order-status")
        await wait_for(pilot, lambda: isinstance(app.screen, TailScreen))
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: "Keys · tail" in screen_text(app))
        for key, description in (("c", "Clear"), ("p", "Pause/follow"), ("w", "Wrap"), ("t", "Timestamps"),
                                 ("s", "Save"), ("end", "Follow")):
            assert re.search(rf"\s{re.escape(key)}\s+{re.escape(description)}\s", screen_text(app)), key


async def test_read_only_footer_and_help_have_no_writes(sqlite_url):
    await populate(sqlite_url)
    app = ConsoleApp(sqlite_url, read_only=True, refresh_s=0.2)
    async with app.run_test(size=(200, 50), notifications=True) as pilot:
        app.jump("dlq tasks.email")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == 2)
        await pilot.pause(0.2)
        await wait_for(pilot, lambda: "Tag" in footer_of(app))
        footer = footer_of(app)
        assert "Tag" in footer and "Replay" not in footer and "Purge" not in footer, footer
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: "Keys · dead letters" in screen_text(app))
        assert "Switch pane" in screen_text(app) and "Replay" not in screen_text(app)


async def test_80x24_folds_the_groups_and_wraps_failure_messages(sqlite_url):
    engine.reset()
    jobs = signal.once("t.wordy", retries=0)
    long = "the upstream ledger refused the posting because the account was frozen by compliance review"

    @on(jobs)
    @flow("w.wordy")
    async def fail(payload, fx):
        raise RuntimeError(long)

    async with oke("t", database_url=sqlite_url) as engine_app:
        await engine_app.emit(jobs, {"n": 1})
        await engine_app.drain()
    app = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        app.jump("dlq t.wordy")
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == 1)
        await notice_shown(pilot, app, "1 group, folded (g shows them)")
        await pilot.press("g")
        await wait_for(pilot, lambda: "RuntimeError" in screen_text(app) and "g folds" in screen_text(app))
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen) and app.screen.detail is not None)
        await pilot.pause(0.3)
        side = " ".join(line[40:] for line in screen_lines(app))  # the right pane, wrapped lines joined
        assert " ".join(long.split()[:8]) in " ".join(side.split())  # wrapped by words, not cut at the edge


async def test_a_store_that_does_not_answer_shows_connecting(tmp_path: Path):
    """A PostgreSQL address that accepts connections and never answers: no crash, no blank screen."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        app = ConsoleApp(f"postgresql+asyncpg://u:p@127.0.0.1:{port}/db", refresh_s=0.2)
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            await pilot.pause(1.0)
            shown = screen_text(app)
            assert "connecting to postgresql+asyncpg://" in shown and "? Help" in shown
            assert app.store_ok is None
            await asyncio.sleep(0)
