"""`okconsole web` (SPEC §13): the real CLI serves the TUI with textual-serve; a real headless
Chromium loads it, and the test reads the terminal emulator's own text (xterm.js's buffer, rows
as the page shows them) over the DevTools protocol: the overview's signal names, the store and
the read-only mode the served command line carried, and a write key that does nothing."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time

import pytest

from consolekit import okconsole_cmd
from engine import flow, oke, on, ops, signal
from livekit import free_port, wait_listening
from test_browser import Chromium, chromium  # noqa: F401  (the fixture: skip without Chromium, fail in CI)

# textual.js keeps its xterm.js Terminal to itself: catch it as it is assigned (`this.terminal = …`)
CATCH_TERMINAL = """
Object.defineProperty(Object.prototype, "terminal", {
  configurable: true,
  set(value) {
    (window.__terminals = window.__terminals || []).push(value);
    Object.defineProperty(this, "terminal", {value, writable: true, configurable: true, enumerable: true});
  },
});
"""
SCREEN_TEXT = """(() => {
  const term = (window.__terminals || [])[0];
  if (!term) return "";
  const buffer = term.buffer.active, rows = [];
  for (let i = 0; i < term.rows; i++) { const line = buffer.getLine(i); rows.push(line ? line.translateToString(true) : ""); }
  return rows.join("\\n");
})()"""


class Browser(Chromium):
    """Chromium with any DevTools call, not only Runtime.evaluate."""

    async def call(self, method: str, params: dict | None = None) -> dict:
        assert self.ws is not None
        self._next += 1
        ident = self._next
        await self.ws.send(json.dumps({"id": ident, "method": method, "params": params or {}}))
        while True:
            message = json.loads(await asyncio.wait_for(self.ws.recv(), 10))
            if message.get("id") == ident:
                return message.get("result", {})

    async def screen(self) -> str:
        return await self.evaluate(SCREEN_TEXT)

    async def wait_text(self, *needles: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = await self.screen()
            if all(n in text for n in needles):
                return text
            await asyncio.sleep(0.2)
        raise AssertionError(f"{needles} not on the page's terminal; it shows:\n{text}")

    async def press(self, key: str) -> None:
        """A key typed into the page's terminal, as a person would (focus, then a key event)."""
        await self.evaluate("window.__terminals[0].focus()")
        await self.call("Input.dispatchKeyEvent", {"type": "keyDown", "text": key, "key": key})
        await self.call("Input.dispatchKeyEvent", {"type": "keyUp", "key": key})


async def seed(url: str) -> str:
    """A store with two signals, one dead letter among them; returns the dead letter's id."""
    email = signal.once("shop.email", retries=0)
    signal.once("shop.invoice", optional=True)

    def broken(_payload, _fx):
        raise RuntimeError("smtp down")

    on(email, flow("workers.email", do=broken))
    async with oke("shop", database_url=url) as app:
        dead = await app.emit(email, {"to": "a@b.co"})
        await app.emit("shop.invoice", {"n": 1})
        await app.drain()
    return dead


async def status_of(url: str, message_id: str) -> str:
    store = await ops.open_store(url)
    try:
        return (await ops.show(store, message_id)).status
    finally:
        await store.close()


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_the_tui_in_a_browser_shows_the_overview_and_holds_read_only(store, request, chromium):  # noqa: F811
    url = request.getfixturevalue("sqlite_url" if store == "sqlite" else "pg_url")
    dead = await seed(url)
    port = free_port()
    server = subprocess.Popen([*okconsole_cmd(), "--db", url, "--read-only", "web", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "COLUMNS": "160"})
    browser = Browser(chromium, "about:blank")
    try:
        await wait_listening(port, timeout=30)
        await browser.connect()
        await browser.call("Page.enable")
        # a wide page, so the terminal has room for the whole status line (store url, read-only)
        await browser.call("Emulation.setDeviceMetricsOverride",
                           {"width": 2400, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
        await browser.call("Page.addScriptToEvaluateOnNewDocument", {"source": CATCH_TERMINAL})
        await browser.call("Page.navigate", {"url": f"http://127.0.0.1:{port}/"})
        text = await browser.wait_text("shop.email", "shop.invoice", "read-only")
        assert "okconsole" in text
        await browser.press("d")  # the dead letters: the write keys are not offered there
        text = await browser.wait_text("Dead letters (read-only)", "smtp down")
        await browser.press("P")  # purge: refused by --read-only (no confirmation comes up)
        await browser.press("y")
        await asyncio.sleep(1.0)
        after = await browser.screen()
        assert "Purge" not in after and "Dead letters (read-only)" in after
        assert await status_of(url, dead) == "dead"
    finally:
        await browser.close()
        server.terminate()
        try:
            _out, err = server.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            _out, err = server.communicate()
    assert "Traceback" not in err, err
    assert server.returncode == 130  # stopped by a signal, as after Ctrl-C (SPEC §10b)


def test_the_served_command_line_carries_the_store_read_only_and_actor():
    import shlex

    from okconsole.commands.common import State
    from okconsole.commands.web import served_command

    line = served_command(State(db="sqlite+aiosqlite:////tmp/my store's.db", read_only=True, actor="ann o'neil"))
    argv = shlex.split(line)
    assert argv[1:] == ["-m", "okconsole", "--db", "sqlite+aiosqlite:////tmp/my store's.db", "--read-only",
                        "--actor", "ann o'neil"]
    assert "--read-only" not in served_command(State(db="x", read_only=False, actor=None))


def test_bad_ports_and_a_missing_store_are_refused_before_serving(tmp_path):
    from consolekit import run_okconsole

    bad = run_okconsole("--db", str(tmp_path / "none.db"), "web", "--port", "70000")
    assert bad.returncode == 2 and "--port: 70000 is not a TCP port" in bad.stderr
    missing = run_okconsole("--db", str(tmp_path / "none.db"), "web", "--port", str(free_port()))
    assert missing.returncode == 1 and "none.db: the SQLite file does not exist" in missing.stderr
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = run_okconsole("--db", str(tmp_path / "none.db"), "web", "--port", str(taken.getsockname()[1]))
    assert busy.returncode == 1 and "the port is in use" in busy.stderr
