"""okconsole.safe: stored text reaches Textual and Rich as plain text objects, never as markup."""

from __future__ import annotations

import json

import pytest
from hostilekit import HOSTILE, HOSTILE_ERROR, HOSTILE_KEY, assert_inert, big_payload, visible
from rich.console import Console
from textual.content import Content
from textual.markup import escape as textual_escape

from engine.display import SHOW_BYTES, cut, json_text, more_note
from okconsole.safe import assemble, cell, content, escape, json_pane, pane

CORPUS = {**HOSTILE, "key": HOSTILE_KEY, "error": HOSTILE_ERROR, "variable": "$accent [$accent]x[/] ${name}"}


def rendered(renderable: object) -> str:
    """What Rich writes to a colour terminal for `renderable`."""
    console = Console(force_terminal=True, color_system="truecolor", width=400, legacy_windows=False)
    with console.capture() as captured:
        console.print(renderable)
    return captured.get()


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_a_cell_is_the_visible_text_with_no_markup_read(name: str) -> None:
    text = cell(CORPUS[name], "bold")
    assert text.plain == visible(CORPUS[name])
    assert [(s.start, s.end, s.style) for s in text.spans] == [(0, len(text.plain), "bold")]
    assert_inert(rendered(text), screen=True)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_content_inserts_stored_values_literally_into_the_consoles_markup(name: str) -> None:
    shown = content("[b]okconsole[/b] · $value · ${value}s [dim]end[/]", value=CORPUS[name])
    assert shown.plain == f"okconsole · {visible(CORPUS[name])} · {visible(CORPUS[name])}s end"
    assert {span.style for span in shown.spans} == {"b", "dim"}  # only the console's own tags


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_escape_survives_textuals_parser(name: str) -> None:
    assert Content.from_markup(f"{escape(CORPUS[name])}: key r").plain == f"{visible(CORPUS[name])}: key r"
    assert Content.from_markup(f"{escape(CORPUS[name])}: key r").spans == []


def test_textuals_own_escape_leaves_some_tags_to_the_parser() -> None:
    """Why okconsole.safe.escape escapes every `[`: textual.markup.escape lets these through."""
    for text in ("[$accent]x[/]", "[B]x[/B]", "[ bold]x[/]"):
        assert Content.from_markup(textual_escape(text)).spans, text
        assert not Content.from_markup(escape(text)).spans


def test_assemble_styles_each_piece_and_reads_none_as_markup() -> None:
    text = assemble("once", " ", ("⚠", "b yellow"), ("[/]", None))
    assert text.plain == "once ⚠[/]"
    assert [(s.start, s.end, s.style) for s in text.spans] == [(5, 6, "b yellow")]
    assert text.no_wrap and text.end == ""
    assert cell("a\nb").plain == "a\\nb"
    assert cell(None).plain == ""


def test_a_pane_keeps_lines_and_cuts_at_64_kib_saying_how_much_more() -> None:
    assert pane("first\nsecond\x1b[5m").plain == "first\nsecond\\x1b[5m"
    big = "line [/] \x1b]52;c;SEFDS0VE\x07\n" * 10_000
    shown = pane(big).plain
    head, left_out = cut(big.replace("\x1b", "\\x1b").replace("\x07", "\\x07"))
    assert left_out > 0 and shown == f"{head}\n{more_note(left_out)}"
    assert len(shown.encode()) < SHOW_BYTES + 100
    assert_inert(shown)


def test_a_payload_pane_is_json_cut_at_64_kib() -> None:
    head, note = json_pane(dict(HOSTILE))
    assert note == "" and json.loads(head) == dict(HOSTILE)
    assert_inert(head)
    head, note = json_pane(big_payload())
    full = json_text(big_payload(), indent=2)
    assert head == full[: len(head)] and len(head.encode()) == SHOW_BYTES
    assert note == more_note(len(full.encode()) - SHOW_BYTES) and "more bytes (--full prints all)" in note


def test_a_template_variable_without_a_value_is_refused() -> None:
    with pytest.raises(KeyError, match="whichdead"):
        content("Delete 2 $whichdead letters of $signal?", which="tagged ", signal="s")
    assert content("Delete 2 ${which}dead letters", which="tagged ").plain == "Delete 2 tagged dead letters"
