"""Dead letters of a signal: failure groups, tagging, replay (tagged / all / edited), purge."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from engine import ops
from engine.display import one_line

from .. import fmt
from ..safe import cell, content
from ..styles import DEAD_STYLE
from ..widgets.tui_tables import Table, sync_rows
from .base import text_filter
from .controls import MessageControls, RowFacts, one_message
from .modals import ConfirmScreen

LIMIT = 200


SHORT_SCREEN = 30  # rows: below this the failure groups start folded (80×24 keeps the letters)


class DeadLettersScreen(MessageControls):
    ENTER_HINT = "Open"  # on a failure group: filter the letters by it
    CONTROLS = ("delete",)  # a dead letter is neither cancelled nor retried (replay requeues it)
    WRITE_ACTIONS = frozenset({"replay", "replay_all", "edit", "purge"})
    BINDINGS = [
        Binding("space", "tag", "Tag"),
        Binding("R", "replay", "Replay tagged"),
        Binding("A", "replay_all", "Replay all matching"),
        Binding("e", "edit", "Edit & replay"),
        Binding("P", "purge", "Purge dead"),
        Binding("g", "groups", "Fold groups"),
        Binding("y", "copy_id", "Copy id"),
        Binding("tab", "focus_next", "Switch pane", show=False),
    ]

    def __init__(self, signal: str) -> None:
        super().__init__()
        self.signal = signal
        self.letters: list[Any] = []
        self.tagged: set[str] = set()
        self.shown: list[str] = []
        self.total_dead: int | None = None  # from the store's counters, once loaded

    def body(self) -> ComposeResult:
        yield Static("", id="title")
        yield Static(
            "Failures by code and message (enter filters by a group · g folds)", classes="pane-title", id="groups-title"
        )
        groups: DataTable[Any] = Table(id="groups", cursor_type="row")
        for key in ("count", "code", "message", "last"):
            groups.add_column(key.capitalize(), key=key)
        yield groups
        yield Static(
            "Dead letters (read-only)"
            if self.console.read_only
            else "Dead letters (space tags, R replays tagged, A all matching, e edits, P purges)",
            classes="pane-title",
        )
        table: DataTable[Any] = Table(id="letters", cursor_type="row", zebra_stripes=True)
        for key, label in (
            ("tag", " "),
            ("id", "Id"),
            ("key", "Key"),
            ("attempts", "Att."),
            ("code", "Last code"),
            ("message", "Last message"),
            ("created", "Created"),
        ):
            table.add_column(label, key=key)
        yield table

    def on_mount(self) -> None:
        self.TITLE_TEXT = f"dead letters · {self.signal}"
        super().on_mount()
        self.query_one("#letters", DataTable).focus()
        if self.app.size.height < SHORT_SCREEN:
            self.action_groups()

    def action_groups(self) -> None:
        """Fold or unfold the failure groups pane (folded, the dead letters get its rows)."""
        groups = self.query_one("#groups", DataTable)
        groups.display = not groups.display
        if not groups.display and groups.has_focus:
            self.focus_main()
        self.title_groups()

    def title_groups(self) -> None:
        groups = self.query_one("#groups", DataTable)
        self.query_one("#groups-title", Static).update(
            "Failures by code and message (enter filters by a group · g folds)"
            if groups.display
            else f"Failures by code and message: {groups.row_count} group{'' if groups.row_count == 1 else 's'}, "
            "folded (g shows them)"
        )

    def focus_main(self) -> None:
        self.query_one("#letters", DataTable).focus()

    async def load(self) -> None:
        # the letters first: they are what the operator came for; the groups (which read every
        # failing message of the signal) and the exact total fill in a moment later
        self.letters = await self.console.data.call(ops.dead_letters, self.signal, LIMIT)
        self.render_letters()
        groups = await self.console.data.call(ops.failures, self.signal)
        counted = [s.dead for s in await self.console.data.call(ops.stats) if s.signal == self.signal]
        self.total_dead = counted[0] if counted else None
        table = self.query_one("#groups", DataTable)
        rows = [
            (
                f"{g.code}\x00{g.message}",
                [
                    cell(str(g.count)),
                    cell(g.code, DEAD_STYLE),
                    cell(fmt.short(one_line(g.message), 80)),
                    cell(fmt.ago(g.last_at)),
                ],
            )
            for g in groups
        ]
        sync_rows(table, rows, ("count", "code", "message", "last"))
        self.title_groups()
        self.render_letters()

    def render_letters(self) -> None:
        keep = text_filter(self.filter_text) if self.filter_text else None
        rows = []
        for d in self.letters:
            last = next((f for f in reversed(d.failures) if f.code != "replayed"), None)
            code = last.code if last else "—"
            message = last.message if last else ""
            if keep is not None and not keep(f"{d.id} {d.key or ''} {code} {message}"):
                continue
            rows.append(
                (
                    d.id,
                    [
                        cell("●" if d.id in self.tagged else " "),
                        cell(d.id),
                        cell(d.key or "—"),
                        cell(str(d.attempts)),
                        cell(code),
                        cell(fmt.short(one_line(message), 60)),
                        cell(fmt.ago(d.created_at)),
                    ],
                )
            )
        self.shown = [key for key, _ in rows]
        sync_rows(
            self.query_one("#letters", DataTable), rows, ("tag", "id", "key", "attempts", "code", "message", "created")
        )
        total = self.total_dead if self.total_dead is not None else len(self.letters)
        more = f" (showing the newest {len(self.letters)})" if total > len(self.letters) else ""
        filt = " · filter $filter" if self.filter_text else ""
        ro = " · [b]read-only[/b]" if self.console.read_only else ""
        self.query_one("#title", Static).update(
            content(
                f"[b]$signal[/b] · {total:,} dead{more} · {len(self.tagged)} tagged{filt}{ro}",
                signal=self.signal,
                filter=repr(self.filter_text),
            )
        )

    def apply_filter(self, text: str) -> None:
        self.filter_text = text
        self.render_letters()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "groups" and event.row_key.value:
            code, _, message = event.row_key.value.partition("\x00")
            self.apply_filter(code)
            self.focus_main()
        elif event.data_table.id == "letters" and event.row_key.value:
            self.console.open_detail(event.row_key.value)

    def _cursor_id(self) -> str | None:
        table = self.query_one("#letters", DataTable)
        if table.row_count == 0:
            return None
        key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
        return key.value

    def action_tag(self) -> None:
        current = self._cursor_id()
        if current is None:
            return
        self.tagged ^= {current}
        self.render_letters()
        table = self.query_one("#letters", DataTable)
        if table.cursor_row + 1 < table.row_count:
            table.move_cursor(row=table.cursor_row + 1)

    def _after_replay(self, result: Any) -> None:
        if result is not None:
            self.notify(f"replayed {result.replayed} dead letter(s) of {self.signal}")
            self.tagged -= set(result.ids)

    def action_replay(self) -> None:
        """R: the tagged letters shown, else the one under the cursor (named by id and key), chosen
        now: confirming acts on these ids, whatever the list shows by then."""
        if self.refuse_write():
            return
        ids = [i for i in self.shown if i in self.tagged] or ([self._cursor_id()] if self._cursor_id() else [])
        if not ids:
            return

        def confirmed(reason: str | None) -> None:
            if reason:
                self.after_replay(self.run_write("replay", ops.replay, self.signal, ids, reason=reason))

        if len(ids) == 1:
            facts = self.row_facts(ids[0])
            key = facts.key if facts else None
            question = one_message("Replay the dead letter {it} of $signal?", ids[0], key, signal=self.signal)
        else:
            question = content(f"Replay {len(ids)} dead letters of $signal?", signal=self.signal)
        self.app.push_screen(ConfirmScreen(question, f"Replay {len(ids)}"), confirmed)

    def action_replay_all(self) -> None:
        if self.refuse_write():
            return
        if self.filter_text:
            self.run_worker(self._ask_replay_matching(self.filter_text), group="replay", exit_on_error=False)
            return
        more = "+" if len(self.letters) >= LIMIT else ""
        question = content(f"Replay ALL {len(self.letters)}{more} dead letters of $signal?", signal=self.signal)

        def confirmed(reason: str | None) -> None:
            if reason:
                self.after_replay(self.run_write("replay", ops.replay, self.signal, all=True, reason=reason))

        self.app.push_screen(ConfirmScreen(question, "Replay"), confirmed)

    async def _ask_replay_matching(self, text: str) -> None:
        """After a filter, A takes every match in the store, not only the rows loaded: count them
        there (a dry run), ask with that count, then replay by the same filter."""
        try:
            preview = await self.console.data.call(ops.replay, self.signal, all=True, text=text, dry_run=True)
        except Exception as err:  # the store away, or the signal gone
            self.notify(f"replay failed: {err}", severity="error")
            return
        count = preview.would_replay
        if not count:
            self.notify("no dead letter matches the filter")
            return

        def confirmed(reason: str | None) -> None:
            if reason:
                self.after_replay(self.run_write("replay", ops.replay, self.signal, all=True, text=text, reason=reason))

        question = content(
            f"Replay all {count:,} dead letters of $signal matching $filter?", signal=self.signal, filter=repr(text)
        )
        self.app.push_screen(ConfirmScreen(question, f"Replay {count:,}"), confirmed)

    def action_edit(self) -> None:
        if self.refuse_write():
            return
        current = self._cursor_id()
        letter = next((d for d in self.letters if d.id == current), None)
        if letter is not None:
            self.ask_edit_replay(self.signal, letter.id, letter.key, letter.payload)

    def row_facts(self, msg_id: str) -> RowFacts | None:
        letter = next((d for d in self.letters if d.id == msg_id), None)
        return None if letter is None else RowFacts(key=letter.key, status="dead")

    def action_copy_id(self) -> None:
        self.copy_id(self._cursor_id())

    def control_target(self) -> tuple[str, list[str]] | None:
        """The tagged letters shown, else the one under the cursor."""
        current = self._cursor_id()
        ids = [i for i in self.shown if i in self.tagged] or ([current] if current else [])
        return (self.signal, ids) if ids else None

    def after_control(self, result: Any) -> None:
        self.tagged -= set(result.ids)

    def _purge_selection(self) -> tuple[list[str] | None, str | None, str]:
        """What P deletes: the tagged letters, else every match of the filter in the store (not
        only the rows loaded), else every dead letter of the signal; as (ids, filter text), and
        how the question names them."""
        tagged = [i for i in self.shown if i in self.tagged]
        if tagged:
            return tagged, None, "tagged "
        if self.filter_text:
            return None, self.filter_text, f"matching {self.filter_text!r} "
        return None, None, ""

    def action_purge(self) -> None:
        if self.refuse_write():
            return
        ids, text, which = self._purge_selection()
        self.run_worker(self._ask_purge(ids, text, which), group="purge", exit_on_error=False)

    async def _ask_purge(self, ids: list[str] | None, text: str | None, which: str) -> None:
        """Ask with the exact count the store would delete now (a dry run), then purge those."""
        try:
            preview = await self.console.data.call(ops.purge, self.signal, "dead", dry_run=True, ids=ids, text=text)
        except Exception as err:  # the store away, or the signal gone
            self.notify(f"purge failed: {err}", severity="error")
            return
        count = preview.would_purge
        if not count:
            self.notify(
                "no dead letter matches the filter" if text else "nothing to purge: no such dead letter any more"
            )
            return
        noun = "dead letter" if count == 1 else "dead letters"

        def confirmed(reason: str | None) -> None:
            if reason:
                self.run_write("purge", ops.purge, self.signal, "dead", ids=ids, text=text, reason=reason)

        question = content(
            f"Delete {count:,} ${{which}}{noun} of $signal? This cannot be undone.", which=which, signal=self.signal
        )
        self.app.push_screen(ConfirmScreen(question, f"Purge {count:,}"), confirmed)

    def after_replay(self, worker: Any) -> None:
        async def report() -> None:
            result = await worker.wait()
            self._after_replay(result)

        self.run_worker(report(), group="report", exit_on_error=False)
