"""Settling: a settler task per claim lane writes finished attempts' outcomes in group commits, and
where the store settles inside a claim's transaction (SQLite), a claim coming soon takes them
instead."""

from __future__ import annotations

from ..store import Outcome
from ..store.outage import is_outage
from .state import PoolState, log
from .waiting import Backoff, wait_any


class Settling(PoolState):
    """The settler task and the hand-over of outcomes between it and the claims."""

    async def _settle_loop(self) -> None:
        """Settle whatever outcomes have accumulated, in one transaction; until the pool stops and
        nothing is left. An outage is retried; any other failure leaves the batch to its lease."""
        backoff = Backoff()
        while True:
            if not self.pending_outcomes or self._settler_leaves_outcomes():
                if self.stopping and not self.running and not self.pending_outcomes:
                    return
                self.outcome_ready.clear()
                await self.outcome_ready.wait()
                continue
            batch, self.pending_outcomes = self.pending_outcomes, []
            self.settles_in_flight += 1
            self.store_back.clear()
            try:
                await self.store.settle(self.runtime.worker_id, batch)
                backoff.reset()
            except Exception as err:
                if not is_outage(err):
                    # Not a passing outage: retrying cannot help. The attempts stay inflight and
                    # are reclaimed after their lease, so nothing is lost or half-written.
                    log.exception("settle of %d outcomes failed; they will be reclaimed after the lease", len(batch))
                    continue
                if not await self._retry_settle_later(err, batch, backoff):
                    return
            finally:
                self._end_settle()
            self.settled.set()

    async def _retry_settle_later(self, err: Exception, batch: list[Outcome], backoff: Backoff) -> bool:
        """Put `batch` back for the next settle and wait out the back-off; False when stopping and
        an attempt made after the longest wait failed too: every outcome still pending is then
        dropped, named in the log once, and left to be reclaimed (another lane's settler may be
        waiting on the same ones). Giving up only after a failed attempt, never after a wait, lets
        a store that came back during the last wait take the outcomes."""
        self.pending_outcomes[:0] = batch
        if self.stopping and backoff.exhausted:
            given_up, self.pending_outcomes = self.pending_outcomes, []
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
        await wait_any(self.store_back, timeout=backoff.delay)
        backoff.grow()
        return True

    def _end_settle(self) -> None:
        """A settle (the settler's, or one riding on a claim) is over, done or not: drain compares
        settle_count across a claim to know whether anything changed meanwhile."""
        self.settles_in_flight -= 1
        self.settle_count += 1

    def _outcomes_for_claim(self) -> list[Outcome]:
        """The pending outcomes, taken to be settled in the claim's transaction, where the store
        does that (`settles_with_claims`); none otherwise."""
        self.claim_pending = True
        if not self.store.settles_with_claims or not self.pending_outcomes:
            return []
        outcomes, self.pending_outcomes = self.pending_outcomes, []
        self.settles_in_flight += 1
        return outcomes

    def _claim_idle(self) -> None:
        """No claim is coming soon (the queues are empty): outcomes still waiting go to the settler."""
        self.claim_pending = False
        if self.pending_outcomes:
            self.outcome_ready.set()

    def _settler_leaves_outcomes(self) -> bool:
        """A claim is about to take the outcomes into its own transaction: the settler waits."""
        return self.store.settles_with_claims and self.claim_pending and not self.stopping
