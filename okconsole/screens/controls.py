"""The operator controls on the screens that list messages (SPEC §11): cancel, delete, retry now.

A screen that lists messages subclasses `MessageControls`, says which controls it offers
(`CONTROLS`) and which messages they act on (`control_target`: the tagged ones, else the one under
the cursor). Each asks first with a ConfirmScreen that names the count and takes the reason the
audit log records; each is hidden and refused under --read-only, like every write.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual.binding import Binding

from engine import ops

from ..safe import content
from .base import ConsoleScreen
from .modals import ConfirmScreen


@dataclass(frozen=True)
class Control:
    verb: str  # the engine.ops call and the audit's action
    label: str  # the confirmation button and the question's first word
    effect: str  # what the question says happens
    done: str  # the past participle of the report


CONTROLS = {
    "cancel": Control("cancel", "Cancel", "They end dead (code Cancelled) and stay replayable.", "cancelled"),
    "delete": Control("delete", "Delete", "Only delivered or dead ones go; this cannot be undone.", "deleted"),
    "retry": Control("retry", "Retry now", "Those waiting for their run_at become due now.", "retried"),
}
CALLS: dict[str, Callable[..., Any]] = {"cancel": ops.cancel, "delete": ops.delete, "retry": ops.retry}
CONTROL_BINDINGS = [
    Binding("x", "control('cancel')", "Cancel message"),
    Binding("X", "control('delete')", "Delete finished"),
    Binding("N", "control('retry')", "Retry now"),
]


class MessageControls(ConsoleScreen):
    """Cancel / delete / retry the messages `control_target` names."""

    BINDINGS = CONTROL_BINDINGS
    CONTROLS: tuple[str, ...] = ("cancel", "delete", "retry")

    def control_target(self) -> tuple[str, list[str]] | None:
        """(signal, ids) the controls act on now; None when nothing is selected."""
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "control":
            return not self.console.read_only and bool(parameters) and parameters[0] in self.CONTROLS
        return super().check_action(action, parameters)

    def action_control(self, verb: str) -> None:
        if self.refuse_write():
            return
        target = self.control_target()
        if target is None:
            self.notify("no message selected", severity="warning")
            return
        signal, ids = target
        control = CONTROLS[verb]
        noun = "message" if len(ids) == 1 else "messages"

        def confirmed(reason: str | None) -> None:
            if reason:
                worker = self.run_write(verb, CALLS[verb], signal, ids, reason=reason)
                self.run_worker(self._report(control, signal, worker), group="report", exit_on_error=False)

        question = content(f"{control.label} {len(ids)} {noun} of $signal? {control.effect}", signal=signal)
        self.app.push_screen(ConfirmScreen(question, f"{control.label} {len(ids)}"), confirmed)

    async def _report(self, control: Control, signal: str, worker: Any) -> None:
        result = await worker.wait()
        if result is None:
            return  # run_write has said why
        self.notify(report_text(control, signal, result), severity="warning" if result.skipped else "information")
        self.after_control(result)

    def after_control(self, result: Any) -> None:
        """A screen's own follow-up (untag what was acted on)."""


def report_text(control: Control, signal: str, result: Any) -> str:
    """ "cancelled 2 message(s) of SIGNAL", then what was skipped and why."""
    text = f"{control.done} {getattr(result, control.done)} message(s) of {signal}"
    for s in result.skipped[:5]:
        text += f"; skipped {s.id} ({s.status})"
    if len(result.skipped) > 5:
        text += f"; … {len(result.skipped) - 5} more skipped"
    return text
