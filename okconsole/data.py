"""The console's adapter to the store: engine.ops calls, reconnects, and a clear 'store down' state.

No Textual here: screens call these coroutines from workers and render what comes back.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from engine import ops
from engine.errors import StoreUnavailable

from .dburl import sqlite_file

T = TypeVar("T")


class StoreDown(RuntimeError):
    """The store cannot be reached right now; the message is one line for the status bar."""


def _store_down(err: BaseException) -> bool:
    """An outage, or a store that cannot be used as configured (a pooler that refuses what the URL
    makes the engine send): either way the status bar says why and the console keeps trying."""
    return ops.is_outage(err) or isinstance(err, StoreUnavailable)


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text[:200]


class StoreAdapter:
    """Opens the store lazily, reopens it after an outage, and reports outages as StoreDown.

    `source` is where this console's writes come from (`okconsole web`: the browser's address): every
    write goes through `call` with an `actor`, so `call` adds it there and no screen has to know."""

    def __init__(self, database_url: str | None = None, source: str | None = None) -> None:
        self.url = ops.resolve_url(database_url)
        self.source = source
        self.store: ops.Store | None = None
        self.last_error: str | None = None
        self.opened = False

    async def _ensure(self) -> ops.Store:
        if self.store is None:
            missing = self._missing_sqlite_file()
            if missing is not None:
                # opening would create an empty store in its place, and show it as healthy
                self.last_error = f"SQLite store {missing} is missing (moved or removed)"
                raise StoreDown(self.last_error)
            try:
                store = await ops.open_store(self.url)
            except Exception as err:
                if _store_down(err):
                    self.last_error = _one_line(err)
                    raise StoreDown(self.last_error) from err
                raise
            self.store = store
            self.opened = True
        return self.store

    def _missing_sqlite_file(self) -> str | None:
        """After the store was open once: its SQLite file, if that is gone now."""
        if not self.opened:
            return None
        path = sqlite_file(self.url)  # None for PostgreSQL (or a url the store refuses)
        return None if path is None or os.path.exists(path) else path

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """`await fn(store, *args, **kwargs)`, turning an outage into StoreDown; a write (an engine.ops
        call given an `actor`) also gets this console's `source` for its audit row."""
        if self.source is not None and "actor" in kwargs:
            kwargs.setdefault("source", self.source)
        store = await self._ensure()
        try:
            result = await fn(store, *args, **kwargs)
        except Exception as err:
            if _store_down(err):
                self.last_error = _one_line(err)
                await self._drop()
                raise StoreDown(self.last_error) from err
            raise
        self.last_error = None
        return result

    async def _drop(self) -> None:
        store, self.store = self.store, None
        if store is not None:
            try:
                await store.close()
            except Exception:
                pass

    async def close(self) -> None:
        await self._drop()
