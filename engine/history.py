"""The history writer: what this process counted (store/history.py's tally) goes to the store
every few seconds and at stop, one upsert per (signal, minute); minutes older than `history_ttl`
are pruned once a minute.

A crash loses at most the last FLUSH_EVERY_S of counts (they are in memory until written), never
a message: history is an operator's view, not the record of delivery.
"""

from __future__ import annotations

import asyncio
import logging
import time

from .durations import parse_duration_ms
from .ids import now_ms
from .store import Store
from .store import history as stored
from .store.outage import describe, is_outage

DEFAULT_HISTORY_TTL = "7d"
FLUSH_EVERY_S = 5.0
PRUNE_EVERY_S = 60.0
log = logging.getLogger("engine.history")


def parse_ttl_ms(option: str, value: object) -> int:
    """A duration option ("7d", "12h", …) in ms; ValueError naming the option otherwise."""
    ms = parse_duration_ms(value)
    if ms is None:
        raise ValueError(
            f"oke({option}=...): {value!r} is not a duration: use a positive integer and a unit "
            f'(ms, s, m, h, d), e.g. "7d"'
        )
    return ms


async def flush(store: Store) -> None:
    """Write what was counted since the last flush; on failure it is kept for the next one."""
    counts = store.tally.take()
    if not counts:
        return
    try:
        await store.write(lambda conn: stored.write_counts(conn, counts))
    except BaseException:
        store.tally.put_back(counts)
        raise


async def flush_or_keep(store: Store) -> None:
    """`flush`, logging rather than raising when it fails (the counts stay for a later flush)."""
    try:
        await flush(store)
    except Exception as err:
        log.warning("history not written yet (%s); it is kept for the next flush", describe(err))


class HistoryWriter:
    """Flushes a store's tally every FLUSH_EVERY_S and prunes minutes older than `ttl_ms`."""

    def __init__(self, store: Store, ttl_ms: int) -> None:
        self.store = store
        self.ttl_ms = ttl_ms
        self._pruned_at = float("-inf")

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            try:
                await self.step()
            except Exception as err:  # the store is away (or refused): the counts wait for the next beat
                if is_outage(err):
                    log.warning("could not write history (%s); retrying in %.0fs", describe(err), FLUSH_EVERY_S)
                else:
                    log.exception("could not write history; retrying in %.0fs", FLUSH_EVERY_S)

    async def step(self) -> None:
        """One beat: flush, and prune when the last prune is a minute old."""
        await flush(self.store)
        if time.monotonic() - self._pruned_at >= PRUNE_EVERY_S:
            cut = now_ms() - self.ttl_ms
            await self.store.write(lambda conn: stored.prune(conn, cut))
            self._pruned_at = time.monotonic()
