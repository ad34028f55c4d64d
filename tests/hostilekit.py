"""A hostile corpus: stored text that tries to drive the operator's terminal or the console's renderer.

Every screen and command that shows stored text is tested with it (the promise: inert text
everywhere), so a new screen inherits the check by using `HOSTILE` and `assert_inert`.

    from hostilekit import HOSTILE, HOSTILE_KEY, assert_inert, visible

`assert_inert(raw)` reads the bytes a terminal would get (CLI stdout, a pty's output) and fails on
any attack sequence reaching it raw; `visible(name)` is how that string looks once escaped.
"""

from __future__ import annotations

import re

from engine.display import inert

# name -> the string as a stranger would store it (in a payload, a key, an error message)
HOSTILE: dict[str, str] = {
    "clear": "\x1b[2J\x1b[HHACKED",  # ESC: clears the screen, homes the cursor
    "osc52": "\x1b]52;c;SEFDS0VE\x07",  # OSC 52: writes "HACKED" to the clipboard
    "osc8": "\x1b]8;;http://evil.example/\x1b\\click me\x1b]8;;\x1b\\",  # a hidden hyperlink
    "c1_csi": "\u009b2J",  # C1 CSI: the same clear screen in one character
    "c1_osc": "\u009d52;c;SEFDS0VE\u009c",  # C1 OSC ... ST
    "bidi": "invoice\u202egpj.exe\u202c",  # right-to-left override: reads as invoiceexe.jpg
    "isolate": "\u2066admin\u2069",
    "bell": "ding\x07\x08\x7f",
    "cr": "safe text\roverwritten",
    "markup_bold": "[bold red]RED[/]",
    "markup_close": "[/]",  # crashed the dead-letters screen
    "markup_path": "[/tmp/x] not found",  # ordinary error text, not even hostile
    "markup_link": "[link=http://evil.example]click[/link]",
    "markup_blink": "[blink]key[/blink]",
    "markup_click": "[@click=app.quit]quit[/]",
    "backslash_end": "ends with a backslash\\",
    "surrogate": "bad utf-8 \udcff\udcfe",  # invalid UTF-8 decoded with surrogateescape
}

HOSTILE_KEY = "k\x1b[5m\u009b[blink]key[/blink]"  # a per-key FIFO key that carries everything at once
HOSTILE_ERROR = "\x1b]52;c;SEFDS0VE\x07 [/] failed at [/tmp/x] \u009b2J\u202eevil"
BIG_PAYLOAD_BYTES = 10 * 1024 * 1024


STORABLE = {name: text for name, text in HOSTILE.items() if name != "surrogate"}  # UTF-8 cannot carry a lone surrogate


def hostile_payload() -> dict[str, str]:
    """One payload holding the whole corpus the engine can store (the engine refuses lone surrogates)."""
    return dict(STORABLE)


def big_payload() -> dict[str, str]:
    """A 10 MB payload: `show` and the TUI cut it at 64 KiB and say how much more there is."""
    return {"blob": "x" * BIG_PAYLOAD_BYTES}


def visible(name_or_text: str) -> str:
    """How a corpus string looks once escaped (what an operator should read)."""
    return inert(HOSTILE.get(name_or_text, name_or_text))


# What must never reach a terminal raw: ESC and BEL, C1 controls, the bidi controls. In UTF-8 a C1
# character is \xc2\x80-\xc2\x9f; U+202A-U+202E is \xe2\x80\xaa-\xae, U+2066-U+2069 \xe2\x81\xa6-\xa9.
_RAW_ALWAYS = re.compile(rb"\x07|\xc2[\x80-\x9f]|\xe2\x80[\xaa-\xae]|\xe2\x81[\xa6-\xa9]")
_ATTACKS = re.compile(rb"\x1b\]52;|\x1b\]8;;http://evil|\x1b\[5m")
# The one BEL-terminated sequence a Textual screen writes of its own: OSC 22, the mouse pointer's shape.
_POINTER_SHAPE = re.compile(rb"\x1b\]22;[a-z-]*\x07")


def assert_inert(raw: bytes | str, *, screen: bool = False) -> None:
    """Fail if `raw` (what a terminal gets) carries a control sequence from the corpus.

    For plain output (`screen=False`: a CLI writing to a pipe) no ESC may appear at all. A TUI's
    screen (`screen=True`) is made of the renderer's own escape sequences, so there it fails on the
    corpus's sequences: OSC 52, the evil OSC 8 link and blink (Textual's own pointer-shape OSC 22,
    ended by a BEL, is let through).
    """
    data = raw.encode("utf-8", errors="surrogateescape") if isinstance(raw, str) else raw
    if screen:
        data = _POINTER_SHAPE.sub(b"", data)
    found = _RAW_ALWAYS.search(data) or _ATTACKS.search(data) or (None if screen else re.search(rb"\x1b", data))
    assert found is None, (
        f"raw control sequence reached the terminal at {found.start()}: {data[max(0, found.start() - 40) : found.end() + 40]!r}"
    )
