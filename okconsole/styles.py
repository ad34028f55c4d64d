"""The colour of every status, once, for the CLI's Rich tables and the TUI's cells alike (both
read Rich style strings): a message's status and a run's. The TUI styles plain text objects
(okconsole/safe.py); `styled` and `status_markup` write Rich markup, for the CLI."""

from __future__ import annotations

from rich.markup import escape

STATUS_STYLE: dict[str, str] = {
    # a message
    "pending": "yellow",
    "inflight": "cyan",
    "delivered": "green",
    "dead": "bold red",
    # a run
    "succeeded": "green",
    "failed": "red",
    "lease_lost": "magenta",
    "unknown": "dim",
}
DEAD_STYLE = STATUS_STYLE["dead"]  # a count of dead letters, a failure code: what needs a look
PAUSED_STYLE = "bold yellow"  # a signal an operator paused (stats, the TUI overview)
PAUSED_MARK = "paused"  # what marks a paused signal in the TUI overview (a word: every terminal draws it)


# a health mark (engine/ops/health.py) by its first word: lost or failing work red, a backlog yellow
HEALTH_STYLE = {
    "dead": DEAD_STYLE,
    "fail": DEAD_STYLE,
    "orphaned": DEAD_STYLE,
    "lag": "yellow",
    "paused": PAUSED_STYLE,
    "limit": "yellow",
    "rate": "yellow",
}
HEALTH_OK = "ok"  # what a signal with no mark shows


def health_style(mark: str) -> str:
    """The colour of one health mark ("dead+12" is a "dead" one); "ok" is green."""
    word = mark.split("+", 1)[0].split(" ", 1)[0]
    return "green" if mark == HEALTH_OK else HEALTH_STYLE.get(word, "bold")


def styled(text: str, style: str | None) -> str:
    """`text` (escaped) in `style` as markup; plain when there is no style."""
    return f"[{style}]{escape(text)}[/]" if style else escape(text)


def status_markup(status: str) -> str:
    """A status word in its colour (unknown words plain)."""
    return styled(status, STATUS_STYLE.get(status))


# `okconsole why` and the TUI's message screen: what needs a hand in red, a hold to look at in yellow
VERDICT_STYLE: dict[str, str] = {
    "delivered": "green",
    "dead": "bold red",
    "running": "cyan",
    "orphaned": "bold red",
    "no_worker": "bold red",
    "blocked_by_key": "bold yellow",
    "paused": "bold yellow",
    "not_due": "yellow",
    "concurrency_limited": "yellow",
    "rate_limited": "yellow",
    "due": "yellow",
}
