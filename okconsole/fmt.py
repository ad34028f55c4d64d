"""Small text formatters shared by the console's screens and commands."""

from __future__ import annotations

import time

SPARK = "▁▂▃▄▅▆▇█"


def now_ms() -> int:
    return int(time.time() * 1000)


def span(ms: int | float | None) -> str:
    """A duration as a short human string: 850ms, 12.3s, 4m05s, 3h12m, 2d04h."""
    if ms is None:
        return "—"
    ms = max(0, int(ms))
    if ms < 1000:
        return f"{ms}ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    m, s = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def ago(at_ms: int | None) -> str:
    return "—" if at_ms is None else f"{span(now_ms() - at_ms)} ago"


def clock(at_ms: int | None) -> str:
    if at_ms is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at_ms / 1000)) + f".{at_ms % 1000:03d}"


def sparkline(values: list[float], width: int = 16) -> str:
    """Unicode block sparkline of the newest `width` values, always `width` wide: it starts at its
    column's left edge and grows to the right until full, then the newest sample is the rightmost
    cell. (Padded on the left, a new console's few samples were drawn cells away from the column's
    header: the web console, a new process per browser tab, always showed it so.)"""
    tail = values[-width:]
    top = max(tail, default=0)
    if top <= 0:
        bars = "▁" * len(tail)
    else:
        bars = "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] for v in tail)
    return bars.ljust(width)


def short(text: str | None, width: int) -> str:
    if text is None:
        return "—"
    return text if len(text) <= width else text[: width - 1] + "…"
