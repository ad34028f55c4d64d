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
withdraws its offer first and hands back what it is still handed. Why and what it gained:
docs/design/idle-handoffs.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ..runtime import Runtime
from ..store.outage import is_outage
from .pausing import PauseWatcher
from .running import Runner
from .worker_store import WorkerStore

log = logging.getLogger("engine.worker")

# An offer not renewed lapses after this long (a worker killed while idle is handed nothing after).
OFFER_HOLD_MS = 3_000
# An idle lane renews its offer when it is this old (it polls at least every IDLE_POLL_S).
OFFER_RENEW_S = 1.0


class HandoffOffer:
    """Owns the pool's standing offer to emits (its queues and when it was made), the subscription
    to take notices, and the reads of handed messages under way. `wants_work` asks the claimer
    whether a lane waits for work with a slot free: only then is the pool offered."""

    def __init__(
        self,
        store: WorkerStore,
        runtime: Runtime,
        pauses: PauseWatcher,
        runner: Runner,
        wants_work: Callable[[], bool],
        ungated: Callable[[list[str]], list[str]] = lambda queues: queues,
    ) -> None:
        self._store, self._runtime, self._pauses, self._runner = store, runtime, pauses, runner
        self._wants_work = wants_work
        # A limited queue is never offered: its messages are counted against the limit only in the
        # gated claim (engine/store/sql/gates.py), and a hand-off skips the claim.
        self._ungated = ungated
        self._offered: list[str] = []
        self._offered_at = float("-inf")
        self._stop_taking: Callable[[], None] | None = None
        self._takes: set[asyncio.Task[None]] = set()
        self._closed = False  # the run is over: whatever is still handed goes back

    async def offer_idle(self) -> None:
        """Before an idle lane waits: offer the pool to emits of its claimable queues, unless a
        valid offer stands, no slot is free, or the pool is stopping. An outage skips the offer
        (the next claim meets it)."""
        store, runtime = self._store, self._runtime
        if not store.hands_off or runtime.stop.is_set() or not self._wants_work():
            return
        queues = self._ungated(self._pauses.claimable)
        if not queues or (self._offered_at > time.monotonic() - OFFER_RENEW_S and self._offered == queues):
            return
        if self._stop_taking is None:
            self._stop_taking = store.on_handed(runtime.worker_id, self._handed)
        try:
            if await store.offer_idle(runtime.worker_id, queues, runtime.lease_ms, OFFER_HOLD_MS):
                self._offered, self._offered_at = queues, time.monotonic()
        except Exception as err:
            if not is_outage(err):
                raise
            log.debug("no offer to emits (%s: %s)", type(err).__name__, err)

    def _handed(self, seq: int) -> None:
        """An emit took the offer and handed this pool message `seq` (called on the LISTEN connection)."""
        self._offered_at = float("-inf")  # consumed: the next offer is a new one
        task = asyncio.get_running_loop().create_task(self.take(seq), name="oke-take")
        self._takes.add(task)
        task.add_done_callback(self._takes.discard)

    async def take(self, seq: int) -> None:
        """Read the handed message and start it; a stopping pool hands it back instead. The emit
        began its lease before its commit and the take notice (which a slow link delays), so the
        read says how much is left by the store's clock; counted from before the read was sent, the
        worker never reckons more than there is, and a message with less than leases.py's share
        left is renewed before its handler starts, as a claimed-ahead one is."""
        worker_id, lease_ms = self._runtime.worker_id, self._runtime.lease_ms
        sent_at = time.monotonic()
        try:
            batch, lease_left_ms = await self._store.handed(worker_id, seq)
            if batch and (self._closed or self._runtime.stop.is_set()):
                await self._store.hand_back(worker_id, batch)
                return
        except Exception as err:
            if not is_outage(err):
                raise
            log.warning("could not read handed message %d (%s: %s); it is reclaimed after its lease", seq,
                        type(err).__name__, err)  # fmt: skip
            return
        if batch and lease_left_ms is not None:
            self._runner.start(batch, sent_at + (lease_left_ms - lease_ms) / 1000)
        await asyncio.sleep(0)  # a fast handler ends before the pool offers itself again
        if self._wants_work():  # a lane still waits for work with a slot free
            await self.offer_idle()

    async def withdraw(self) -> None:
        """At the end of a run: no emit hands this pool anything more, and what it was handed
        meanwhile is started or handed back. Best effort: an offer left behind lapses by itself."""
        if self._stop_taking is None:
            return
        try:
            await self._store.withdraw_idle(self._runtime.worker_id)
        except Exception as err:
            if not is_outage(err):
                raise
            log.warning("could not withdraw the offer to emits (%s: %s); it lapses within %d ms",
                        type(err).__name__, err, OFFER_HOLD_MS)  # fmt: skip
        await asyncio.sleep(0.05)  # a take notice sent just before the withdraw is on its way
        self._unsubscribe()
        if self._takes:
            await asyncio.gather(*self._takes, return_exceptions=True)

    def close(self) -> None:
        """The run is over (or failed): hear no more take notices; one still on its way hands its
        message back (an offer left standing lapses by itself)."""
        self._closed = True
        self._unsubscribe()

    def _unsubscribe(self) -> None:
        if self._stop_taking is not None:
            self._stop_taking()
            self._stop_taking = None
