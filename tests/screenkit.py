"""What a person sees: the text of the screen as Textual draws it (from `export_screenshot`)."""
from __future__ import annotations

import html
import re
from collections import defaultdict
from typing import Any

_TEXT = re.compile(r'<text class="[^"]*" x="([\d.]+)" y="[\d.]+" textLength="([\d.]+)" '
                   r'clip-path="url\(#terminal-(?:\d+-)?line-(\d+)\)">([^<]*)</text>')


def screen_lines(app: Any) -> list[str]:
    """The rendered screen, one string per terminal row (cells placed by their x position)."""
    svg = app.export_screenshot()
    pieces: dict[int, list[tuple[int, str]]] = defaultdict(list)
    cell_width = 0.0
    for x, length, line, raw in _TEXT.findall(svg):
        text = html.unescape(raw).replace("\xa0", " ").rstrip("\n")
        if not cell_width and text:
            cell_width = float(length) / len(text)
        pieces[int(line)].append((int(round(float(x) / cell_width)) if cell_width else 0, text))
    rows = []
    for line in range(max(pieces, default=-1) + 1):
        row = ""
        for column, text in sorted(pieces.get(line, [])):
            row = row.ljust(column) + text
        rows.append(row.rstrip())
    return rows


def screen_text(app: Any) -> str:
    return "\n".join(screen_lines(app))


def toast_text(app: Any) -> str:
    """The notifications on screen as one line of words (a toast wraps its text at its own width;
    run the app with `run_test(notifications=True)`)."""
    parts = [line.split("▌", 1)[1] for line in screen_lines(app) if "▌" in line]
    return " ".join(" ".join(parts).split())


def flat_text(app: Any) -> str:
    """The screen's words joined by single spaces, toast edges (▌) dropped: a phrase that wraps inside
    a notification or a narrow pane is still found whole."""
    return " ".join(screen_text(app).replace("▌", " ").split())
