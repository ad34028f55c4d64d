"""Each failure keeps the handler's traceback (its last 8 KiB) on SQLite and PostgreSQL: `show`
prints the last attempt's, `show --full` every attempt's, `show --json` has `traceback` in each
failure, the TUI's failure history shows every attempt's; hostile text in the exception's message
and in a frame reaches the operator inert. A cancel records no traceback; a version 6 store gains
the column in place."""
from __future__ import annotations

import json
from typing import Any

import engine
from consolekit import run_okconsole, wait_for, with_store
from engine import flow, oke, ops, signal
from engine.flows import Binding
from engine.store import schema as schema_mod
from hostilekit import HOSTILE_ERROR, assert_inert, visible
from okconsole.app import ConsoleApp
from okconsole.screens.detail import DetailScreen
from screenkit import screen_text
from workers.db import execute, fetch, scalar

# a frame whose file name carries a clear-screen, a clipboard write and a bidi override
FRAME_FILE = "<evil\x1b[2J\u202egpj.py>"
_SOURCE = "def boom(n):\n    raise Hostile(MESSAGE + f' attempt {n}')\n"
MESSAGE = HOSTILE_ERROR + "\nsecond line \u2066isolated\u2069"


class Hostile(Exception):
    code = "HOSTILE"


_scope: dict[str, Any] = {"Hostile": Hostile, "MESSAGE": MESSAGE}
exec(compile(_SOURCE, FRAME_FILE, "exec"), _scope)
boom = _scope["boom"]


async def _fail(payload: Any, fx: Any) -> None:
    boom(fx.attempt)


async def dead_after_two_attempts(url: str) -> str:
    engine.reset()
    jobs = signal.once("jobs", retries=1)
    async with oke("shop", database_url=url, bindings=[Binding(jobs, flow("jobs.work", do=_fail))]) as app:
        msg = await app.emit(jobs, {"n": 1})
        await app.drain()
    return msg


async def test_each_attempt_keeps_its_traceback_and_show_prints_them_inert(db_url):
    msg = await dead_after_two_attempts(db_url)
    detail = await with_store(db_url, lambda store: ops.show(store, msg))
    assert detail.status == "dead" and [f.attempt for f in detail.failures] == [1, 2]
    for f in detail.failures:
        assert f.traceback.startswith("Traceback (most recent call last):\n")
        assert f'File "{FRAME_FILE}", line 2, in boom' in f.traceback  # stored as raised
        assert f.traceback.endswith(f"Hostile: {MESSAGE} attempt {f.attempt}\n")
    rows = await fetch(db_url, "SELECT attempt, traceback IS NOT NULL FROM oke_failures ORDER BY id")
    assert [tuple(r) for r in rows] == [(1, True), (2, True)]

    last = run_okconsole("--db", db_url, "show", msg)
    assert last.returncode == 0, last.stderr
    assert_inert(last.stdout)
    assert "traceback of attempt 2" in last.stdout and "traceback of attempt 1" not in last.stdout
    assert visible(FRAME_FILE) in last.stdout and "attempt 2" in last.stdout
    assert "1 earlier attempt(s) have a traceback too: show --full prints them" in last.stdout

    full = run_okconsole("--db", db_url, "show", msg, "--full")
    assert_inert(full.stdout)
    assert full.stdout.index("traceback of attempt 2") < full.stdout.index("traceback of attempt 1")

    as_json = run_okconsole("--db", db_url, "show", msg, "--json")
    assert_inert(as_json.stdout)
    failures = json.loads(as_json.stdout)["failures"]
    assert [f["traceback"] for f in failures] == [f.traceback for f in detail.failures]


async def test_a_cancel_records_no_traceback_and_dead_letter_lists_leave_it_out(db_url):
    msg = await dead_after_two_attempts(db_url)
    jobs = signal.once("jobs", retries=1)
    async with oke("shop", database_url=db_url, bindings=[]) as app:
        pending = await app.emit(jobs, {"n": 2})
    await with_store(db_url, lambda store: ops.cancel(store, "jobs", [pending], actor="ana", reason="not needed"))
    [cancelled] = (await with_store(db_url, lambda store: ops.show(store, pending))).failures
    assert cancelled.traceback is None
    shown = run_okconsole("--db", db_url, "show", pending)
    assert "traceback of" not in shown.stdout
    [dead] = [d for d in await with_store(db_url, lambda store: ops.dead_letters(store, "jobs")) if d.id == msg]
    assert len(dead.failures) == 2 and {f.traceback for f in dead.failures} == {None}  # read one with show


def attempt_1_traced(text: str) -> bool:
    """Attempt 1's entry is on screen with a traceback frame under it (the oldest comes last)."""
    return "attempt 1 ·" in text and text.rfind("in boom") > text.index("attempt 1 ·")


async def test_the_tui_failure_history_shows_every_attempts_traceback_inert(db_url):
    msg = await dead_after_two_attempts(db_url)
    app = ConsoleApp(db_url, refresh_s=0.3)
    async with app.run_test(size=(200, 60)) as pilot:
        app.open_detail(msg)
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen) and "traceback" in screen_text(app))
        text = screen_text(app)
        assert_inert(text)
        assert "Traceback (most recent call last):" in text and "in boom" in text  # attempt 2's, on top
        assert "\\x1b[2J\\u202egpj.py" in text  # the frame's file name, escaped
        app.screen.query_one("#failures").scroll_end(animate=False)
        await wait_for(pilot, lambda: attempt_1_traced(screen_text(app)))
        assert_inert(screen_text(app))


async def test_a_version_6_store_gains_the_traceback_column_and_keeps_its_failures(db_url):
    msg = await dead_after_two_attempts(db_url)
    await execute(db_url, "ALTER TABLE oke_failures DROP COLUMN traceback")  # the layout version 6 had
    await execute(db_url, "UPDATE oke_meta SET value = '6' WHERE key = 'schema_version'")
    old = await with_store(db_url, lambda store: ops.show(store, msg))  # upgrades in place
    assert int(await scalar(db_url, "SELECT value FROM oke_meta WHERE key = 'schema_version'")) == 11
    assert schema_mod.SCHEMA_VERSION == 11
    assert [(f.attempt, f.code, f.traceback) for f in old.failures] == [(1, "HOSTILE", None), (2, "HOSTILE", None)]
    again = await dead_after_two_attempts(db_url)
    assert all(f.traceback for f in (await with_store(db_url, lambda store: ops.show(store, again))).failures)
