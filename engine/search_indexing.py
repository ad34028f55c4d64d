"""The search index's background pass: new messages (and messages with new failure rows) go into
the text index (store/search_index.py) in batches, so no emit, claim or settle writes it.

Like retention, a batch is one short write transaction; on SQLite it shares the writer with the
claims, so its size halves when a batch held the writer over HOLD_TARGET_MS and grows back when it
was quick, and the pass yields between batches. Several processes on one store take turns (the
marks are locked by each batch); what one indexed the other skips.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy import Connection

from .store import Store, search_index
from .store.outage import describe, is_outage

PASS_EVERY_S = 1.0
MAX_BATCH = 5_000
MIN_BATCH = 100
HOLD_TARGET_MS = 25.0
YIELD_S = 0.005
log = logging.getLogger("engine.search")


class SearchIndexer:
    """Keeps one store's text index caught up, a pass every PASS_EVERY_S."""

    def __init__(self, store: Store, max_batch: int = MAX_BATCH) -> None:
        self.store = store
        self.max_batch = max_batch
        self.batch = max_batch
        self._messages = search_index.Horizon()
        self._failures = search_index.Horizon()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(PASS_EVERY_S)
            try:
                await self.pass_once()
            except Exception as err:  # the next pass carries on from the marks; nothing is half-indexed
                if is_outage(err):
                    log.warning("search index pass skipped (%s)", describe(err))
                else:
                    log.exception("search index pass failed")

    async def pass_once(self) -> int:
        """Index everything settled since the last pass, batch by batch; how many rows were indexed."""
        if not await self.store.read(search_index.available):
            return 0
        seq, failure_id, xmin, xmax = await self.store.read(search_index.newest)
        settled_seq = self._messages.settled(seq, xmin, xmax)
        settled_failure = self._failures.settled(failure_id, xmin, xmax)
        if settled_seq is None or settled_failure is None:
            return 0  # PostgreSQL: the next pass knows how far this one's sightings are final
        done = 0
        while True:
            step = await self._timed(settled_seq, settled_failure)
            done += step.indexed + step.reindexed
            if not step.more:
                return done
            await asyncio.sleep(YIELD_S)

    async def _timed(self, settled_seq: int, settled_failure: int) -> search_index.Step:
        limit = self.batch
        took = [0.0]

        def body(conn: Connection) -> search_index.Step:
            began = time.perf_counter()
            try:
                return search_index.index_batch(conn, settled_seq, settled_failure, limit)
            finally:
                took[0] = (time.perf_counter() - began) * 1000

        step = await self.store.write(body)
        if took[0] > HOLD_TARGET_MS:
            self.batch = max(MIN_BATCH, limit // 2)
        elif took[0] < HOLD_TARGET_MS / 3:
            self.batch = min(self.max_batch, limit * 2)
        return step
