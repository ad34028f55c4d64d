"""What a person sees on a Textual app's screen, as text: the lines of `export_screenshot()`.

The SVG holds one <text> element per run of equally styled characters, positioned by x/y;
grouping them by y and ordering by x gives back the screen's lines.
"""
from __future__ import annotations

import html
import re
from typing import Any

_TEXT = re.compile(r'<text[^>]*\bx="([0-9.]+)"[^>]*\by="([0-9.]+)"[^>]*>(.*?)</text>', re.S)


def screen_lines(app: Any) -> list[str]:
    """The rendered screen, one string per terminal line (trailing spaces dropped)."""
    rows: dict[float, list[tuple[float, str]]] = {}
    for x, y, chunk in _TEXT.findall(app.export_screenshot()):
        rows.setdefault(float(y), []).append((float(x), html.unescape(re.sub(r"<[^>]+>", "", chunk))))
    return ["".join(text for _x, text in sorted(parts)).replace("\xa0", " ").rstrip()
            for _y, parts in sorted(rows.items())]


def screen_text(app: Any) -> str:
    return "\n".join(screen_lines(app))


def flat_text(app: Any) -> str:
    """The screen's words joined by single spaces, toast edges (▌) dropped: a phrase that wraps inside
    a notification or a narrow pane is still found whole."""
    return " ".join(screen_text(app).replace("▌", " ").split())
