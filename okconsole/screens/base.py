"""What every console screen shares: the store status line, periodic refresh, back, filter."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Input, Static

from engine.display import inert

from ..data import StoreDown
from ..safe import content
from ..widgets.keys import ConsoleFooter
from ..widgets.tui_tables import FittedTable

if TYPE_CHECKING:
    from ..app import ConsoleApp


def text_filter(query: str) -> Any:
    """A predicate over row text for '/' filters: substring, case-insensitive; '!' inverts."""
    invert = query.startswith("!")
    needle = (query[1:] if invert else query).strip().lower()

    def keep(text: str) -> bool:
        found = needle in text.lower()
        return not found if invert else found

    return keep


class ConsoleScreen(Screen[None]):
    """A screen that loads from the store on mount and every refresh tick."""

    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("r", "refresh", "Refresh"),
        Binding("slash", "filter", "Filter"),
    ]
    TITLE_TEXT = ""
    ENTER_HINT = ""  # what enter does here (the footer and `?` show it first)
    WRITE_ACTIONS: frozenset[str] = frozenset()  # hidden and refused with --read-only
    filter_text = ""

    @property
    def console(self) -> ConsoleApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        # until the store first answers (a server that accepts and never replies): say so
        yield Static(content("[b]okconsole[/b] · connecting to $url…", url=self.console.data.url), id="status")
        yield from self.body()
        yield Static("", id="cols-note")  # which columns a narrow terminal left out (FittedTable)
        yield Input(placeholder="filter (prefix ! inverts) — enter applies, esc clears", id="filter")
        yield ConsoleFooter()

    def body(self) -> ComposeResult:
        yield from ()

    def on_fitted_table_fitted(self, event: FittedTable.Fitted) -> None:
        self.show_cols_note()

    def show_cols_note(self) -> None:
        """The columns a narrow terminal left out, as the screen's tables say now (a table fits
        itself as it mounts, before this line exists: the screen's mount shows it then)."""
        notes = [table.note for table in self.query(FittedTable) if table.note]
        for note in self.query("#cols-note").results(Static):
            note.update(Content(" · ".join(notes)))  # column labels: plain text
            note.display = bool(notes)

    def on_mount(self) -> None:
        self.sub_title = inert(self.TITLE_TEXT)  # the first load comes with ScreenResume, as every later one
        self.show_cols_note()
        self.set_interval(self.console.refresh_s, self.action_refresh)

    def action_refresh(self) -> None:
        if not self.is_current:  # covered by another screen: no store load; it reloads on resume
            return
        if self._loading:  # a slow store: let the running load finish rather than pile up
            self._reload = True
            return
        self._loading = True
        self.run_worker(self._load, group="load", exit_on_error=False)

    _loading = False
    _reload = False

    def on_screen_resume(self) -> None:
        self.action_refresh()

    async def _load(self) -> None:
        try:
            await self._load_once()
        finally:
            self._loading = False
        if self._reload:
            self._reload = False
            self.action_refresh()

    async def _load_once(self) -> None:
        status = self.query_one("#status", Static)
        try:
            await self.load()
        except StoreDown as down:
            status.set_class(True, "down")
            status.update(
                content("[b]store unreachable[/b] ($url): $down — retrying", url=self.console.data.url, down=down)
            )
            self.console.store_ok = False
            return
        status.set_class(False, "down")
        self.console.store_ok = True
        status.update(self.status_text())

    def status_text(self) -> Content:
        mode = " · [b]read-only[/b]" if self.console.read_only else ""
        where = " · $where" if self.TITLE_TEXT else ""
        return content(
            f"[b]okconsole[/b]{where} · store $url · ok{mode}", where=self.TITLE_TEXT, url=self.console.data.url
        )

    async def load(self) -> None:
        """Fetch from the store and render; raise StoreDown when it is away."""

    def action_back(self) -> None:
        field = self.query_one("#filter", Input)
        if field.has_class("shown"):
            field.value = ""
            field.set_class(False, "shown")
            self.apply_filter("")
            return
        if len(self.app.screen_stack) > 2:
            self.app.pop_screen()

    def action_filter(self) -> None:
        field = self.query_one("#filter", Input)
        field.set_class(True, "shown")
        field.value = self.filter_text
        field.focus()

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        event.input.set_class(bool(event.value), "shown")
        self.apply_filter(event.value)
        self.focus_main()

    def apply_filter(self, text: str) -> None:
        self.filter_text = text
        self.action_refresh()

    def focus_main(self) -> None:
        """Give the keyboard back to the screen's main widget."""

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Writes do not exist in --read-only: not in the footer, not in `?`, not on their key."""
        return not (self.console.read_only and action in self.WRITE_ACTIONS)

    def copy_id(self, value: str | None) -> None:
        """`y`: put an id on the clipboard (OSC 52, through the terminal) and say which."""
        if not value:
            self.notify("nothing selected to copy", severity="warning")
            return
        self.app.copy_to_clipboard(value)
        self.notify(f"copied {value}", title="clipboard")

    def refuse_write(self) -> bool:
        """True (and a notice) when the console is read-only."""
        if self.console.read_only:
            self.notify("read-only mode: writes are disabled", severity="warning")
            return True
        return False

    def warn(self, text: str) -> None:
        """A notice the operator should read (e.g. a payload stored without being validated)."""
        self.notify(text, severity="warning", timeout=10)

    @work(group="write", exit_on_error=False)
    async def run_write(self, label: str, fn: Any, *args: Any, reason: str, **kwargs: Any) -> Any:
        """Run a store write through engine.ops and report the outcome; the audit log records the
        console's --actor (default: the OS user) and the reason the operator typed."""
        try:
            result = await self.console.data.call(fn, *args, reason=reason, actor=self.console.actor, **kwargs)
        except StoreDown as down:
            self.notify(f"{label} failed: store unreachable ({down})", severity="error")
            return None
        except (LookupError, ValueError, TypeError) as err:
            self.notify(f"{label} failed: {err}", severity="error")
            return None
        except Exception as err:  # an OKE code or another refusal from the engine
            self.notify(f"{label} failed: {err}", severity="error")
            return None
        self.action_refresh()
        return result
