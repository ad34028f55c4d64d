"""Render run trees (engine.ops RunNode) into a Textual Tree: flow names, status, durations,
each failed run's error (as the CLI's `trace` prints it), and each run under the message it handled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.widgets import Tree

from engine.display import one_line

from .. import fmt
from ..safe import assemble
from ..styles import STATUS_STYLE

Keep = Callable[[str], bool]


def run_label(node: Any) -> Text:
    took = (node.ended_at - node.started_at) if node.ended_at and node.started_at else None
    attempt = f" · attempt {node.attempt}" if node.attempt else ""
    error = (" ", (one_line(fmt.short(node.error, 200)), "red")) if node.error else ()
    return assemble(
        (node.flow or "?", "b"),
        f" {node.run_id} ",
        (node.status, STATUS_STYLE.get(node.status)),
        f" · {fmt.span(took) if took is not None else '—'}{attempt}",
        *error,
    )


def message_label(msg: Any, highlight: str | None) -> Text:
    label = assemble("✉ ", msg.signal, f" {msg.id} · ", msg.status)
    if msg.id == highlight:
        label.stylize("reverse")
    return label


def fill_tree(tree: Tree[Any], roots: list[Any], highlight: str | None = None, keep: Keep | None = None) -> None:
    """Show `roots`; with `keep` (a '/' filter over label text), only the runs and messages that
    match, with the runs above them (so a match keeps its place in the tree)."""
    tree.clear()
    tree.show_root = False
    for root in roots:
        if keep is None or _matches(root, keep):
            _add(tree.root, root, highlight, keep)
    tree.root.expand_all()


def _shows(label: Text, keep: Keep) -> bool:
    return keep(label.plain)


def _matches(node: Any, keep: Keep) -> bool:
    return (
        _shows(run_label(node), keep)
        or any(_shows(message_label(m, None), keep) for m in node.messages)
        or any(_matches(c, keep) for c in node.children)
    )


def _add(parent: Any, node: Any, highlight: str | None, keep: Keep | None) -> None:
    branch = parent.add(run_label(node), data={"run": node.run_id, "message": node.message_id}, expand=True)
    emitted = {msg.id for msg in node.messages}
    handled: dict[str, list[Any]] = {}
    for child in node.children:  # a child run handled one of these messages: it goes under it
        if child.message_id in emitted:
            handled.setdefault(child.message_id, []).append(child)
    for msg in node.messages:
        runs = [c for c in handled.get(msg.id, []) if keep is None or _matches(c, keep)]
        label = message_label(msg, highlight)
        if keep is not None and not runs and not _shows(label, keep):
            continue
        leaf = (
            branch.add(label, data={"message": msg.id}, expand=True)
            if runs
            else branch.add_leaf(label, data={"message": msg.id})
        )
        for child in runs:
            _add(leaf, child, highlight, keep)
    if node.emitted > len(node.messages) and keep is None:
        branch.add_leaf(f"… {node.emitted - len(node.messages)} more emitted")
    for child in node.children:
        if child.message_id not in emitted and (keep is None or _matches(child, keep)):
            _add(branch, child, highlight, keep)
