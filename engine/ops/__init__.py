"""The operator model: counts, lists, failures, traces, replay and purge over a store.

Every reader of the store outside the hot path (fx.dead_letters, the CLI, the
TUI) goes through here; the statements live in the submodules, one job each.
"""
from __future__ import annotations

from ..store import Store
from . import queries
from .records import DeadLetter, Failure, to_json

__all__ = ["DeadLetter", "Failure", "dead_letters", "to_json"]


async def dead_letters(store: Store, signal: str, limit: int | None = None) -> list[DeadLetter]:
    """Dead messages of `signal`, newest first, each with every failure."""
    return await store.read(lambda conn: queries.dead_letters(conn, signal, limit))
