"""Taking hand-offs: an idle pool offers itself, and runs what an emit hands it without claiming.

Where the store hands off (PostgreSQL, engine/store/sql/handoff.py), the lane that waits for work
offers the pool before it waits, if a slot is free and the pool hears take notices: the emit of a
plain message to one of its queues then inserts that message inflight under this pool's lease and
names it on `oke_take`. The pool reads it by seq and starts it like a claimed message, so the
claim's round trip and its commit leave the emit → handler path. An offer holds OFFER_HOLD_MS and
is renewed at the lane's polls; an emit consumes it, and the pool offers again while it still has
a free slot and nothing else woke the lane.

What the claim path does not have: a worker cut off by a silent partition while its offer holds
(its LISTEN connection's backend still alive to the server) may be handed a message it never
runs, which waits out its lease like a claimed one (no loss: it is reclaimed then). A worker
killed, or whose connection or server went away, is passed over (sql/handoff.py). A stopping pool
withdraws its offer first and hands back what it is still handed.
"""

from __future__ import annotations

import asyncio
import time

from ..store.outage import is_outage
from .claim_ahead import ClaimAhead
from .state import log

# An offer not renewed lapses after this long (a worker killed while idle is handed nothing after).
OFFER_HOLD_MS = 3_000
# An idle lane renews its offer when it is this old (it polls at least every IDLE_POLL_S).
OFFER_RENEW_S = 1.0


class Handoff(ClaimAhead):
    """The pool's offer to emits, and the messages they hand it."""

    async def _offer_idle(self) -> None:
        """Before an idle lane waits: offer the pool to emits of its claimable queues, unless a
        valid offer stands, no slot is free, or the pool is stopping. An outage skips the offer
        (the next claim meets it)."""
        store = self.store
        if not store.hands_off or self.runtime.stop.is_set() or self.held + self.requested >= self.concurrency:
            return
        queues = self.claimable
        if not queues or (self.offered_at > time.monotonic() - OFFER_RENEW_S and self.offered == queues):
            return
        if self.stop_taking is None:
            self.stop_taking = store.on_handed(self.runtime.worker_id, self._handed)
        try:
            if await store.offer_idle(self.runtime.worker_id, queues, self.runtime.lease_ms, OFFER_HOLD_MS):
                self.offered, self.offered_at = queues, time.monotonic()
        except Exception as err:
            if not is_outage(err):
                raise
            log.debug("no offer to emits (%s: %s)", type(err).__name__, err)

    def _handed(self, seq: int) -> None:
        """An emit took the offer and handed this pool message `seq` (called on the LISTEN connection)."""
        self.offered_at = float("-inf")  # consumed: the next offer is a new one
        task = asyncio.get_running_loop().create_task(self._take(seq), name="oke-take")
        self.takes.add(task)
        task.add_done_callback(self.takes.discard)

    async def _take(self, seq: int) -> None:
        """Read the handed message and start it; a stopping pool hands it back instead. The emit
        began its lease before its commit and the take notice (which a slow link delays), so the
        read says how much is left by the store's clock; counted from before the read was sent, the
        worker never reckons more than there is, and a message with less than leases.py's share
        left is renewed before its handler starts, as a claimed-ahead one is."""
        worker_id = self.runtime.worker_id
        sent_at = time.monotonic()
        try:
            batch, lease_left_ms = await self.store.handed(worker_id, seq)
            if batch and (self.stopping or self.runtime.stop.is_set()):
                await self.store.hand_back(worker_id, batch)
                return
        except Exception as err:
            if not is_outage(err):
                raise
            log.warning("could not read handed message %d (%s: %s); it is reclaimed after its lease", seq,
                        type(err).__name__, err)  # fmt: skip
            return
        if batch and lease_left_ms is not None:
            self._start(batch, sent_at + (lease_left_ms - self.runtime.lease_ms) / 1000)
        await asyncio.sleep(0)  # a fast handler ends before the pool offers itself again
        if self.lane_listening:
            await self._offer_idle()

    async def _withdraw_offer(self) -> None:
        """At the end of a run: no emit hands this pool anything more, and what it was handed
        meanwhile is started or handed back. Best effort: an offer left behind lapses by itself."""
        if self.stop_taking is None:
            return
        try:
            await self.store.withdraw_idle(self.runtime.worker_id)
        except Exception as err:
            if not is_outage(err):
                raise
            log.warning("could not withdraw the offer to emits (%s: %s); it lapses within %d ms",
                        type(err).__name__, err, OFFER_HOLD_MS)  # fmt: skip
        await asyncio.sleep(0.05)  # a take notice sent just before the withdraw is on its way
        self._stop_taking()
        if self.takes:
            await asyncio.gather(*self.takes, return_exceptions=True)

    def _stop_taking(self) -> None:
        """Hear no more take notices (an offer left standing lapses by itself)."""
        if self.stop_taking is not None:
            self.stop_taking()
            self.stop_taking = None
