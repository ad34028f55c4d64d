"""Dialogs: confirm (Enter is the safe choice), prompt for a ':' jump, edit a payload, help."""
from __future__ import annotations

import json
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea


class ConfirmScreen(ModalScreen[bool]):
    """Asks before a write. Focus starts on Cancel, so Enter never destroys anything by accident."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("y", "confirm", "Yes", show=False),
                Binding("n", "cancel", "No", show=False)]

    def __init__(self, question: str, action_label: str = "Confirm") -> None:
        super().__init__()
        self.question = question
        self.action_label = action_label

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.question, id="question")
            with Horizontal():
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(self.action_label, id="confirm", variant="error")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm")

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)


class PromptScreen(ModalScreen[str | None]):
    """One line of input: the ':' jump bar (`dlq tasks.email`, `tail order-status`, `trace RUN`)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, label: str, placeholder: str = "", value: str = "") -> None:
        super().__init__()
        self.label = label
        self.placeholder = placeholder
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.label)
            yield Input(value=self.value, placeholder=self.placeholder, id="prompt-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class EditPayloadScreen(ModalScreen[Any]):
    """Edit a dead letter's payload as JSON before replaying it; returns the new value or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Replay with this payload")]

    def __init__(self, message_id: str, payload: Any) -> None:
        super().__init__()
        self.message_id = message_id
        self.payload = payload

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(f"Payload of {self.message_id} (ctrl+s replays with it, esc cancels)")
            yield TextArea(json.dumps(self.payload, indent=2, ensure_ascii=False), language="json",
                           id="payload-editor")
            yield Label("", id="edit-error")
            with Horizontal():
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button("Replay", id="save", variant="error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.dismiss(None)

    def action_save(self) -> None:
        text = self.query_one("#payload-editor", TextArea).text
        try:
            value = json.loads(text)
        except ValueError as err:
            self.query_one("#edit-error", Label).update(f"[b red]not JSON:[/] {err}")
            return
        self.dismiss({"payload": value})

    def action_cancel(self) -> None:
        self.dismiss(None)


HELP = """\
[b]okconsole[/b] — the operator console of okengine

[b]Anywhere[/b]
  ?  f1        this help                 :        jump: dlq S · tail S · trace RUN · show ID · messages S · audit
  esc          back                      ctrl+p   command palette (every action)
  r            refresh now               q        quit

[b]Signals[/b]
  enter        messages of the signal    d        its dead letters
  f            failures grouped          t        tail a live tape
  /            filter (prefix ! inverts)

[b]Messages[/b]
  1..5         all · pending · inflight · delivered · dead
  n / p        next / previous page      s        sort by the column under the cursor
  enter        the message               /        filter the page (! inverts)

[b]Message[/b]
  t            its trace                 R        replay it (dead only)
  e            edit payload and replay

[b]Dead letters[/b]
  space        tag / untag               R        replay tagged (or the row)
  A            replay all matching the filter
  e            edit payload and replay   P        purge dead letters

[b]Tail[/b]
  end          follow again (sticky bottom); scrolling up pauses with an "N new" badge

--read-only disables every write.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape", "close", "Close"), Binding("question_mark", "close", show=False),
                Binding("f1", "close", show=False), Binding("q", "close", show=False)]

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            with VerticalScroll(id="help-text"):
                yield Static(HELP)

    def action_close(self) -> None:
        self.dismiss(None)
