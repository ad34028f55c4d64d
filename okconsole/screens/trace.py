"""A run tree both ways: from the root run down to every child, emitted messages as leaves."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static, Tree

from engine import ops

from ..safe import content
from .base import ConsoleScreen, text_filter
from .trace_tree import fill_tree


class TraceScreen(ConsoleScreen):
    ENTER_HINT = "Open a message"
    BINDINGS = [Binding("m", "message", "Run's message"), Binding("y", "copy_id", "Copy id")]

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.rendered: Any = None
        self.rendered_filter = ""

    def body(self) -> ComposeResult:
        yield Static("", id="title")
        yield Tree("runs", id="trace")

    def on_mount(self) -> None:
        self.TITLE_TEXT = f"trace · {self.run_id}"
        super().on_mount()

    def focus_main(self) -> None:
        self.query_one("#trace", Tree).focus()

    async def load(self) -> None:
        try:
            root = await self.console.data.call(ops.trace, self.run_id)
        except LookupError as err:
            self.query_one("#title", Static).update(content("[b red]$err[/]", err=err))
            return
        if root == self.rendered and self.filter_text == self.rendered_filter:
            return
        self.rendered, self.rendered_filter = root, self.filter_text
        count = _count(root)
        filt = " · filter $filter" if self.filter_text else ""
        self.query_one("#title", Static).update(
            content(
                f"run [b]$run[/b] · root $root ($flow) · {count} runs{filt} · "
                "enter opens a message, m the message a run handled",
                run=self.run_id,
                root=root.run_id,
                flow=root.flow or "?",
                filter=repr(self.filter_text),
            )
        )
        keep = text_filter(self.filter_text) if self.filter_text else None
        fill_tree(self.query_one("#trace", Tree), [root], keep=keep)

    def on_tree_node_selected(self, event: Tree.NodeSelected) -> None:
        data = event.node.data
        if isinstance(data, dict) and data.get("message") and "run" not in data:
            self.console.open_detail(data["message"])

    def action_message(self) -> None:
        node = self.query_one("#trace", Tree).cursor_node
        data = node.data if node is not None else None
        if isinstance(data, dict) and data.get("message"):
            self.console.open_detail(data["message"])

    def action_copy_id(self) -> None:
        """The message of the selected node, else its run."""
        node = self.query_one("#trace", Tree).cursor_node
        data = node.data if node is not None and isinstance(node.data, dict) else {}
        self.copy_id(data.get("message") or data.get("run"))


def _count(node: Any) -> int:
    return 1 + sum(_count(c) for c in node.children)
