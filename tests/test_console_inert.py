"""The TUI never obeys the data it shows: every screen over a store full of the hostile corpus
(tests/hostilestore.py) shows it visibly escaped and literally, never crashes, and writes no raw
control sequence; the real `okconsole` under a pseudo-terminal is read byte for byte."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal as signals
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import hostilestore
import pytest
from consolekit import okconsole_cmd, wait_for
from hostilekit import HOSTILE, HOSTILE_ERROR, HOSTILE_KEY, assert_inert, big_payload, visible
from hostilestore import ACTOR, APP, DESCRIPTION, FLOW, KEYED, LONG_ERROR, SIGNAL, TAPE, WORKER, seed_hostile
from screenkit import flat_text, screen_text, toast_text
from textual.command import CommandPalette
from textual.containers import VerticalScroll

from engine.display import cut, json_text, more_note
from okconsole.app import ConsoleApp
from okconsole.screens.audit import AuditScreen
from okconsole.screens.detail import DetailScreen
from okconsole.screens.dlq import DeadLettersScreen
from okconsole.screens.history import HistoryScreen
from okconsole.screens.messages import MessagesScreen
from okconsole.screens.modals import ConfirmScreen, HelpScreen
from okconsole.screens.overview import OverviewScreen
from okconsole.screens.tail import TailScreen
from okconsole.screens.trace import TraceScreen
from okconsole.screens.workers import WorkersScreen

SIZE = (200, 60)  # wide enough that the longest escaped key fits its column and a JSON line its pane
TESTS = Path(__file__).resolve().parent


def shows(app) -> str:
    """The rendered screen, checked: no raw control character reached it."""
    text = screen_text(app)
    assert_inert(text)
    return text


async def visit(pilot, screen_type, predicate=lambda app: True, timeout: float = 20) -> str:
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, screen_type) and predicate(app), timeout=timeout)
    await pilot.pause(0.2)
    return shows(app)


@pytest.mark.long
async def test_every_screen_shows_the_corpus_inert_and_literal(sqlite_url):
    seeded = await seed_hostile(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=0.3)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await overview_messages_help_and_palette(pilot)
        await message_dead_letters_and_trace(pilot, seeded)
        await tail_audit_workers_history_and_notices(pilot)


async def overview_messages_help_and_palette(pilot) -> None:
    app = pilot.app
    shown = await visit(pilot, OverviewScreen, lambda a: SIGNAL in screen_text(a) and "kept" in screen_text(a))
    assert TAPE in shown and visible(DESCRIPTION) in shown  # the about line of the selected signal

    app.open_messages(SIGNAL)
    shown = await visit(pilot, MessagesScreen, lambda a: "rows)" in screen_text(a))
    assert f"{SIGNAL} · all · newest first" in shown
    for name in KEYED:
        assert visible(HOSTILE[name]) in shown, name
    assert visible(HOSTILE_KEY) in shown

    await pilot.press("question_mark")
    shown = await visit(pilot, HelpScreen)
    assert f"Keys · messages · {SIGNAL}" in shown
    await pilot.press("escape")
    app.action_command_palette()  # its help line is parsed as markup: the screen's title escaped
    await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
    await pilot.press(*"Reverse sort")
    await wait_for(pilot, lambda: f"messages · {SIGNAL}: key s" in flat_text(app))
    shows(app)
    await pilot.press("escape")


async def message_dead_letters_and_trace(pilot, seeded: hostilestore.Seeded) -> None:
    app = pilot.app
    app.open_detail(seeded.hostile_id)
    shown = await visit(
        pilot,
        DetailScreen,
        lambda a: "Failures (newest first)" in screen_text(a) and '"markup_click"' in screen_text(a),
    )
    assert f"{seeded.hostile_id} · {SIGNAL} · delivered" in shown
    assert f"key {visible(HOSTILE_KEY)}" in shown and f"flow {FLOW}" in shown
    for name in KEYED:  # the payload pane is JSON: its strings escaped as JSON escapes them
        assert f'"{name}": {json_text(HOSTILE[name])}' in shown, name

    app.open_dlq(SIGNAL)
    shown = await visit(
        pilot, DeadLettersScreen, lambda a: "4 dead" in screen_text(a) and "Traceback" in screen_text(a)
    )
    for code, message in hostilestore.FAILURES[:3]:  # a row of the failure groups each: count, code, message
        assert re.search(rf"^ *1 +{re.escape(visible(code))} +{re.escape(visible(message))} +\S+ ago$", shown, re.M)
    assert visible(HOSTILE_KEY) in shown
    letters = app.screen
    cursor = letters._cursor_id()
    key = letters.row_facts(cursor).key
    await pilot.press("R")  # the question names the message, its key and the signal: a Label
    await visit(pilot, ConfirmScreen)
    named = f" (key {visible(key)})" if key else ""
    asked = " ".join(flat_text(app).replace("█", " ").split())  # the dialog's border left out
    assert " ".join(f"Replay the dead letter {cursor}{named} of {SIGNAL}?".split()) in asked
    await pilot.press("escape")

    app.open_detail(seeded.dead_ids[2])
    shown = await visit(pilot, DetailScreen, lambda a: "attempt 1 ·" in screen_text(a))
    assert f"attempt 1 · {visible(hostilestore.FAILURES[2][0])}" in shown
    assert f"  {visible(HOSTILE_ERROR)}" in shown
    await pilot.press("t")
    shown = await visit(pilot, TraceScreen, lambda a: "failed" in screen_text(a))
    assert f"({FLOW})" in shown and f"{FLOW} run_" in shown and visible(HOSTILE_ERROR) in shown


async def tail_audit_workers_history_and_notices(pilot) -> None:
    app = pilot.app
    app.jump(f"tail '{TAPE}'")
    shown = await visit(pilot, TailScreen, lambda a: a.screen.received == 10)
    assert f"{TAPE} · store · following" in shown
    for name in KEYED[-10:]:  # the last 10 events of the tape
        assert f'{{"event": {json_text(HOSTILE[name])}, "name": "{name}"}}' in shown, name

    app.open_audit()
    shown = await visit(pilot, AuditScreen, lambda a: "resume" in screen_text(a))
    assert visible(ACTOR) in shown and visible(HOSTILE_ERROR) in shown and HOSTILE["markup_bold"] in shown

    app.open_workers()
    shown = await visit(pilot, WorkersScreen, lambda a: "stopped" in screen_text(a))
    assert visible(WORKER) in shown and visible(APP) in shown
    app.jump("dlq nosuch")  # a notice naming every known signal
    await wait_for(pilot, lambda: "unknown signal" in toast_text(app))
    assert f"signals: {SIGNAL}, {TAPE}" in toast_text(app)
    shows(app)

    app.open_history(SIGNAL)
    shown = await visit(pilot, HistoryScreen, lambda a: "per second" in screen_text(a))
    assert f"{SIGNAL} — per second, each minute" in shown


async def test_big_payload_and_long_traceback_are_cut_with_a_note(sqlite_url):
    """A 10 MB payload and a 100 KB traceback: the panes show 64 KiB of each and say how much more."""
    seeded = await seed_hostile(sqlite_url)
    app = ConsoleApp(sqlite_url, refresh_s=0.5)
    async with app.run_test(size=SIZE) as pilot:
        started = time.monotonic()
        app.open_detail(seeded.big_id)
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen) and '"blob"' in screen_text(app), 30)
        assert time.monotonic() - started < 20
        app.screen.query_one("#payload", VerticalScroll).scroll_end(animate=False)
        _head, left_out = cut(json_text(big_payload(), indent=2))
        await wait_for(pilot, lambda: more_note(left_out) in screen_text(app))
        shows(app)

        app.open_detail(seeded.dead_ids[3])
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen) and "· Traceback" in screen_text(app))
        failures = app.screen.query_one("#failures", VerticalScroll)
        # the end is the attempt's traceback, its last 8 KiB; scrolled again until the pane is laid
        # out (a scroll made before the long text is measured stays at the top)
        await wait_for(pilot, lambda: at_end(failures) and failures.scroll_y > 0)
        _head, left_out = cut(LONG_ERROR)
        note = " ".join(more_note(left_out).split())
        for _ in range(200):  # page up to where the message was cut (the note may wrap in the pane)
            shown = pane_words(app)
            if note in shown:
                break
            failures.scroll_page_up(animate=False)
            await wait_for(pilot, lambda: pane_words(app) != shown)  # each page drawn before the next
        await wait_for(pilot, lambda: note in pane_words(app))
        assert 'File "[/x.py]", line 1, in <module>' in shows(app)


def at_end(pane: VerticalScroll) -> bool:
    """Scroll `pane` to its end; whether it has somewhere to scroll (its long text is laid out)."""
    pane.scroll_end(animate=False)
    return pane.max_scroll_y > 0


def pane_words(app) -> str:
    """The screen's words joined by single spaces, pane borders dropped: a note that wraps inside a
    bordered pane is still found whole."""
    return " ".join(screen_text(app).replace("│", " ").split())


# ------------------------------------------------------------------ the real console in a terminal


class Terminal:
    """`okconsole --db URL` on a pseudo-terminal of 120×40: every byte it writes is kept."""

    def __init__(self, url: str, cwd: Path) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
        self.proc = subprocess.Popen(
            [*okconsole_cmd(), "--db", url],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=cwd,
            close_fds=True,
            start_new_session=True,
        )
        os.close(slave)
        self.master = master
        self.raw = b""

    def read_until(self, marker: bytes, timeout: float = 30) -> None:
        """Read until `marker` has been written (after what was read before this call)."""
        start = len(self.raw)
        deadline = time.monotonic() + timeout
        while marker not in self.raw[start:]:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(
                    f"{marker!r} never shown (exit {self.proc.poll()}); the end of the output: {self.raw[-3000:]!r}"
                )
            self.read(0.1)

    def read(self, wait: float) -> None:
        ready, _, _ = select.select([self.master], [], [], wait)
        if ready:
            try:
                self.raw += os.read(self.master, 65536)
            except OSError:  # EIO: the console has gone
                pass

    def settle(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.read(0.05)

    def press(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def press_until(self, keys: str, marker: bytes, tries: int = 3) -> None:
        """Press `keys` until `marker` shows (again after 20 s, at most `tries` times)."""
        for left in range(tries - 1, -1, -1):
            self.press(keys)
            try:
                self.read_until(marker, timeout=20)
                return
            except AssertionError:
                if not left or self.proc.poll() is not None:
                    raise

    def close(self) -> None:
        if self.proc.poll() is None:
            self.press("q")
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signals.SIGKILL)
                self.proc.wait()
        os.close(self.master)


@pytest.mark.long
def test_the_terminal_gets_no_control_sequence_from_the_store(sqlite_url, tmp_path):
    """Messages (OSC 52 in a key was written to the terminal once per repaint), a message's detail
    and the dead letters (`[/]` in an error crashed the console), read as raw bytes from the pty."""
    subprocess.run([sys.executable, "-m", "hostilestore", sqlite_url], cwd=TESTS, check=True, timeout=120)
    terminal = Terminal(sqlite_url, tmp_path)
    try:
        lost = visit_in_terminal(terminal)
    finally:
        terminal.close()
    assert_inert(terminal.raw, screen=True)  # first: what reached the terminal, however far it got
    assert lost is None, lost
    assert b"\\x1b]52;c;SEFDS0VE\\x07" in terminal.raw  # the key, shown escaped


def visit_in_terminal(terminal: Terminal) -> AssertionError | None:
    """Overview, messages, a message, back, dead letters, by keys; the error if one was not reached."""
    try:
        terminal.read_until(b"kept")  # the overview, both signals drawn; the once signal is selected
        terminal.press("\r")
        terminal.read_until(b"newest first")  # the messages, newest first: the whole corpus in one payload
        terminal.settle(2)  # a few repaints
        terminal.press("\r")
        terminal.read_until(b"Failures (newest first)")
        terminal.settle(2)
        terminal.press("\x1b")
        terminal.read_until(b"newest first")
        terminal.settle(1)  # a key pressed while the screen is still switching is lost on a loaded machine
        terminal.press_until("d", b"4 dead")
        terminal.settle(2)
        assert terminal.proc.poll() is None, "the console exited"
    except AssertionError as lost:
        return lost
    return None
