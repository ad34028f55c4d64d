"""The console served to a browser never obeys the data it shows: a real `okconsole web` over a store
full of the hostile corpus (tests/hostilestore.py), opened in a real headless Chromium with the
token, driven by keys typed into the page's terminal (overview, a signal's messages, a message,
back, the dead letters).

What the browser shows is read over the DevTools protocol: the terminal emulator's own text (the
corpus visibly escaped, markup-like text literally, and still the dead-letters screen at the end:
`[/]` in an error crashed it once). What the browser was sent is read too: every byte the page's
WebSocket handed to xterm.js (`assert_inert(…, screen=True)`), every OSC 52 and OSC 8 xterm.js
parsed, and every call the page made to write the clipboard. textual-serve's page loads xterm.js's
clipboard addon, so an OSC 52 that reached it raw would put "HACKED" on the operator's clipboard.
"""

from __future__ import annotations

import asyncio
import base64
import time

import pytest

from hostilekit import HOSTILE, HOSTILE_ERROR, HOSTILE_KEY, assert_inert, visible
from hostilestore import SIGNAL, TAPE, seed_hostile
from test_browser import chromium  # noqa: F401  (the fixture: skip without Chromium, fail in CI)
from test_web import CATCH_TERMINAL, Browser
from webkit import TOKEN, WebConsole

from engine.display import json_text

# Before the page's own script runs: keep every byte written to its terminal, every OSC 52 / OSC 8
# the terminal parses, and every attempt to write the clipboard (the addon's and any other).
WATCH = """
window.__written = []; window.__osc = []; window.__copied = [];
const __copy = (text) => { window.__copied.push(String(text)); return Promise.resolve(); };
Object.defineProperty(navigator, "clipboard", {configurable: true, value: {
  writeText: __copy, write: (items) => __copy("[ClipboardItem]"), readText: () => Promise.resolve(""),
}});
const __execCommand = document.execCommand.bind(document);
document.execCommand = (name, ...rest) => {
  if (String(name).toLowerCase() === "copy") window.__copied.push("execCommand(copy)");
  return __execCommand(name, ...rest);
};
const __watch = (term) => {
  const write = term.write.bind(term);
  term.write = (data, done) => {
    if (!window.__written.length) {  // the addons are loaded by now: the last handler registered runs
      for (const ident of [52, 8]) {  // first, and false passes the sequence on to theirs
        term.parser.registerOscHandler(ident, (text) => { window.__osc.push(ident + ";" + text); return false; });
      }
    }
    window.__written.push(typeof data === "string" ? new TextEncoder().encode(data) : new Uint8Array(data));
    return write(data, done);
  };
};
Object.defineProperty(window, "__terminals", {configurable: true, set(value) {
  Object.defineProperty(window, "__terminals", {value, writable: true, configurable: true});
  const push = value.push.bind(value);
  value.push = (term) => { if (!value.length) __watch(term); return push(term); };
}});
"""
WRITTEN = """(() => {
  let text = "";
  for (const chunk of window.__written) {
    for (let i = 0; i < chunk.length; i += 8192) text += String.fromCharCode(...chunk.subarray(i, i + 8192));
  }
  return btoa(text);
})()"""


class Page:
    """The console's page in the browser: its terminal's text, keys typed into it."""

    def __init__(self, browser: Browser) -> None:
        self.browser = browser

    async def wait(self, *needles: str, absent: tuple[str, ...] = (), timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = await self.text()
            if all(n in text for n in needles) and not any(a in text for a in absent):
                return text
            await asyncio.sleep(0.25)
        raise AssertionError(f"{needles} (without {absent}) not on the page's terminal; it shows:\n{text}")

    async def text(self) -> str:
        return await self.browser.screen()

    async def key(self, key: str, code: int, text: str = "") -> None:
        """A named key (Enter, Escape) as the browser sends it: xterm.js reads its key code."""
        await self.browser.evaluate("window.__terminals[0].focus()")
        event = {"key": key, "code": key, "windowsVirtualKeyCode": code, "nativeVirtualKeyCode": code}
        await self.browser.call("Input.dispatchKeyEvent", {"type": "keyDown", "text": text, **event})
        await self.browser.call("Input.dispatchKeyEvent", {"type": "keyUp", **event})

    async def press_until(self, key: str, *needles: str, tries: int = 2) -> str:
        """Type `key` until `needles` show (once more after 30 s: a key typed while a screen is still
        switching is lost on a loaded machine)."""
        for left in range(tries - 1, -1, -1):
            await self.browser.press(key)
            try:
                return await self.wait(*needles, timeout=30)
            except AssertionError:
                if not left:
                    raise
        raise AssertionError("unreachable")


@pytest.mark.long
async def test_the_browser_shows_the_corpus_escaped_and_gets_no_control_sequence(sqlite_url, chromium):  # noqa: F811
    seeded = await seed_hostile(sqlite_url)
    async with WebConsole(sqlite_url) as web:
        browser = Browser(chromium, "about:blank")
        try:
            await browser.connect()
            await browser.call("Page.enable")
            # wide enough that the longest escaped key fits its column (as in the TUI's own test)
            await browser.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": 2400, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
            )
            await browser.call("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH + CATCH_TERMINAL})
            await browser.call("Page.navigate", {"url": f"{web.base}/?token={TOKEN}"})
            lost = await visit(Page(browser), seeded.hostile_id)
            consoles = web.consoles()
            written = base64.b64decode(await browser.evaluate(WRITTEN))
            osc = await browser.evaluate("window.__osc")
            copied = await browser.evaluate("window.__copied")
        finally:
            await browser.close()
    # first what reached the browser, however far the visit got
    assert_inert(written, screen=True)  # what the WebSocket brought to xterm.js, byte for byte
    assert osc == [] and copied == [], (osc, copied)  # no OSC 52 / OSC 8 parsed, nothing to the clipboard
    assert lost is None, lost
    assert consoles == 1  # the session's console still runs
    assert "Traceback" not in web.stderr, web.stderr[-3000:]


async def visit(page: Page, hostile_id: str) -> AssertionError | None:
    """Overview, messages, a message, back, dead letters, by keys; the error if one was not shown as it should."""
    try:
        await screens(page, hostile_id)
        await asyncio.sleep(3.0)  # a few repaints of the dead letters
        await page.wait("4 dead", "[/tmp/x] not found")  # still there: the console did not crash
    except AssertionError as lost:
        return lost
    return None


async def screens(page: Page, hostile_id: str) -> None:
    """Overview, the hostile signal's messages, its newest message, back, its dead letters."""
    shown = await page.wait(SIGNAL, TAPE, "kept")  # the once signal is selected
    assert "\u202e" not in shown and "\x1b" not in shown
    await page.key("Enter", 13, "\r")
    # the keys, one a row, escaped or literal (waited for: a loaded machine draws the rows after the title)
    keys = [visible(HOSTILE[name]) for name in ("osc52", "osc8", "clear", "c1_csi", "bidi", "markup_path")]
    keys += [visible(HOSTILE[name]) for name in ("markup_close", "markup_click")] + [visible(HOSTILE_KEY)]
    assert visible(HOSTILE["osc52"]) == "\\x1b]52;c;SEFDS0VE\\x07"
    await page.wait(f"{SIGNAL} · all · newest first", "rows)", *keys)

    await asyncio.sleep(1.0)  # a key typed while the screen is still switching is lost on a loaded machine
    await page.key("Enter", 13, "\r")
    payload = (f'"osc52": {json_text(HOSTILE["osc52"])}', '"markup_path": "[/tmp/x] not found"')
    await page.wait(f"{hostile_id} · {SIGNAL} · delivered", '"markup_click"', f"key {visible(HOSTILE_KEY)}", *payload)

    await asyncio.sleep(1.0)
    await page.key("Escape", 27)
    await page.wait(f"{SIGNAL} · all · newest first", absent=("Failures (newest first)",))
    await asyncio.sleep(1.0)
    errors = ("[/]", "[/tmp/x] not found", visible(HOSTILE_ERROR)[:40])
    await page.press_until("d", "4 dead", "Traceback", *errors, visible(HOSTILE_KEY))
