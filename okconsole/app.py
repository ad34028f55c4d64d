"""The Textual console: signals overview, messages, a message's story, traces, dead letters, tails.

`ConsoleApp(database_url=None, read_only=False)` reads and writes the store only
through `engine.ops` (via `okconsole.data.StoreAdapter`).
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable, Iterable

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.suggester import SuggestFromList

from engine import ops
from engine.display import inert

from . import safe
from .data import StoreAdapter, StoreDown
from .screens.audit import AuditScreen
from .screens.clocks import ClocksScreen
from .screens.detail import DetailScreen
from .screens.dlq import DeadLettersScreen
from .screens.history import HistoryScreen
from .screens.keys import KeysScreen
from .screens.messages import MessagesScreen
from .screens.modals import HelpScreen, PromptScreen
from .screens.overview import OverviewScreen
from .screens.tail import TailScreen
from .screens.trace import TraceScreen
from .screens.workers import WorkersScreen

JUMPS = (
    "dlq SIGNAL · history SIGNAL · tail SIGNAL · trace RUN · show ID · messages SIGNAL [STATUS] · keys SIGNAL"
    " · audit · workers · clocks · signals"
)
STATUSES = ("pending", "inflight", "delivered", "dead")
SIGNAL_VERBS = {
    "dlq": "queue",
    "failures": "queue",
    "history": "queue",
    "keys": "queue",
    "messages": "queue",
    "msgs": "queue",
    "m": "queue",
    "tail": "live",
}  # what kind of signal each verb needs


class ConsoleApp(App[None]):
    CSS_PATH = "console.tcss"
    TITLE = "okconsole"
    BINDINGS = [
        Binding("question_mark", "help", "Help"),
        Binding("f1", "help", "Help", show=False),
        Binding("colon", "jump", "Jump"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        database_url: str | None = None,
        read_only: bool = False,
        *,
        refresh_s: float = 1.0,
        tail_url: str | None = None,
        tail_token: str | None = None,
        embedded: tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]] | None = None,
        exit_after_s: float | None = None,
        actor: str | None = None,
        source: str | None = None,
    ) -> None:
        """`embedded` is a (start, stop) pair run inside the app's loop (the demo's engine);
        `exit_after_s` quits after that many seconds (scripted demo runs); `actor` is who the
        audit log names for every write (default: the OS user), `source` where they come from
        (`okconsole web`: the browser's address)."""
        super().__init__()
        self.embedded = embedded
        self.exit_after_s = exit_after_s
        self.data = StoreAdapter(database_url, source=source)
        self.read_only = read_only
        self.refresh_s = refresh_s
        self.tail_url = tail_url
        self.tail_token = tail_token
        self.store_ok: bool | None = None
        self.actor = actor
        self.signal_kinds: dict[str, str] = {}  # name -> kind, as the overview last read them

    async def on_mount(self) -> None:
        self.sub_title = inert(self.data.url) + (" · read-only" if self.read_only else "")
        if self.embedded is not None:
            await self.embedded[0]()
        self.push_screen(OverviewScreen())
        if self.exit_after_s is not None:
            self.set_timer(self.exit_after_s, self.exit)

    async def on_unmount(self) -> None:
        if self.embedded is not None:
            await self.embedded[1]()
        await self.data.close()

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Every notice the console raises is plain text: they quote names, ids, keys and store
        errors, so each is made inert and never read as markup (whatever `markup` says)."""
        super().notify(
            inert(message, multiline=True), title=inert(title), severity=severity, timeout=timeout, markup=False
        )

    # -- navigation ------------------------------------------------------------------------
    def open_messages(self, signal: str, status: str | None = None) -> None:
        self.push_screen(MessagesScreen(signal, status))

    def open_detail(self, message_id: str) -> None:
        self.push_screen(DetailScreen(message_id))

    def open_trace(self, run_id: str) -> None:
        self.push_screen(TraceScreen(run_id))

    def open_dlq(self, signal: str) -> None:
        self.push_screen(DeadLettersScreen(signal))

    def open_history(self, signal: str) -> None:
        self.push_screen(HistoryScreen(signal))

    def open_tail(self, signal: str) -> None:
        self.push_screen(TailScreen(signal, self.tail_url, self.tail_token))

    def open_keys(self, signal: str) -> None:
        self.push_screen(KeysScreen(signal))

    def open_audit(self) -> None:
        self.push_screen(AuditScreen())

    def open_workers(self) -> None:
        self.push_screen(WorkersScreen())

    def open_clocks(self) -> None:
        self.push_screen(ClocksScreen())

    def open_signals(self) -> None:
        while len(self.screen_stack) > 2:
            self.pop_screen()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.screen))

    def jump_choices(self) -> list[str]:
        """What ':' completes: each verb with each signal it applies to, then the bare verbs."""
        choices = []
        for name, kind in sorted(self.signal_kinds.items()):
            if kind == "live":
                choices.append(f"tail {name}")
            else:
                choices += [f"dlq {name}", f"history {name}", f"keys {name}", f"messages {name}"] + [
                    f"messages {name} {s}" for s in STATUSES
                ]
        return choices + ["audit", "workers", "clocks", "signals", "trace ", "show "]

    def action_jump(self) -> None:
        self.push_screen(
            PromptScreen(
                f"Jump to: {JUMPS} (→ completes)",
                "dlq tasks.email",
                suggester=SuggestFromList(self.jump_choices(), case_sensitive=False),
            ),
            # once the prompt is gone: a notice raised while it is up would go with it
            lambda text: self.call_after_refresh(self.jump, text),
        )

    def jump(self, text: str | None) -> None:
        """Follow a ':' command such as `dlq tasks.email` or `tail order-status`; a signal name is
        checked against the store first (an unknown one is named, with the known ones)."""
        if not text:
            return
        try:
            words = shlex.split(text.lstrip(":"))
        except ValueError as err:
            self.notify(f"cannot read {text!r}: {err}", severity="error")
            return
        if not words:
            return
        verb, args = words[0].lower(), words[1:]
        if verb in SIGNAL_VERBS and args:
            self.run_worker(self._checked_jump(text, verb, args), group="jump", exit_on_error=False)
            return
        self._go(text, verb, args)

    async def _checked_jump(self, text: str, verb: str, args: list[str]) -> None:
        if args[0] not in self.signal_kinds:
            try:
                self.signal_kinds.update({s.signal: s.kind for s in await self.data.call(ops.stats)})
            except StoreDown as down:
                self.notify(f"cannot check {args[0]!r}: store unreachable ({down})", severity="error")
                return
        if self.refuse_signal(args[0], SIGNAL_VERBS[verb]):
            return
        self._go(text, verb, args)

    def refuse_signal(self, name: str, need: str) -> bool:
        """True (and a notice) when `name` is not a known signal of the kind a screen needs:
        "live" for a tail, "queue" (once or broadcast) for messages and dead letters."""
        kind = self.signal_kinds.get(name)
        if kind is None:
            known = ", ".join(sorted(self.signal_kinds)) or "none yet"
            self.notify(f"unknown signal {name!r} (signals: {known})", severity="error")
            return True
        if need == "live" and kind != "live":
            self.notify(f"{name} is a {kind} signal: only live signals have a tape to tail", severity="warning")
            return True
        if need == "queue" and kind == "live":
            self.notify(f"{name} is a live tape: it has no messages or dead letters (tail it)", severity="warning")
            return True
        return False

    def _go(self, text: str, verb: str, args: list[str]) -> None:
        one = {
            "dlq": self.open_dlq,
            "tail": self.open_tail,
            "trace": self.open_trace,
            "show": self.open_detail,
            "failures": self.open_dlq,
            "history": self.open_history,
            "keys": self.open_keys,
        }
        if verb in one and len(args) == 1:
            one[verb](args[0])
        elif verb in ("messages", "msgs", "m") and 1 <= len(args) <= 2:
            status = args[1] if len(args) == 2 else None
            if status not in (None, *STATUSES):
                self.notify(f"unknown status {status!r}", severity="error")
                return
            self.open_messages(args[0], status)
        elif verb == "audit" and not args:
            self.open_audit()
        elif verb == "workers" and not args:
            self.open_workers()
        elif verb == "clocks" and not args:
            self.open_clocks()
        elif verb in ("signals", "overview", "home") and not args:
            self.open_signals()
        else:
            self.notify(f"unknown jump {text!r}; try: {JUMPS}", severity="error")

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's, the console's own, then the screen's keys: each title once (the overview's
        `a` "Audit log" is the console's "Audit log", not a second entry)."""
        own = [
            *super().get_system_commands(screen),
            SystemCommand("Signals overview", "Back to the list of signals", self.open_signals),
            SystemCommand("Jump…", f"Go to: {safe.escape(JUMPS)}", self.action_jump),
            SystemCommand("Audit log", "Every write, who and why", self.open_audit),
            SystemCommand("Workers", "Who holds the leases; orphaned ones marked", self.open_workers),
            SystemCommand("Clocks", "Each clock's next and last tick, and its last outcome", self.open_clocks),
            SystemCommand("Help", "Keys and commands", self.action_help),
        ]
        yield from own
        listed = {command.title.lower() for command in own}
        for binding in screen.BINDINGS:
            if isinstance(binding, Binding) and binding.description and binding.description.lower() not in listed:
                listed.add(binding.description.lower())
                action = binding.action

                def run(action: str = action) -> None:
                    self.call_later(screen.run_action, action)

                where = safe.escape(screen.TITLE_TEXT) if screen.TITLE_TEXT else "this screen"
                yield SystemCommand(binding.description, f"{where}: key {binding.key}", run)
