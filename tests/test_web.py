"""`okconsole web`: the real CLI serves the TUI with textual-serve; a real headless
Chromium loads it, and the test reads the terminal emulator's own text (xterm.js's buffer, rows
as the page shows them) over the DevTools protocol: the overview's signal names, the store and
the read-only mode the served command line carried, and a write key that does nothing.

Who may connect: raw HTTP and WebSocket requests to a real `okconsole web` (tests/webkit.py) get
401 without the token, 403 from another Origin or Host, 503 past --max-sessions, each with no
console process started (its process tree is read from /proc); a write made through a session is
audited with the browser's address; and in Chromium a page on another port of 127.0.0.1, which
the browser sends the console's cookie from, cannot open a session."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import httpx
import websockets

from consolekit import okconsole_cmd, run_okconsole
from engine import flow, oke, on, ops, signal
from livekit import free_port, wait_listening
from webkit import TOKEN, Upgrade, WebConsole, seed_signal, upgrade_status
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
        """The terminal's rows; empty while the page is still loading (its first document, redirected
        to drop the token, is replaced under a call made to it)."""
        answer = await self.call("Runtime.evaluate", {"expression": SCREEN_TEXT, "returnByValue": True})
        if "exceptionDetails" in answer:
            return ""
        return answer.get("result", {}).get("value") or ""

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
    server = subprocess.Popen([*okconsole_cmd(), "--db", url, "--read-only", "web", "--port", str(port),
                               "--token", TOKEN],
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
        await browser.call("Page.navigate", {"url": f"http://127.0.0.1:{port}/?token={TOKEN}"})
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
    assert server.returncode == 130  # stopped by a signal, as after Ctrl-C


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


# ------------------------------------------------------------------ who may connect: raw requests

async def test_without_the_token_nothing_but_401_and_no_console(sqlite_url):
    await seed_signal(sqlite_url)
    async with WebConsole(sqlite_url) as web:
        origin = {"Host": web.host, "Origin": web.base}
        async with httpx.AsyncClient(base_url=web.base) as client:
            for path in ("/", "/static/js/textual.js", "/ws", "/download/x", "/?token=wrong", f"/?token={TOKEN}x"):
                assert (await client.get(path)).status_code == 401, path
            forged = {"Cookie": f"okconsole-web-{web.port}={TOKEN}"}  # the token itself is not the cookie
            assert (await client.get("/", headers=forged)).status_code == 401
        for path in ("/ws", "/ws?token=wrong", f"/ws?token={TOKEN[:-1]}"):
            assert await upgrade_status(web.port, origin, path) == 401, path
        assert await upgrade_status(web.port, {**origin, "Cookie": f"okconsole-web-{web.port}=00"}) == 401
        await asyncio.sleep(1.0)
        assert web.consoles() == 0
        # the same handshake with the token starts a console: the 401s above were the token's doing
        session = Upgrade(web.port, origin, f"/ws?width=80&height=24&token={TOKEN}")
        assert await session.status() == 101
        await web.wait_consoles(1)
        await session.close()
    assert "Traceback" not in web.stderr, web.stderr


async def test_the_token_in_the_url_buys_a_strict_httponly_cookie(sqlite_url):
    await seed_signal(sqlite_url)
    async with WebConsole(sqlite_url, "--allowed-host", "ops.example.com:443") as web, \
            httpx.AsyncClient(base_url=web.base) as client:
        answer = await client.get(f"/?fontsize=14&token={TOKEN}")
        assert answer.status_code == 303
        assert answer.headers["location"] == "/?fontsize=14"  # the token leaves the address bar
        cookie = answer.headers["set-cookie"]
        attributes = {part.strip().split("=")[0].lower(): part.strip() for part in cookie.split(";")[1:]}
        assert attributes["httponly"] and attributes["samesite"] == "SameSite=Strict" and attributes["path"] == "Path=/"
        name, value = cookie.split(";")[0].split("=", 1)
        assert name == f"okconsole-web-{web.port}" and TOKEN not in cookie and len(value) >= 32
        page = await client.get("/", headers={"Cookie": f"{name}={value}"})
        assert page.status_code == 200 and f'data-session-websocket-url="ws://127.0.0.1:{web.port}/ws"' in page.text
        assert page.headers["x-frame-options"] == "DENY"  # no page of another origin may frame it
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        # opened as localhost, the page's own URLs stay on localhost (where its cookie is)
        local = await client.get("/", headers={"Cookie": f"{name}={value}", "Host": f"localhost:{web.port}"})
        assert f'data-session-websocket-url="ws://localhost:{web.port}/ws"' in local.text
        static = await client.get("/static/js/textual.js", headers={"Cookie": f"{name}={value}"})
        assert static.status_code == 200
        assert "secure" not in attributes  # plain http: a Secure cookie would never come back
        # behind a TLS proxy (a name allowed at 443, which the browser leaves out): https throughout
        proxied = await client.get(f"/?token={TOKEN}", headers={"Host": "ops.example.com"})
        assert proxied.status_code == 303 and "; Secure" in proxied.headers["set-cookie"]
        page = await client.get("/", headers={"Cookie": f"{name}={value}", "Host": "ops.example.com"})
        assert 'data-session-websocket-url="wss://ops.example.com/ws"' in page.text
    assert TOKEN not in web.stderr  # a given token is never printed (nor logged with its request)


async def test_a_foreign_origin_or_host_gets_403_before_any_console_starts(sqlite_url):
    await seed_signal(sqlite_url)
    async with WebConsole(sqlite_url, "--allowed-host", "console.test") as web:
        cookie = await web.cookie()
        own = {"Host": web.host, "Cookie": cookie}
        for origin in ("http://evil.example", f"http://127.0.0.1:{web.port + 1}", f"http://localhost:{web.port}",
                       f"https://evil.example:{web.port}", "null"):
            assert await upgrade_status(web.port, {**own, "Origin": origin}) == 403, origin
        assert await upgrade_status(web.port, own) == 403  # no Origin at all
        # DNS rebinding: evil.example resolved to 127.0.0.1; its page is same-origin with itself
        rebound = {"Host": f"evil.example:{web.port}", "Origin": f"http://evil.example:{web.port}"}
        assert await upgrade_status(web.port, {**rebound, "Cookie": cookie}) == 403
        assert await upgrade_status(web.port, rebound, f"/ws?token={TOKEN}") == 403
        async with httpx.AsyncClient(base_url=web.base) as client:
            for host in (f"evil.example:{web.port}", "evil.example", f"127.0.0.1:{web.port + 1}", "", "a b"):
                answer = await client.get(f"/?token={TOKEN}", headers={"Host": host})
                assert answer.status_code == 403, host
            # an --allowed-host name is let in, with its own origin
            assert (await client.get("/", headers={"Host": f"console.test:{web.port}", "Cookie": cookie})).status_code == 200
        await asyncio.sleep(1.0)
        assert web.consoles() == 0
        allowed = Upgrade(web.port, {"Host": f"console.test:{web.port}", "Origin": f"http://console.test:{web.port}",
                                     "Cookie": cookie})
        assert await allowed.status() == 101
        await web.wait_consoles(1)
        await allowed.close()


async def test_max_sessions_holds_and_a_closed_session_frees_its_slot(sqlite_url):
    await seed_signal(sqlite_url)
    async with WebConsole(sqlite_url, "--max-sessions", "2") as web:
        headers = {"Host": web.host, "Origin": web.base, "Cookie": await web.cookie()}
        first, second, third = (Upgrade(web.port, headers) for _ in range(3))
        assert await first.status() == 101 and await second.status() == 101
        await web.wait_consoles(2)
        assert await third.status() == 503
        await asyncio.sleep(1.0)
        assert web.consoles() == 2
        await first.close()
        await web.wait_consoles(1)  # its console process ended with it
        retry = Upgrade(web.port, headers)
        assert await retry.status() == 101
        await web.wait_consoles(2)
        for session in (second, third, retry):
            await session.close()


async def test_a_write_made_through_the_web_is_audited_with_the_browser_address(db_url):
    await seed_signal(db_url)
    async with WebConsole(db_url, "--actor", "ann") as web:
        headers = {"Cookie": await web.cookie()}
        async with websockets.connect(f"ws://{web.host}/ws?width=160&height=40", origin=web.base,
                                      additional_headers=headers, max_size=None) as ws:
            source = f"web 127.0.0.1:{ws.local_address[1]}"
            await until_screen(ws, b"shop.email")
            await ws.send(json.dumps(["stdin", "p"]))  # pause the selected signal: a reason is asked
            await until_screen(ws, b"audit log")
            await ws.send(json.dumps(["stdin", "smtp down"]))
            await ws.send(json.dumps(["stdin", "\r"]))
            entries = await until_audited(db_url)
    [entry] = entries
    assert (entry.action, entry.signal, entry.actor, entry.reason, entry.source) == (
        "pause", "shop.email", "ann", "smtp down", source)
    listed = json.loads(run_okconsole("--db", db_url, "audit", "--json").stdout)
    assert listed[0]["source"] == source
    resumed = run_okconsole("--db", db_url, "resume", "shop.email", "--yes")  # not from a browser
    assert resumed.returncode == 0, resumed.stderr
    listed = json.loads(run_okconsole("--db", db_url, "audit", "--json").stdout)
    assert [(e["action"], e["source"]) for e in listed] == [("resume", None), ("pause", source)]
    assert source in run_okconsole("--db", db_url, "audit").stdout


async def until_screen(ws, needle: bytes, timeout: float = 60) -> None:
    """Read the session's terminal output until `needle` was drawn."""
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{needle!r} never drawn"
        message = await asyncio.wait_for(ws.recv(), left)
        seen = (seen + (message if isinstance(message, bytes) else message.encode()))[-200_000:]


async def until_audited(url: str, timeout: float = 60) -> list:
    deadline = time.monotonic() + timeout
    while True:
        store = await ops.open_store(url)
        try:
            entries = await ops.audit(store)
        finally:
            await store.close()
        if entries or time.monotonic() > deadline:
            return entries
        await asyncio.sleep(0.2)


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--token", ""], {}, "--token: the token is empty"),
    (["--token", "   "], {}, "--token: the token is empty"),
    ([], {"OKE_WEB_TOKEN": ""}, "OKE_WEB_TOKEN: the token is empty"),
    (["--max-sessions", "0"], {}, "--max-sessions: at least one session"),
    (["--max-sessions", "-3"], {}, "--max-sessions: at least one session"),
    (["--allowed-host", "evil.example/x"], {}, "--allowed-host: 'evil.example/x' is not a host"),
    (["--allowed-host", "a.test:99999"], {}, "--allowed-host: 'a.test:99999': 99999 is not a TCP port"),
])
def test_bad_web_options_are_refused_before_anything_listens(sqlite_url, args, env, message):
    asyncio.run(seed_signal(sqlite_url))
    port = free_port()
    done = run_okconsole("--db", sqlite_url, "web", "--port", str(port), *args, env=env, timeout=30)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------ who may connect: a real browser

HOSTILE_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>cute cats</title></head><body>
<script>
  window.result = "pending";
  window.opened = false;
  const ws = new WebSocket("ws://127.0.0.1:CONSOLE_PORT/ws?width=120&height=40");
  ws.onopen = () => {
    window.opened = true;
    window.result = "open";
    ws.send(JSON.stringify(["stdin", "p"]));  // pause the selected signal...
    setTimeout(() => {
      ws.send(JSON.stringify(["stdin", "pwned by a web page"]));
      ws.send(JSON.stringify(["stdin", "\\r"]));
    }, 3000);
  };
  ws.onerror = () => { if (window.result === "pending") window.result = "error"; };
  ws.onclose = () => { if (window.result === "pending") window.result = "closed"; };
  fetch("http://127.0.0.1:CONSOLE_PORT/", {credentials: "include"})
    .then((r) => r.text()).then((t) => { window.read = t.length; }).catch(() => { window.read = "blocked"; });
</script>
</body></html>
"""


class HostileSite:
    """Another origin on this machine (127.0.0.1, another port) serving a page that tries the console."""

    def __init__(self, console_port: int) -> None:
        page = HOSTILE_PAGE.replace("CONSOLE_PORT", str(console_port)).encode()

        class Page(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HostileSite:
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_a_page_of_another_origin_cannot_drive_the_console(sqlite_url, chromium):  # noqa: F811
    await seed_signal(sqlite_url)
    async with WebConsole(sqlite_url) as web:
        browser = Browser(chromium, "about:blank")
        try:
            await browser.connect()
            await browser.call("Page.enable")
            await browser.call("Page.addScriptToEvaluateOnNewDocument", {"source": CATCH_TERMINAL})
            # the operator opens the URL with the token: the console comes up, the browser keeps the cookie
            await browser.call("Page.navigate", {"url": f"{web.base}/?token={TOKEN}"})
            await browser.wait_text("shop.email")
            assert web.consoles() == 1
            assert await browser.evaluate("location.href") == f"{web.base}/"  # the token left the address bar
            cookies = (await browser.call("Network.getCookies", {"urls": [web.base]}))["cookies"]
            [cookie] = [c for c in cookies if c["name"] == f"okconsole-web-{web.port}"]
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]

            # then visits another site on this machine: same site (cookies ignore ports), other origin
            with HostileSite(web.port) as site:
                await browser.call("Page.navigate", {"url": site.url})
                # leaving the page ends its session at once: not kept alive in the back/forward cache
                await web.wait_consoles(0, timeout=15)
                deadline = time.monotonic() + 30
                while await browser.evaluate("window.result") == "pending":
                    assert time.monotonic() < deadline, "the hostile WebSocket neither opened nor failed"
                    await asyncio.sleep(0.1)
                await asyncio.sleep(5.0)  # past the page's delayed keystrokes
                assert await browser.evaluate("window.opened") is False
                assert await browser.evaluate("window.result") in ("error", "closed")
                assert await browser.evaluate("window.read") == "blocked"  # nor may it read the page
                assert web.consoles() == 0  # no console process started for it
        finally:
            await browser.close()
    assert await until_audited(sqlite_url, timeout=0) == []  # nothing paused
