"""A failure's traceback as the worker records it: the end of it within 8 KiB, cut at a character
boundary after a line saying so, storable as text on both stores."""
from __future__ import annotations

from engine.failures import TRACEBACK_BYTES, failure_traceback


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_a_short_traceback_is_kept_whole():
    text = failure_traceback(raised(ValueError("bad \x1b[2J input\nline two")))
    assert text.startswith("Traceback (most recent call last):\n")
    assert text.endswith("ValueError: bad \x1b[2J input\nline two\n")  # stored as raised, escaped when shown


def test_a_long_traceback_keeps_its_last_8_kib_cut_at_a_character_and_says_so():
    text = failure_traceback(raised(RuntimeError("é" * 20_000 + " the end")))
    data = text.encode("utf-8")
    assert len(data) <= TRACEBACK_BYTES
    first, rest = text.split("\n", 1)
    assert first.startswith("… cut: the last 8,192 of ") and first.endswith("bytes of this traceback")
    assert rest.startswith("é") and text.endswith("é the end\n")  # no half character after the marker


def test_nul_and_lone_surrogates_are_written_as_escapes_and_a_bad_str_does_not_raise():
    class Sour(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    text = failure_traceback(raised(ValueError("a\x00b \udcff")))
    assert "\x00" not in text and "a\\x00b \\udcff" in text
    text.encode("utf-8")  # valid UTF-8
    assert "Sour" in failure_traceback(raised(Sour()))
