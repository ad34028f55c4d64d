"""The app's background pass while it is started: the history writer, the search index
(engine/search_indexing.py) and, when a `keep_*` option is set, retention. Started by
`OkeApp.start()`, stopped by `close()` with a last flush."""

from __future__ import annotations

import asyncio

from . import history
from .retention import Retention, RetentionPolicy
from .search_indexing import SearchIndexer
from .store import Store


class Background:
    """The background tasks of one started app, and the final flush at close."""

    def __init__(self, store: Store, history_ttl_ms: int, policy: RetentionPolicy) -> None:
        self.store = store
        self.history = history.HistoryWriter(store, history_ttl_ms)
        self.retention = Retention(store, policy) if policy.active else None
        self.search_index = SearchIndexer(store)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self.history.run(), name="oke-history"))
        self._tasks.append(asyncio.create_task(self.search_index.run(), name="oke-search-index"))
        if self.retention is not None:
            self._tasks.append(asyncio.create_task(self.retention.run(), name="oke-retention"))

    async def close(self) -> None:
        """Stop the tasks, then write what is still counted (an outage loses only these counts)."""
        loop = asyncio.get_running_loop()
        # an app started under another event loop (closed since) has its tasks there: gone with it
        mine = [task for task in self._tasks if task.get_loop() is loop]
        for task in mine:
            task.cancel()
        await asyncio.gather(*mine, return_exceptions=True)
        self._tasks.clear()
        await history.flush_or_keep(self.store)
