"""The settler: it writes finished attempts' outcomes in group commits, one task per claim lane.

Where the store settles inside a claim's transaction (SQLite: `settles_with_claims`), a claim
coming soon carries the pending outcomes instead, one commit and one fsync for both: the claimer
borrows them (`lend_to_claim`), and gives them back if its claim fails (`take_back`), so the
settler retries them as its own. Everything about the pending outcomes is decided here. Why a claim
cycle is one transaction on SQLite: docs/design/sqlite-writer-process.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..store import Outcome
from ..store.outage import is_outage
from .waiting import Backoff, wait_any
from .worker_store import WorkerStore

log = logging.getLogger("engine.worker")


class Settler:
    """Owns the pending outcomes, the settles in flight and their count, whether a claim is about
    to carry the outcomes, and whether the pool is stopping."""

    def __init__(self, store: WorkerStore, worker_id: str, handlers_running: Callable[[], bool]) -> None:
        self._store, self._worker_id = store, worker_id
        self._handlers_running = handlers_running  # a stopping settler ends once none runs and nothing is left
        self._pending: list[Outcome] = []
        self._ready = asyncio.Event()  # an outcome is pending (or the pool stops)
        self.settled = asyncio.Event()  # a settle ended (set here; a drain waits on it and clears it)
        self._count = 0  # finished settles; a drain compares it across a claim
        self._in_flight = 0
        # Set while a claim lane is about to claim (or waits for a slot to claim into): on stores
        # that settle with claims, the outcomes ride along with that claim (one commit, not two)
        # and the settler leaves them; it settles them itself only when no claim is coming.
        self._claim_pending = False
        self._stopping = False
        self._store_back = asyncio.Event()  # a claim got through: cuts a settle back-off short

    @property
    def count(self) -> int:
        """Settles ended so far, done or not (a drain's "did anything change meanwhile")."""
        return self._count

    def busy(self) -> bool:
        """Whether an outcome is pending or being settled."""
        return bool(self._pending) or bool(self._in_flight)

    def add(self, outcome: Outcome) -> None:
        """A finished attempt's outcome, to be settled by the next settle (or claim that carries it)."""
        self._pending.append(outcome)
        self._ready.set()

    def lend_to_claim(self) -> list[Outcome]:
        """A claim is about to be sent: the pending outcomes, for it to settle in its transaction,
        where the store does that (`settles_with_claims`); none otherwise. Until the claim is over
        (`claim_over`) they count as a settle in flight."""
        self._claim_pending = True
        if not self._store.settles_with_claims or not self._pending:
            return []
        outcomes, self._pending = self._pending, []
        self._in_flight += 1
        return outcomes

    def take_back(self, outcomes: list[Outcome]) -> None:
        """The claim that carried `outcomes` failed: they were not settled; retried as usual."""
        self._pending[:0] = outcomes
        self._ready.set()

    def claim_over(self) -> None:
        """The claim that carried outcomes is over, settled or given back."""
        self._end_settle()
        self.settled.set()

    def claim_idle(self) -> None:
        """No claim is coming soon (the queues are empty): outcomes still waiting go to the settler."""
        self._claim_pending = False
        if self._pending:
            self._ready.set()

    def store_answered(self) -> None:
        """A claim got through: the store is back, a settle waiting out its back-off retries now."""
        self._store_back.set()

    def stop(self) -> None:
        """The pool is stopping: settle what is left, then (once no handler runs) end."""
        self._stopping = True
        self._ready.set()

    async def run(self) -> None:
        """Settle whatever outcomes have accumulated, in one transaction; until the pool stops and
        nothing is left. An outage is retried; any other failure leaves the batch to its lease."""
        backoff = Backoff()
        while True:
            if not self._pending or self._leaves_outcomes():
                if self._stopping and not self._handlers_running() and not self._pending:
                    return
                self._ready.clear()
                await self._ready.wait()
                continue
            batch, self._pending = self._pending, []
            self._in_flight += 1
            self._store_back.clear()
            try:
                await self._store.settle(self._worker_id, batch)
                backoff.reset()
            except Exception as err:
                if not is_outage(err):
                    # Not a passing outage: retrying cannot help. The attempts stay inflight and
                    # are reclaimed after their lease, so nothing is lost or half-written.
                    log.exception("settle of %d outcomes failed; they will be reclaimed after the lease", len(batch))
                    continue
                if not await self._retry_later(err, batch, backoff):
                    return
            finally:
                self._end_settle()
            self.settled.set()

    async def _retry_later(self, err: Exception, batch: list[Outcome], backoff: Backoff) -> bool:
        """Put `batch` back for the next settle and wait out the back-off; False when stopping and
        an attempt made after the longest wait failed too: every outcome still pending is then
        dropped, named in the log once, and left to be reclaimed (another lane's settler may be
        waiting on the same ones). Giving up only after a failed attempt, never after a wait, lets
        a store that came back during the last wait take the outcomes."""
        self._pending[:0] = batch
        if self._stopping and backoff.exhausted:
            given_up, self._pending = self._pending, []
            if given_up:
                log.error(
                    "giving up settling %d outcomes at stop (%s): the store is still unavailable (%s: %s); "
                    "each runs again once its lease ends",
                    len(given_up),
                    ", ".join(f"{o.claimed.id} attempt {o.claimed.attempts}" for o in given_up),
                    type(err).__name__,
                    err,
                )
            return False
        log.warning("settle failed (%s: %s); retrying in %.2fs", type(err).__name__, err, backoff.delay)
        # retry when a claim gets through (the store is back) rather than sleeping out the
        # back-off: an outcome left unsettled past its lease is re-run by the next claimer
        await wait_any(self._store_back, timeout=backoff.delay)
        backoff.grow()
        return True

    def _end_settle(self) -> None:
        self._in_flight -= 1
        self._count += 1

    def _leaves_outcomes(self) -> bool:
        """A claim is about to take the outcomes into its own transaction: the settler waits."""
        return self._store.settles_with_claims and self._claim_pending and not self._stopping
