"""Dialogs: confirm a write with its reason, prompt for a ':' jump or a path, edit a payload, help."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen, Screen
from textual.suggester import Suggester
from textual.widgets import Button, Input, Label, Static, TextArea

from engine.display import json_text

from ..safe import content
from ..widgets.keys import help_table


class ConfirmScreen(ModalScreen[str | None]):
    """Asks before a write, and for the reason the audit log records; returns the reason, or None.

    Enter never destroys by accident: with the reason empty it only says one is needed; typing a
    reason and pressing Enter (or the button) is the deliberate act. Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, question: Content, action_label: str = "Confirm") -> None:
        """`question` is Content (okconsole.safe.content): it names signals and ids, stored text."""
        super().__init__()
        self.question = question
        self.action_label = action_label

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.question, id="question")
            yield Input(placeholder="why (recorded in the audit log)", id="reason")
            yield Label("type a reason, enter confirms · esc cancels", id="reason-hint")
            with Horizontal():
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(self.action_label, id="confirm", variant="error")

    def on_mount(self) -> None:
        self.query_one("#reason", Input).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "confirm":
            self.action_confirm()
        else:
            self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_confirm()

    def action_confirm(self) -> None:
        reason = self.query_one("#reason", Input).value.strip()
        if not reason:
            self.query_one("#reason-hint", Label).update("[b red]a reason is required[/] (esc cancels)")
            self.query_one("#reason", Input).focus()
            return
        self.dismiss(reason)

    def action_cancel(self) -> None:
        self.dismiss(None)


class PromptScreen(ModalScreen[str | None]):
    """One line of input: the ':' jump bar (`dlq tasks.email`, `tail order-status`, `trace RUN`)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, label: str, placeholder: str = "", value: str = "", suggester: Suggester | None = None) -> None:
        super().__init__()
        self.label = label
        self.placeholder = placeholder
        self.value = value
        self.suggester = suggester

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(Content(self.label))  # plain: "messages SIGNAL [STATUS]" is not markup
            yield Input(value=self.value, placeholder=self.placeholder, id="prompt-input", suggester=self.suggester)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class EditPayloadScreen(ModalScreen[Any]):
    """Edit a dead letter's payload as JSON before replaying it; returns {"payload": value} or None.

    ctrl+s checks the edit first: JSON, then `check(value)` (the signal's schema, by a dry run of
    the replay), which raises to refuse it. A refusal is shown here and the edit stays, to fix."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Replay with this payload")]

    def __init__(self, message_id: str, payload: Any, check: Callable[[Any], Awaitable[None]] | None = None) -> None:
        super().__init__()
        self.message_id = message_id
        self.payload = payload
        self.check = check

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(content("Payload of $id (ctrl+s replays with it, esc cancels)", id=self.message_id))
            # every control character as a JSON escape: the editor draws it visibly, json.loads reads it back
            yield TextArea(json_text(self.payload, indent=2), language="json", id="payload-editor")
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
            self.refuse(content("[b red]not JSON:[/] $err", err=err))
            return
        if self.check is None:
            self.dismiss({"payload": value})
            return
        self.query_one("#edit-error", Label).update("checking against the signal's schema…")
        self.run_worker(self._checked(value), group="check", exclusive=True, exit_on_error=False)

    async def _checked(self, value: Any) -> None:
        assert self.check is not None
        try:
            await self.check(value)
        except Exception as err:  # OKE1250 (the schema), the store away, the letter gone: say it here
            self.refuse(content("[b red]refused:[/] $err", err=err))
            return
        self.dismiss({"payload": value})

    def refuse(self, why: Content) -> None:
        """Say why the edit cannot be replayed, and give the editor back with the edit in it."""
        self.query_one("#edit-error", Label).update(why)
        self.query_one("#payload-editor", TextArea).focus()

    def action_cancel(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    """Every key of the screen underneath, read from its bindings (widgets/keys.py)."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", show=False),
        Binding("f1", "close", show=False),
        Binding("q", "close", show=False),
    ]

    def __init__(self, under: Screen[Any]) -> None:
        super().__init__()
        self.under = under

    def compose(self) -> ComposeResult:
        title = getattr(self.under, "TITLE_TEXT", "") or "this screen"
        with Vertical(id="dialog"):
            with VerticalScroll(id="help-text"):
                yield Static(content("[b]Keys · $title[/b]", title=title))
                yield Static(help_table(self.under))
                yield Static("esc closes · --read-only hides every write")

    def on_mount(self) -> None:
        self.query_one("#help-text", VerticalScroll).focus()  # ↓ pgdn end scroll it

    def action_close(self) -> None:
        self.dismiss(None)
