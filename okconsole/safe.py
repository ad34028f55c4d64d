"""Stored text into the TUI's widgets: inert (engine.display) and never read as markup.

Names, ids, keys, payloads, failure codes and messages, audit actors and reasons, worker names and
live events come from other people. Textual parses a `str` it is given as markup (a Static, a
Label, a notification, the command palette's help) and a DataTable cell or a Tree label as Rich
markup: `[/tmp/x] not found` raised and took the console down, `[blink]` blinked. So stored text
reaches a widget only through here, as a plain text object:

- `cell(value, style)` / `assemble(*pieces)`: a Rich Text of stored pieces, each with an optional
  style (DataTable cells, Tree labels, RichLog lines);
- `content(template, **values)`: the console's own markup with stored values as `$name`
  variables, inserted literally (Static and Label updates, dialog questions);
- `escape(value)`: for the one API that takes only a markup string (the command palette's help);
- `rich_markup(value)`: the same for the CLI's Rich tables and lines (Rich's markup parser);
- `pane(...)` / `json_pane(...)`: a multi-line value cut at 64 KiB with how much more there is.
"""

from __future__ import annotations

from string import Template
from typing import Any

from rich.markup import escape as rich_escape
from rich.text import Text
from textual.content import Content

from engine.display import cut, inert, json_text, more_note


def cell(value: Any, style: str | None = None) -> Text:
    """A stored value as a single-line Rich Text, inert and literal, in `style` (not wrapped, as a
    DataTable draws its own cells)."""
    return assemble((value, style))


def assemble(*pieces: Any) -> Text:
    """Stored pieces, each a value or a (value, style) pair, as one single-line Rich Text: every
    piece made inert and kept literal (`assemble(kind, " ", ("⚠", "b yellow"))`)."""
    text = Text(no_wrap=True, end="")
    for piece in pieces:
        value, style = piece if isinstance(piece, tuple) else (piece, None)
        text.append(inert(value), style or None)
    return text


def content(template: str, **values: Any) -> Content:
    """The console's own Textual markup with stored `values` in it as `$name` (or `${name}`)
    variables: each value is made inert and inserted as literal text, never parsed as markup.
    A `$name` with no value is a bug here (it would be shown as `$name`): KeyError."""
    missing = set(Template(template).get_identifiers()) - values.keys()
    if missing:
        raise KeyError(f"no value for ${sorted(missing)[0]} in {template!r}")
    return Content.from_markup(template, **{name: inert(value) for name, value in values.items()})


def escape(value: Any) -> str:
    """Stored text for a string Textual will parse as its markup: inert, and every `[` escaped.
    (`textual.markup.escape` leaves `[$accent]`, `[B]` and `[ bold]` to the parser.) Textual's
    markup has no escape for a backslash, so a tag must not follow the result directly."""
    return inert(value).replace("[", "\\[")


def rich_markup(value: Any, *, multiline: bool = False) -> str:
    """Stored text for a string Rich will parse as its markup (the CLI's tables and lines): inert
    (a newline and a tab kept only when `multiline`), then escaped for Rich's parser."""
    return rich_escape(inert(value, multiline=multiline))


def pane(value: Any) -> Text:
    """A multi-line stored value (a failure message, a traceback) for a pane: inert with its
    newlines and tabs, at most 64 KiB, then `… N more bytes (--full prints all)`."""
    head, left_out = cut(inert(value, multiline=True))
    text = Text(head, end="")
    if left_out:
        text.append(f"\n{more_note(left_out)}", "dim")
    return text


def json_pane(data: Any) -> tuple[str, str]:
    """A payload as indented JSON for a pane (every control character escaped as `\\uXXXX`), at
    most 64 KiB of it, and the note saying how much more there is ('' when it all fits)."""
    head, left_out = cut(json_text(data, indent=2))
    return head, more_note(left_out) if left_out else ""
