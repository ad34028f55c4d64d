"""The one path from stored text to what a person reads.

Payloads, keys, names, failure messages, tracebacks, audit reasons and live events come from other
people's input. Shown raw, a control character in them drives the operator's terminal (ESC clears
the screen, OSC 52 writes the clipboard, a bidi override reorders what is read). So every
human-readable output turns stored text into *inert* text here first: each such character becomes
a visible escape (`\\x1b`, `\\u009b`, `\\u202e`), invalid UTF-8 becomes `\\xNN`, and big values are
cut where a person reads them. Markup is the renderer's concern: the console hands this text to
Rich and Textual as plain text objects, never as markup to parse (okconsole/safe.py).

Standard library only: the engine, the console and the tests use it alike.
"""

from __future__ import annotations

import json
import re
from typing import Any

# C0 (but newline and tab, kept in a multi-line pane), DEL, C1, the bidirectional embeddings and
# overrides (U+202A-U+202E) and isolates (U+2066-U+2069), and lone surrogates (a string decoded
# with surrogateescape, or made by a careless client): none of them may reach a terminal raw.
_CONTROL_ALL = "\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_SINGLE_LINE = re.compile(f"[{_CONTROL_ALL}]")
_MULTI_LINE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}

# Characters JSON may carry raw but a terminal must not get: `json.dumps(ensure_ascii=False)`
# escapes C0 itself and leaves these as they are; each becomes `\uXXXX` (it only ever occurs inside
# a JSON string, where that escape means the same character).
_JSON_RAW = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")

SHOW_BYTES = 64 * 1024  # what `show` and the TUI's panes print of one value before `--full`


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code < 0x80:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def inert(value: Any, *, multiline: bool = False) -> str:
    """`value` as text that cannot drive a terminal: control characters visibly escaped (a
    newline and a tab kept only when `multiline`), bytes decoded with invalid UTF-8 shown as
    `\\xNN`. None is the empty string; anything else is its `str()`."""
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray | memoryview):
        text = bytes(value).decode("utf-8", errors="backslashreplace")
    else:
        text = value if isinstance(value, str) else str(value)
    pattern = _MULTI_LINE if multiline else _SINGLE_LINE
    return pattern.sub(_visible, text)


def one_line(value: Any) -> str:
    """A multi-line text for a single-line cell: its lines joined by spaces, then made inert."""
    return inert(" ".join(inert(value, multiline=True).split()))


def cut(text: str, limit: int = SHOW_BYTES) -> tuple[str, int]:
    """The head of `text` within `limit` UTF-8 bytes (never a split character) and how many
    bytes were left out (0 when it all fits)."""
    data = text.encode("utf-8", errors="surrogatepass")
    if len(data) <= limit:
        return text, 0
    head = data[:limit].decode("utf-8", errors="ignore")
    return head, len(data) - len(head.encode("utf-8", errors="surrogatepass"))


def more_note(left_out: int) -> str:
    """What a cut value says where it was cut."""
    return f"… {left_out:,} more bytes (--full prints all)"


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def json_text(data: Any, **dumps: Any) -> str:
    """`data` as JSON that is safe to print to a terminal: every C0 and C1 character (and DEL,
    the bidi controls, U+2028/U+2029 and lone surrogates) escaped as `\\uXXXX`; other text stays
    readable (not `ensure_ascii`)."""
    return _JSON_RAW.sub(_json_escape, json.dumps(data, ensure_ascii=False, **dumps))
