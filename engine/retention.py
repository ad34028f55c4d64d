"""Retention of finished work (`keep_delivered`, `keep_dead`, `keep_runs`): the background pass
that deletes what is older than those, in small transactions (store/retention.py), paced so a
claim never waits long for the writer.

On SQLite claims and this pass share one writer thread, so a batch's size adapts: it halves
when a batch held the writer over HOLD_TARGET_MS and grows back when it was quick, and the pass
yields between batches. `hold_ms` keeps how long recent batches' statements held the open write
transaction, timed on the writer's own thread; `write_ms` the whole `store.write` as the loop saw
it (commit, and the wait for the writer and for the loop, included). bench/soak.py reports both.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection

from .history import parse_ttl_ms
from .ids import now_ms
from .store import Store
from .store import retention as stored
from .store.outage import describe, is_outage

MAX_BATCH = 500
MIN_BATCH = 20
HOLD_TARGET_MS = 25.0  # half the 50 ms a claim may wait at most
PASS_EVERY_S = 10.0
YIELD_S = 0.005  # between two batches: the claims queued meanwhile go first
log = logging.getLogger("engine.retention")


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long finished work is kept (ms); None keeps it for ever."""

    delivered_ms: int | None = None
    dead_ms: int | None = None
    runs_ms: int | None = None

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.delivered_ms, self.dead_ms, self.runs_ms))


def parse_policy(keep_delivered: object, keep_dead: object, keep_runs: object) -> RetentionPolicy:
    """The `keep_*` options as a policy; ValueError for one that is not a duration."""

    def keep(option: str, value: object) -> int | None:
        return None if value is None else parse_ttl_ms(option, value)

    return RetentionPolicy(
        keep("keep_delivered", keep_delivered), keep("keep_dead", keep_dead), keep("keep_runs", keep_runs)
    )


class Retention:
    """Runs retention passes over one store every PASS_EVERY_S."""

    def __init__(self, store: Store, policy: RetentionPolicy) -> None:
        self.store = store
        self.policy = policy
        self.batch = MAX_BATCH
        self.hold_ms: collections.deque[float] = collections.deque(maxlen=100_000)
        self.write_ms: collections.deque[float] = collections.deque(maxlen=100_000)

    async def run(self) -> None:
        while True:
            try:
                await self.pass_once()
            except Exception as err:  # the next pass tries again; nothing is half-deleted
                if is_outage(err):
                    log.warning("retention pass skipped (%s)", describe(err))
                else:
                    log.exception("retention pass failed")
            await asyncio.sleep(PASS_EVERY_S)

    async def pass_once(self) -> int:
        """Delete everything the policy says is old, batch by batch; how many rows went."""
        now = now_ms()
        deleted = 0
        for status, keep_ms in (("delivered", self.policy.delivered_ms), ("dead", self.policy.dead_ms)):
            if keep_ms is None:
                continue
            signals = await self.store.read(functools.partial(stored.finished_signals, status=status))
            for signal in signals:
                step = _messages_step(signal, status, now - keep_ms, now)
                deleted += await self._until_done(step)
        if self.policy.runs_ms is not None:
            deleted += await self._until_done(_runs_step(now - self.policy.runs_ms, now))
        deleted += await self._until_done(_holds_step(now))
        return deleted

    async def _until_done(self, step: Callable[[Connection, int], stored.Batch]) -> int:
        """Batches of `step` until one says nothing more is waiting."""
        deleted = 0
        while True:
            batch = await self._timed(step)
            deleted += batch.deleted
            if not batch.more:
                return deleted
            await asyncio.sleep(YIELD_S)

    async def _timed(self, step: Callable[[Connection, int], stored.Batch]) -> stored.Batch:
        """One batch in its own transaction, timed on the writer's thread (its statements) and
        around the write; the next batch's size follows from the former."""
        limit = self.batch
        took = [0.0]

        def body(conn: Connection) -> stored.Batch:
            began = time.perf_counter()
            try:
                return step(conn, limit)
            finally:
                took[0] = (time.perf_counter() - began) * 1000

        called = time.perf_counter()
        result = await self.store.write(body)
        self.write_ms.append((time.perf_counter() - called) * 1000)
        held = took[0]
        self.hold_ms.append(held)
        if held > HOLD_TARGET_MS:
            self.batch = max(MIN_BATCH, limit // 2)
        elif held < HOLD_TARGET_MS / 3:
            self.batch = min(MAX_BATCH, limit * 2)
        return result


def _messages_step(signal: str, status: str, before_ms: int, now: int) -> Callable[[Connection, int], stored.Batch]:
    def step(conn: Connection, limit: int) -> stored.Batch:
        return stored.delete_messages(conn, signal, status, before_ms, limit, now)

    return step


def _runs_step(before_ms: int, now: int) -> Callable[[Connection, int], stored.Batch]:
    def step(conn: Connection, limit: int) -> stored.Batch:
        return stored.delete_runs(conn, before_ms, limit, now)

    return step


def _holds_step(now: int) -> Callable[[Connection, int], stored.Batch]:
    def step(conn: Connection, limit: int) -> stored.Batch:
        return stored.delete_lapsed_holds(conn, limit, now)

    return step
