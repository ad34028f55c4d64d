"""engine.display: stored text made inert, cut for reading, and JSON safe to print."""

from __future__ import annotations

import json

import pytest
from hostilekit import HOSTILE, HOSTILE_KEY, assert_inert

from engine.display import SHOW_BYTES, cut, inert, json_text, more_note, one_line


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_corpus_string_is_inert(name: str) -> None:
    shown = inert(HOSTILE[name])
    assert_inert(shown)
    assert_inert(inert(HOSTILE[name], multiline=True))


def test_control_characters_are_shown_escaped_not_dropped() -> None:
    assert inert("\x1b]52;c;SEFDS0VE\x07") == "\\x1b]52;c;SEFDS0VE\\x07"
    assert inert("\u009b2J") == "\\u009b2J"
    assert inert("a\u202eb\u2066c") == "a\\u202eb\\u2066c"
    assert inert("del\x7f") == "del\\x7f"
    assert inert("line\nnext\ttab\rcr") == "line\\nnext\\ttab\\rcr"


def test_multiline_keeps_newline_and_tab_only() -> None:
    assert inert("a\nb\tc\rd\x1be", multiline=True) == "a\nb\tc\\rd\\x1be"


def test_invalid_utf8_and_lone_surrogates_become_visible() -> None:
    assert inert(b"ok \xff\xfe") == "ok \\xff\\xfe"
    assert inert("bad \udcff") == "bad \\xff"  # surrogateescape: the byte it stands for
    assert inert("lone \ud800") == "lone \\ud800"
    inert(HOSTILE["surrogate"]).encode("utf-8")  # printable: no lone surrogate left


def test_markup_is_left_as_text() -> None:
    for text in ("[bold red]RED[/]", "[/]", "[/tmp/x]", "[link=http://evil.example]x[/link]"):
        assert inert(text) == text  # the renderer gets it as plain text (okconsole.safe)


def test_none_and_non_strings() -> None:
    assert inert(None) == ""
    assert inert(42) == "42"


def test_one_line_joins_lines_then_escapes() -> None:
    assert one_line("first\n  second\x1b") == "first second\\x1b"


def test_cut_counts_the_bytes_left_out_without_splitting_a_character() -> None:
    text = "é" * SHOW_BYTES  # two bytes each
    head, more = cut(text)
    assert len(head.encode()) == SHOW_BYTES
    assert more == len(text.encode()) - SHOW_BYTES
    assert cut("short") == ("short", 0)
    head, more = cut("aé", limit=2)  # the second character does not fit whole
    assert (head, more) == ("a", 2)
    assert more_note(1234567) == "… 1,234,567 more bytes (--full prints all)"


def test_json_text_escapes_every_c0_and_c1_and_stays_json() -> None:
    data = {"k": HOSTILE_KEY, **HOSTILE}
    text = json_text(data)
    assert_inert(text)
    for code in list(range(0x20)) + list(range(0x7F, 0xA0)):
        assert chr(code) not in text
    back = json.loads(text)
    assert back["k"] == HOSTILE_KEY and back["osc52"] == HOSTILE["osc52"]
    assert "é" in json_text({"a": "é"})  # readable text stays readable
