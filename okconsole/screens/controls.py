"""The operator controls on the screens that list messages: cancel, delete, retry now.

A screen that lists messages subclasses `MessageControls`, says which controls it offers
(`CONTROLS`) and which messages they act on (`control_target`: the tagged ones, else the one under
the cursor). Each asks first with a ConfirmScreen that names the count, or the id and key of the
one message, and takes the reason the audit log records; a control that does not apply to the
message's status is not offered (a notice says why); each is hidden and refused under --read-only,
like every write.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual.binding import Binding
from textual.content import Content

from engine import ops

from ..safe import content
from .base import ConsoleScreen
from .modals import ConfirmScreen, EditPayloadScreen


@dataclass(frozen=True)
class Control:
    verb: str  # the engine.ops call and the audit's action
    label: str  # the confirmation button and the question's first word
    effect: str  # what the question says happens (to several)
    effect_one: str  # the same, of one message
    done: str  # the past participle of the report


CONTROLS = {
    "cancel": Control(
        "cancel",
        "Cancel",
        "They end dead (code Cancelled) and stay replayable.",
        "It ends dead (code Cancelled) and stays replayable.",
        "cancelled",
    ),
    "delete": Control(
        "delete",
        "Delete",
        "Only delivered or dead ones go; this cannot be undone.",
        "It goes with its failure history; this cannot be undone.",
        "deleted",
    ),
    "retry": Control(
        "retry",
        "Retry now",
        "Those waiting for their run_at become due now.",
        "It becomes due now instead of at its run_at.",
        "retried",
    ),
}
CALLS: dict[str, Callable[..., Any]] = {"cancel": ops.cancel, "delete": ops.delete, "retry": ops.retry}
CONTROL_BINDINGS = [
    Binding("x", "control('cancel')", "Cancel message"),
    Binding("X", "control('delete')", "Delete finished"),
    Binding("N", "control('retry')", "Retry now"),
]


@dataclass(frozen=True)
class RowFacts:
    """What a screen knows of one message it shows: enough to name it and to tell which controls apply."""

    key: str | None
    status: str
    waiting: bool = False  # pending with its run_at still ahead (a delay, a back-off)
    leased: bool = False  # inflight under a live lease


def not_offered(verb: str, msg_id: str, facts: RowFacts | None) -> str | None:
    """Why `verb` does nothing to this message, said plainly (None: it applies, or the screen
    does not know; the engine skips and reports what moved on meanwhile)."""
    if facts is None:
        return None
    status = facts.status
    if verb == "cancel" and status in ("delivered", "dead"):
        return f"{msg_id} is {status}: nothing to cancel"
    if verb == "retry" and status == "pending" and not facts.waiting:
        return f"{msg_id} is pending and already due: nothing to retry"
    if verb == "retry" and status != "pending":
        after = " (a dead letter is replayed, not retried)" if status == "dead" else ""
        return f"{msg_id} is {status}: nothing to retry{after}"
    if verb == "delete" and status not in ("delivered", "dead"):
        return f"{msg_id} is {status}: only delivered or dead messages are deleted"
    return None


# What the question says of one running message: its holder is asked to stop it (ops.cancel).
STOP_RUNNING = (
    "Stop the running handler of {it} of $signal? Its worker cancels the handler; it ends dead "
    "(code Cancelled) and stays replayable."
)


def question_one(control: Control, facts: RowFacts | None) -> str:
    """The question's template for one message: cancelling a running one says that its handler stops."""
    if control.verb == "cancel" and facts is not None and facts.leased:
        return STOP_RUNNING
    return f"{control.label} {{it}} of $signal? {control.effect_one}"


def one_message(template: str, msg_id: str, key: str | None, **values: Any) -> Content:
    """A question about one message: `{it}` in `template` becomes its id and, when it has one, its
    key, so the dialog names what it acts on (both stored text, inserted literally)."""
    it = "$id (key $key)" if key else "$id"
    return content(template.replace("{it}", it), id=msg_id, key=key or "", **values)


class MessageControls(ConsoleScreen):
    """Cancel / delete / retry the messages `control_target` names; replay and edit-and-replay one."""

    BINDINGS = CONTROL_BINDINGS
    CONTROLS: tuple[str, ...] = ("cancel", "delete", "retry")

    def control_target(self) -> tuple[str, list[str]] | None:
        """(signal, ids) the controls act on now; None when nothing is selected."""
        return None

    def row_facts(self, msg_id: str) -> RowFacts | None:
        """What this screen shows of `msg_id` (None: not shown here)."""
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "control":
            return not self.console.read_only and bool(parameters) and parameters[0] in self.CONTROLS
        return super().check_action(action, parameters)

    def action_control(self, verb: str) -> None:
        """Ask about the messages selected NOW (one is named by id and key) and act on those ids,
        whatever the list shows by the time the operator confirms (it refreshes every second)."""
        if self.refuse_write():
            return
        target = self.control_target()
        if target is None:
            self.notify("no message selected", severity="warning")
            return
        signal, ids = target
        control = CONTROLS[verb]
        if len(ids) == 1:
            facts = self.row_facts(ids[0])
            why = not_offered(verb, ids[0], facts)
            if why is not None:
                self.notify(why, severity="warning")
                return
            question = one_message(question_one(control, facts), ids[0], facts.key if facts else None, signal=signal)
        else:
            question = content(f"{control.label} {len(ids)} messages of $signal? {control.effect}", signal=signal)

        def confirmed(reason: str | None) -> None:
            if reason:
                worker = self.run_write(verb, CALLS[verb], signal, ids, reason=reason)
                self.run_worker(self._report(control, signal, worker), group="report", exit_on_error=False)

        self.app.push_screen(ConfirmScreen(question, f"{control.label} {len(ids)}"), confirmed)

    async def _report(self, control: Control, signal: str, worker: Any) -> None:
        result = await worker.wait()
        if result is None:
            return  # run_write has said why
        self.notify(report_text(control, signal, result), severity="warning" if result.skipped else "information")
        self.after_control(result)

    def after_control(self, result: Any) -> None:
        """A screen's own follow-up (untag what was acted on)."""

    def ask_edit_replay(self, signal: str, msg_id: str, key: str | None, payload: Any) -> Any:
        """`e`: the payload in an editor that checks it against the signal's schema on ctrl+s (a
        refusal is shown there, the edit kept), then the reason; replays `msg_id` with it. Returns
        nothing; the write's worker is handed to `after_replay`."""

        async def check(value: Any) -> None:
            await self.console.data.call(ops.replay, signal, [msg_id], payload=value, dry_run=True)

        def edited(result: Any) -> None:
            if result is None:
                return

            def confirmed(reason: str | None) -> None:
                if reason:
                    worker = self.run_write(
                        "replay", ops.replay, signal, [msg_id], payload=result["payload"], reason=reason, warn=self.warn
                    )
                    self.after_replay(worker)

            question = one_message("Replay {it} of $signal with the edited payload?", msg_id, key, signal=signal)
            # after the editor has gone: pushed from its dismiss callback, the pop would take this one
            self.app.call_later(self.app.push_screen, ConfirmScreen(question, "Replay 1"), confirmed)

        self.app.push_screen(EditPayloadScreen(msg_id, payload, check), edited)

    def after_replay(self, worker: Any) -> None:
        """A screen's own follow-up to a replay it started (report it, untag)."""


def report_text(control: Control, signal: str, result: Any) -> str:
    """ "cancelled 2 message(s) of SIGNAL", then what was skipped and why."""
    text = f"{control.done} {getattr(result, control.done)} message(s) of {signal}"
    requested = getattr(result, "requested", [])
    if requested:
        text += f"; asked the worker of {len(requested)} running message(s) to stop: " + ", ".join(requested[:5])
    for s in result.skipped[:5]:
        text += f"; skipped {s.id} ({s.status})"
    if len(result.skipped) > 5:
        text += f"; … {len(result.skipped) - 5} more skipped"
    return text
