"""What a person sees: the text of the running app's screen, from `App.export_screenshot()`."""
from __future__ import annotations

import html
import re
from collections import defaultdict

# Rich's SVG: one <text> per styled run, at x = column × char width, clipped to its line.
_FRAGMENT = re.compile(r'<text [^>]*?x="([\d.]+)"[^>]*?textLength="([\d.]+)"[^>]*?'
                       r'clip-path="url\(#[^)]*?-line-(\d+)\)"[^>]*>(.*?)</text>', re.S)


def screen_text(app) -> str:
    """The screen as plain text lines: each fragment of the SVG screenshot put back at its column."""
    fragments = [(float(x), float(length), int(line), html.unescape(body).replace("\xa0", " "))
                 for x, length, line, body in _FRAGMENT.findall(app.export_screenshot())]
    widths = [length / len(text) for _, length, _, text in fragments if text]
    char = min(widths) if widths else 1.0
    lines: dict[int, list[str]] = defaultdict(list)
    for x, _, line, text in fragments:
        row = lines[line]
        col = round(x / char)
        row.extend(" " * (col + len(text) - len(row)))
        row[col:col + len(text)] = text
    return "\n".join("".join(lines[n]).rstrip() for n in sorted(lines))
