"""The console's layout as a person reads it (issue 37, friction): a sort on a slow store keeps the
rows, header and title in step; at 80 columns empty columns give way first and a note names every
column left out; `w` opens the workers screen, whose columns say what they count; `?` scrolls to its
last line at 80×24; no scrollbar remnant after navigating; the history charts carry a y scale and
switch signal. Every check reads the rendered screen (export_screenshot text)."""

from __future__ import annotations

import asyncio
import re

import pytest

from console_workers.shop import declare, populate
from engine import oke, signal
from okconsole.app import ConsoleApp
from okconsole.screens.history import HistoryScreen
from okconsole.screens.messages import MessagesScreen
from okconsole.screens.overview import OverviewScreen
from okconsole.screens.workers import WorkersScreen
from screenkit import screen_lines, screen_text
from consolekit import wait_for

ID = re.compile(r"msg_[0-9a-z]{26}")
KEYS = ["ka", "kb", "kc", "kd", "ke", "kf"]
LONG_SIGNAL = "notifications.reminders"  # with the shop's signals: wider than 80 columns
SCROLLBAR_GLYPHS = re.compile("[▁▂▃▄▅▆▇█▌▍▎▏▊▋▉]")


async def _emails_with_keys(url: str) -> list[str]:
    sigs = declare()
    async with oke("shop", database_url=url) as app:
        return [await app.emit(sigs["emails"], {"to": f"u{i}@example.com", "n": i}, key=k) for i, k in enumerate(KEYS)]


def _header(app, first: str) -> str:
    return next((line for line in screen_lines(app) if line.strip().startswith(first)), "")


def _shown_keys(app) -> list[str]:
    return [k for line in screen_lines(app) if ID.search(line) for k in line.split() if k in KEYS]


async def test_a_slow_sort_keeps_the_old_rows_until_the_new_page_then_changes_all_together(sqlite_url):
    ids = await _emails_with_keys(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=30)
    async with app.run_test(size=(160, 30)) as pilot:
        app.open_messages("tasks.email")
        await wait_for(
            pilot,
            lambda: (
                isinstance(app.screen, MessagesScreen)
                and ID.findall(screen_text(app))[:1] == [ids[-1]]
                and "newest first" in screen_text(app)
            ),
        )
        real_call = app.data.call

        async def slow_call(fn, *args, **kwargs):  # the store answers a page in 1.5 s, as under load
            await asyncio.sleep(1.5)
            return await real_call(fn, *args, **kwargs)

        app.data.call = slow_call
        await pilot.press("K")  # sort by key, largest first
        seen = []
        for _ in range(40):
            await pilot.pause(0.05)
            seen.append((screen_text(app), _header(app, "Id")))
            if "Key ▼" in seen[-1][1]:
                break
        await wait_for(pilot, lambda: _shown_keys(app) == sorted(KEYS, reverse=True))
        seen.append((screen_text(app), _header(app, "Id")))
        for text, header in seen:
            assert len(ID.findall(text)) == len(KEYS), text  # never an empty table
            sorted_header, sorted_title = "Key ▼" in header, "by Key ▼" in text
            assert sorted_header == sorted_title, text  # the header and the title agree
            keys = _shown_keys(app) if text is seen[-1][0] else [k for k in text.split() if k in KEYS]
            assert keys == (sorted(KEYS, reverse=True) if sorted_header else list(reversed(KEYS))), text


async def _long_signal(url: str) -> None:
    await populate(url)
    reminders = signal.once(LONG_SIGNAL, optional=True)
    async with oke("reminders", database_url=url) as app:
        await app.emit(reminders, {"n": 1})


def _cols_note(app) -> str:
    return next((line.strip() for line in screen_lines(app) if "left out at" in line), "")


async def test_80_columns_never_hide_a_column_without_naming_it(sqlite_url):
    await _long_signal(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen) and LONG_SIGNAL in screen_text(app))
        await pilot.pause(0.3)
        header, note = _header(app, "Signal"), _cols_note(app)
        table = app.screen.query_one("#signals")
        assert table.virtual_size.width <= table.size.width, header  # nothing past the right edge
        for label in ("Pending", "Dead", "Deliv/s", "Dead/s", "Kind", "Lag", "Activity", "Inflight", "Delivered"):
            assert label in header.split() or label in note, (label, header, note)
        assert "Dead/s" in header  # worth more than Kind or Activity
        await pilot.resize_terminal(200, 50)
        await wait_for(pilot, lambda: "Activity" in _header(app, "Signal"))
        assert _cols_note(app) == ""

        app.open_messages("tasks.email")
        await wait_for(pilot, lambda: isinstance(app.screen, MessagesScreen) and ID.search(screen_text(app)))
        assert "Owner" in _header(app, "Id")  # every column at 200
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: "left out at 80" in screen_text(app))
        header, note = _header(app, "Id"), _cols_note(app)
        # nothing is inflight: Owner and Lease left say nothing and go before Created
        assert "Created" in header and "Owner (empty)" in note and "Lease left (empty)" in note, (header, note)
        for label in ("Status", "Key", "Att.", "Owner", "Lease left", "Created", "Note"):
            assert label in header or label in note, (label, header, note)


async def test_w_opens_the_workers_screen_whose_columns_say_what_they_count(sqlite_url):
    await populate(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen) and "tasks.email" in screen_text(app))
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: "Keys · signals" in screen_text(app))
        assert re.search(r"\sw\s+Workers\s", screen_text(app)), screen_text(app)
        await pilot.press("escape")
        await pilot.press("w")
        await wait_for(pilot, lambda: isinstance(app.screen, WorkersScreen) and "Worker" in screen_text(app))
        header = _header(app, "Worker")
        assert "Leased now" in header and "Held at last beat" in header, header
        assert "Held at last beat: what the worker counted at its last heartbeat" in screen_text(app)


async def test_help_scrolls_to_its_last_line_at_80x24(sqlite_url):
    await populate(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        app.open_messages("tasks.email")  # the screen with the most keys
        await wait_for(pilot, lambda: isinstance(app.screen, MessagesScreen) and ID.search(screen_text(app)))
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: "Keys · messages" in screen_text(app))
        assert "esc closes" not in screen_text(app)  # more keys than rows: the rest is below
        await pilot.press("end")
        await wait_for(pilot, lambda: "esc closes · --read-only hides every write" in screen_text(app))
        assert "move the cursor, scroll" in screen_text(app)


@pytest.mark.long
async def test_navigating_away_and_back_leaves_no_scrollbar_remnants(sqlite_url):
    """`▌` and `▅▅` after navigation were the thumbs of scrollbars (a table wider than the screen,
    a help taller than it); drawn in 256 colours they read as stray glyphs. Fitted tables have none."""
    await _long_signal(sqlite_url)
    for size in ((80, 24), (200, 50)):
        app = ConsoleApp(sqlite_url, refresh_s=0.2)
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen) and LONG_SIGNAL in screen_text(app))
            for jump in ("messages tasks.email", "history tasks.email", "workers", "dlq tasks.email"):
                app.jump(jump)
                await wait_for(pilot, lambda: not isinstance(app.screen, OverviewScreen))
                await pilot.pause(0.5)
                await pilot.press("escape")
                await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen))
                await pilot.pause(0.5)
                header = _header(app, "Signal")
                activity = header.find("Activity")
                for line in screen_lines(app):
                    outside = line[:activity] if activity >= 0 and ("once" in line or "live" in line) else line
                    assert not SCROLLBAR_GLYPHS.search(outside), (size, jump, screen_text(app))


async def test_history_charts_have_a_y_scale_and_s_switches_signal(sqlite_url):
    await populate(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen) and "tasks.email" in screen_text(app))
        app.jump("history tasks.email")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen) and "peak" in screen_text(app))
        lines = screen_lines(app)
        head = next(n for n, line in enumerate(lines) if line.strip().startswith("delivered/s"))
        peak = lines[head].split()[-1]
        scale = [line.split("┤")[0].strip() for line in lines[head + 1 :] if "┤" in line]
        chart = scale[: next(n for n, label in enumerate(scale) if label == "0") + 1]
        assert float(chart[0]) == float(peak) > 0 and chart[-1] == "0" and set(chart[1:-1]) <= {""}, lines
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: "Keys · history" in screen_text(app))
        assert re.search(r"\ss\s+Next signal\s", screen_text(app)), screen_text(app)
        await pilot.press("escape")
        await pilot.press("s")  # the next once/broadcast signal by name
        await wait_for(pilot, lambda: "orders.placed — per second" in screen_text(app))
        await pilot.press("S")
        await wait_for(pilot, lambda: "tasks.email — per second" in screen_text(app))


async def test_the_activity_sparkline_starts_under_its_header_from_the_first_samples(sqlite_url):
    """A new console (each browser tab of `okconsole web` is one) has a few samples: they are drawn
    from the column's left edge, not padded cells away from its header."""
    await populate(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=0.2)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen)
                       and 2 <= len(app.screen.history.get("tasks.email", ())))
        header = _header(app, "Signal")
        column = header.index("Activity")
        row = next(line for line in screen_lines(app) if line.strip().startswith("tasks.email"))
        assert row[column] in "▁▂▃▄▅▆▇█", (header, row)
