"""Render run trees (engine.ops RunNode) into a Textual Tree: flow names, status, durations."""
from __future__ import annotations

from typing import Any

from textual.widgets import Tree

from .. import fmt

STATUS_STYLE = {"succeeded": "green", "failed": "red", "lease_lost": "yellow", "unknown": "dim"}


def run_label(node: Any) -> str:
    took = (node.ended_at - node.started_at) if node.ended_at and node.started_at else None
    style = STATUS_STYLE.get(node.status, "")
    attempt = f" · attempt {node.attempt}" if node.attempt else ""
    return (f"[b]{node.flow or '?'}[/b] {node.run_id} [{style}]{node.status}[/]"
            f" · {fmt.span(took) if took is not None else '—'}{attempt}")


def fill_tree(tree: Tree[Any], roots: list[Any], highlight: str | None = None) -> None:
    tree.clear()
    tree.show_root = False
    for root in roots:
        _add(tree.root, root, highlight)
    tree.root.expand_all()


def _add(parent: Any, node: Any, highlight: str | None) -> None:
    branch = parent.add(run_label(node), data={"run": node.run_id, "message": node.message_id}, expand=True)
    for msg in node.messages:
        mark = "[reverse]" if msg.id == highlight else ""
        end = "[/reverse]" if mark else ""
        branch.add_leaf(f"{mark}✉ {msg.signal} {msg.id} · {msg.status}{end}", data={"message": msg.id})
    if node.emitted > len(node.messages):
        branch.add_leaf(f"… {node.emitted - len(node.messages)} more emitted")
    for child in node.children:
        _add(branch, child, highlight)
