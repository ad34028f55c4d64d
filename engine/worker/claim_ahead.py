"""Claim-ahead: how many messages a claim asks for, and how a message claimed ahead waits for a
handler slot without losing its lease. Only where the store overlaps claims (two lanes)."""

from __future__ import annotations

import asyncio
import time

from ..store import Claimed
from .running import Running
from .state import log

EWMA_WEIGHT = 0.1  # weight of the newest sample in the handler-time and claim-time averages
# A claimed-ahead message has its lease renewed each time it has waited this share of its lease for
# a slot: it could otherwise run out while it waits (another worker takes it, the attempt is lost) or
# soon after its handler starts. So a handler always starts with more than half its lease left.
AHEAD_LEASE_SHARE = 0.5


def ewma(average: float, sample: float) -> float:
    """The moving average with `sample` taken in; the first sample is the average."""
    return sample if not average else average + EWMA_WEIGHT * (sample - average)


class ClaimAhead(Running):
    """Claim sizes from the handler-time and claim-time averages; slots for claimed-ahead messages."""

    def _claim_size(self) -> int:
        """How many messages the next claim asks for: the free slots, plus (claiming ahead) what the
        handlers should finish while the claim is on the wire, never more than `concurrency`."""
        held = self.held + self.requested
        return min(self.concurrency, self.concurrency + self._ahead() - held)

    def _ahead(self) -> int:
        """Messages the handlers finish, on average, while one claim is on the wire (at most
        `concurrency`). Rounded down: handlers slower than `concurrency` claims take none, so a
        message never waits here behind a slow handler while another worker is free."""
        if self.lanes == 1 or not self.claim_s or not self.handler_s:  # see Claiming._start
            return 0
        return min(self.concurrency, int(self.concurrency * self.claim_s / self.handler_s))

    async def _attempt(self, claimed: Claimed, claimed_at: float) -> None:
        """Run `claimed` once a slot is free, timing its handler for the average."""
        if not await self._take_slot(claimed, claimed_at):
            self.held -= 1  # not started here: it no longer counts against this worker's claims
            return
        try:
            began = time.monotonic()
            await self._run_handler(claimed)
            self.handler_s = ewma(self.handler_s, time.monotonic() - began)
        finally:
            self.slots.release()

    async def _take_slot(self, claimed: Claimed, claimed_at: float) -> bool:
        """A handler slot for `claimed`. A claimed-ahead message may wait behind slow handlers for
        longer than its lease: every AHEAD_LEASE_SHARE of the lease spent waiting, its lease is
        renewed, so no other worker (nor this one) reclaims it unstarted and its attempt is not lost.
        False if the lease was lost meanwhile (the message is not run here)."""
        if not self.slots.locked():
            await self.slots.acquire()  # a free slot: taken at once, no timer needed
            return True
        share_s = self.runtime.lease_ms / 1000 * AHEAD_LEASE_SHARE
        renew_at = claimed_at + share_s
        while True:
            try:
                async with asyncio.timeout(max(0.0, renew_at - time.monotonic())):
                    await self.slots.acquire()
                return True
            except TimeoutError:
                if not await self._renew(claimed):
                    return False
                renew_at = time.monotonic() + share_s

    async def _renew(self, claimed: Claimed) -> bool:
        """Renew the lease of a message still waiting for a slot, or leave the message (another
        worker may hold it now)."""
        try:
            if await self.store.renew_lease(self.runtime.worker_id, claimed, self.runtime.lease_ms):
                return True
            log.info("message %s was reclaimed while it waited for a slot; not started here", claimed.id)
        except Exception as err:
            log.warning(
                "could not renew the lease of message %s (%s: %s); not started, it is reclaimed after the lease",
                claimed.id,
                type(err).__name__,
                err,
            )
        return False
