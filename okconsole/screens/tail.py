"""Tail a live tape: from the store or over SSE; sticky bottom, 'N new' badge, resume, gap notice."""
from __future__ import annotations

import asyncio
import json
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Log, Static

from engine.client import Client, LiveResumeGap
from engine.ops import tapes

from ..data import StoreDown
from .base import ConsoleScreen

BACKLOG = 10
STORE_POLL_S = 0.25


class TailScreen(ConsoleScreen):
    BINDINGS = [Binding("end", "follow", "Follow", priority=True), Binding("c", "clear", "Clear")]

    def __init__(self, signal: str, url: str | None = None, token: str | None = None) -> None:
        super().__init__()
        self.signal = signal
        self.url = url
        self.token = token
        self.cursor: str | None = None
        self.unseen = 0
        self.received = 0
        self.store_down = False
        self.following = True  # sticky bottom until the operator scrolls up

    def body(self) -> ComposeResult:
        yield Static("", id="title")
        yield Static("", id="notice")
        log = Log(id="tail-log", highlight=True, auto_scroll=False)
        yield log
        yield Static("", id="badge")

    def on_mount(self) -> None:
        self.TITLE_TEXT = f"tail · {self.signal}"
        super().on_mount()
        self.update_title()
        self.watch(self.query_one("#tail-log", Log), "scroll_y", self._scrolled, init=False)
        self.run_worker(self.follow_sse() if self.url else self.follow_store(), group="tail", exit_on_error=False)

    def focus_main(self) -> None:
        self.query_one("#tail-log", Log).focus()

    async def load(self) -> None:
        """The tail has its own loop; refresh only checks the store is reachable."""
        if not self.url:
            await self.console.data.call(tapes.tape_info, self.signal)

    def update_title(self) -> None:
        source = f"SSE {self.url}" if self.url else "store"
        self.query_one("#title", Static).update(
            f"[b]{self.signal}[/b] · {source} · {self.received} events · cursor {self.cursor or '—'}")

    def notice(self, text: str) -> None:
        widget = self.query_one("#notice", Static)
        widget.update(text)
        widget.set_class(bool(text), "shown")

    def append(self, event_id: str, data: Any) -> None:
        log = self.query_one("#tail-log", Log)
        log.write_line(f"{event_id}  {json.dumps(data, ensure_ascii=False)}")
        self.cursor = event_id
        self.received += 1
        if self.following:
            log.scroll_end(animate=False)
        else:
            self.unseen += 1
            badge = self.query_one("#badge", Static)
            badge.update(f"▼ {self.unseen} new — press End to follow")
            badge.set_class(True, "shown")
        self.update_title()

    def _scrolled(self, old: float, new: float) -> None:
        """Scrolling up (keys, mouse, anything) pauses the tail; new lines count on a badge."""
        if new < old:
            self.following = False

    def action_follow(self) -> None:
        self.query_one("#tail-log", Log).scroll_end(animate=False)
        self.following = True
        self.unseen = 0
        self.query_one("#badge", Static).set_class(False, "shown")

    def action_clear(self) -> None:
        self.query_one("#tail-log", Log).clear()

    async def follow_store(self) -> None:
        data = self.console.data
        first = True
        while True:
            try:
                if first:
                    for entry in await data.call(tapes.tape_last, self.signal, BACKLOG):
                        self.append(entry.id, entry.data)
                    if self.cursor is None:
                        info = await data.call(tapes.tape_info, self.signal)
                        self.cursor = info.head_id if info else None
                    first = False
                    self.notice("")
                entries, gap = await data.call(tapes.tape_after, self.signal, self.cursor)
                if gap is not None:
                    self.notice(f"[b]gap:[/b] cursor {self.cursor} cannot be resumed ({gap.reason}"
                                f"{f', {gap.missed} missed' if gap.missed else ''}) — restarting from the "
                                f"oldest retained event {gap.first_id or '(tape empty)'}")
                    self.cursor = None
                    continue
                if self.store_down:
                    self.store_down = False
                    self.notice("")
                for entry in entries:
                    self.append(entry.id, entry.data)
                if entries:
                    continue
            except StoreDown as down:
                self.store_down = True
                self.notice(f"[b]store unreachable:[/b] {down} — will resume after {self.cursor or 'the start'}")
            await asyncio.sleep(STORE_POLL_S)

    async def follow_sse(self) -> None:
        client = Client(self.url or "", token=self.token)
        while True:
            try:
                async for event in client.stream(self.signal, {}, last_event_id=self.cursor,
                                                 on_open=lambda: self.notice("")):
                    self.append(event.id, event.data)
            except LiveResumeGap as gap:
                self.notice(f"[b]gap:[/b] {gap.after_id} cannot be resumed ({gap.reason}) — restarting from "
                            f"the oldest retained event {gap.first_id or '(tape empty)'}")
                self.cursor = None
            except Exception as err:  # server away, auth refused: say so and retry
                self.notice(f"[b]stream error:[/b] {err} — retrying")
                await asyncio.sleep(2)
