"""The keys of the current screen, read from its real bindings: the footer and the `?` help.

Both come from `Screen.active_bindings` (what Textual would actually run, after `check_action`,
so `--read-only` hides the writes), so neither can drift from the code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.table import Table
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

FIRST = ("enter", "question_mark", "colon", "q")  # what a newcomer needs, always on the left
MOVES = "↑ ↓ pgup pgdn home end"


@dataclass(frozen=True)
class Key:
    key: str  # the first key bound to the action (what the footer presses on a click)
    display: str  # every key of the action as shown: "? f1"
    description: str
    in_footer: bool


def screen_keys(screen: Screen[Any]) -> list[Key]:
    """The screen's and the app's keys with a description, keys of one action merged, `enter`
    (the screen's ENTER_HINT) and then `? : q` first; the focused widget's cursor keys are
    summed up by `MOVES`."""
    app = screen.app
    merged: dict[tuple[str, str], list[Any]] = {}
    for active in screen.active_bindings.values():
        node, binding = active.node, active.binding
        if (node is not screen and node is not app) or not binding.description or binding.system:
            continue
        merged.setdefault((binding.action, binding.description), []).append(binding)
    keys = []
    for (_action, description), bindings in merged.items():
        bindings.sort(key=lambda b: b.key not in FIRST)  # `q` names Quit, not ctrl+q
        keys.append(
            Key(
                bindings[0].key,
                " ".join(app.get_key_display(b) for b in bindings),
                description,
                any(b.show for b in bindings),
            )
        )
    hint = str(getattr(screen, "ENTER_HINT", "") or "")
    if hint:
        keys.insert(0, Key("enter", "enter", hint, True))
    rank = {key: n for n, key in enumerate(FIRST)}
    return sorted(keys, key=lambda k: rank.get(k.key, len(rank)))


def help_table(screen: Screen[Any]) -> Table:
    """Every key of `screen` in two columns: a key never wraps, a description wraps by words."""
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True, style="bold")
    table.add_column()
    for key in screen_keys(screen):
        table.add_row(key.display, key.description)
    table.add_row(MOVES, "move the cursor, scroll")
    return table


class ConsoleFooter(Footer):
    """Textual's footer fed by `screen_keys`: `enter ? : q` first, writes hidden when read-only."""

    def compose(self) -> ComposeResult:
        if not self._bindings_ready:
            return
        for key in screen_keys(self.screen):
            if key.in_footer:
                yield FooterKey(key.key, key.display.split()[0], key.description, "").data_bind(compact=Footer.compact)
