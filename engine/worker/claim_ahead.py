"""Claim-ahead: how many messages a claim asks for, and how a message claimed ahead waits for a
handler slot without losing its lease."""

from __future__ import annotations

import asyncio
import time

from ..store import Claimed
from .leases import START_RENEWALS, start_by
from .running import Running
from .state import Waiting, log

# A claimed-ahead message has its lease renewed each time it has waited this share of its lease for
# a slot: it could otherwise run out while it waits (another worker takes it, the attempt is lost).
# A handler starts on more than that: a message that waited past leases.py's margin is renewed again
# right before its handler starts.
AHEAD_LEASE_SHARE = 0.5
# Fast handlers finish far more than `concurrency` messages while one claim is on the wire, and each
# round trip costs the client more CPU than the handlers of a small batch. So a worker may hold up
# to AHEAD_MAX × concurrency (at most the store's `claim_rows_max` per claim in flight: 128 on
# PostgreSQL and on SQLite's writer thread, 256 with SQLite's writer process) beyond its running
# ones, and one claim may ask for all of that (CLAIM_MAX × concurrency is more than the hold
# allows), at most `claim_rows_max`. Measured (bench/ONCE.md, bench/ab.py): on PostgreSQL at 8 handlers caps of 1×
# and 1× gave 7,300 msgs/s at 64 µs of client CPU a message, 4× and 6× gave 13,800 at 30 µs; claims
# of 8× instead of 4× gave 8 % more at 8 handlers, 39 % at 1 (on SQLite 10 % and 57 %); at 32
# handlers claims of 128 rows gained nothing on PostgreSQL, and 12 % on SQLite (store/sqlite.py).
# The hold is what bounds the cost: a worker killed mid-run leaves its claimed-ahead messages, too,
# to be reclaimed after their lease.
CLAIM_MAX = 8
AHEAD_MAX = 6
# Claims above this size ask for a multiple of it: PostgreSQL prepares one claim statement per size
# (engine/store/sql/claim.py), and asyncpg keeps 100 a connection.
CLAIM_STEP = 8


class ClaimAhead(Running):
    """Claim sizes from the handler-time and claim-time averages; lease renewals for claimed-ahead
    messages that wait long for a slot."""

    def _claim_size(self) -> int:
        """How many messages the next claim asks for: the free slots, plus (claiming ahead) what the
        handlers should finish while the claim is on the wire; beyond `concurrency`, at most
        CLAIM_MAX × `concurrency` and the store's `claim_rows_max`."""
        held = self.held + self.requested
        most = max(self.concurrency, min(CLAIM_MAX * self.concurrency, self.store.claim_rows_max))
        size = min(most, self.concurrency + self._ahead() - held)
        return size if size <= CLAIM_STEP else size - size % CLAIM_STEP

    def _ahead(self) -> int:
        """Messages the handlers finish, on average, while one claim is on the wire (at most
        AHEAD_MAX × `concurrency`, and `claim_rows_max` per claim in flight). Rounded down: handlers slower than
        `concurrency` claims take none, so a message never waits here behind a slow handler while
        another worker is free."""
        if not self.claim_s or not self.handler_s:
            return 0
        cap = min(AHEAD_MAX * self.concurrency, self.store.concurrent_claims * self.store.claim_rows_max)
        return min(cap, int(self.concurrency * self.claim_s / self.handler_s))

    def _start(self, batch: list[Claimed], leased_at: float) -> None:
        """Queue a claimed batch for the handler slots; the messages that find one start now.
        `leased_at`: the monotonic time its lease counts from (before the claim was sent)."""
        self.held += len(batch)
        lease_ms = self.runtime.lease_ms
        self.waiting.append(
            Waiting(batch, leased_at + lease_ms / 1000 * AHEAD_LEASE_SHARE, start_by(leased_at, lease_ms))
        )
        if self.active < self.concurrency:
            self._track(asyncio.create_task(self._run_waiting()))
        else:
            self._left_waiting()

    def _left_waiting(self) -> None:
        """Messages wait for a slot: renew their leases while they wait (one renewer a pool, started
        only then, so fast handlers that leave nothing waiting cost no task a claim)."""
        if self.renewer is None:
            self.renewer = asyncio.create_task(self._renew_waiting(), name="oke-lease-renewer")

    async def _renew_waiting(self) -> None:
        """While messages wait for a slot: each time a batch has waited AHEAD_LEASE_SHARE of its
        lease, renew the leases of its messages not started yet, so no other worker (nor this one)
        reclaims them unstarted and their attempts are not lost; one whose lease was lost meanwhile
        is dropped (not run here)."""
        share_s = self.runtime.lease_ms / 1000 * AHEAD_LEASE_SHARE
        try:
            while self.waiting:
                # The earliest of all, not the first batch's: a batch renewed just now stays first
                # with its next renewal a share of a lease away, and one claimed a moment after it
                # would wait that long past its own (a handler then started on 15 % of its lease).
                due_in = min(w.renew_at for w in self.waiting) - time.monotonic()
                if due_in > 0:
                    await asyncio.sleep(due_in)
                    continue
                for waiting in [w for w in self.waiting if w.renew_at <= time.monotonic()]:
                    renewed_at = time.monotonic()
                    await self._renew_batch(waiting)
                    waiting.renew_at = time.monotonic() + share_s
                    waiting.start_by = start_by(renewed_at, self.runtime.lease_ms)
        finally:
            self.renewer = None

    async def _hand_back_waiting(self) -> None:
        """At a clean stop: the messages still waiting for a slot go back to pending now (their
        attempt not counted), for another worker to take at once rather than after their lease.
        Nothing starts them here any more (running.py). If the store is away they stay inflight
        and are reclaimed after the lease, as before."""
        if self.renewer is not None:
            self.renewer.cancel()
        unstarted = [
            claimed
            for waiting in self.waiting
            for claimed in waiting.batch[waiting.next :]
            if waiting.lost is None or claimed.seq not in waiting.lost
        ]
        self.waiting.clear()
        await self._hand_back(unstarted)

    async def _hand_back(self, unstarted: list[Claimed]) -> None:
        """Messages claimed ahead and not started, back to pending (fenced: one another worker took
        over stays its); if the store is away they stay inflight and are reclaimed after the lease."""
        if not unstarted:
            return
        self.held -= len(unstarted)
        try:
            back = await self.store.hand_back(self.runtime.worker_id, unstarted)
        except Exception as err:
            log.warning(
                "could not hand back %d messages claimed ahead (%s: %s); they are reclaimed after the lease",
                len(unstarted),
                type(err).__name__,
                err,
            )
            return
        log.info("stopping: handed %d messages claimed ahead back to the queue", back)

    async def _start_renewed(self, claimed: Claimed) -> None:
        """Run a message that waited for its slot past its lease's start margin (leases.py) on a
        renewed lease; renewed again while a renewal itself took longer than the margin (at most
        START_RENEWALS in all). Not run here when this worker lost it meanwhile, nor once the pool
        is stopping (then it is handed back, as the messages still waiting are)."""
        lease_ms = self.runtime.lease_ms
        for _ in range(START_RENEWALS):
            renewed_at = time.monotonic()
            if not await self._renew(claimed):
                self.held -= 1  # not started here: it no longer counts against this worker's claims
                self.slot_free.set()
                return
            if time.monotonic() <= start_by(renewed_at, lease_ms):
                break
        if self.runtime.stop.is_set():
            await self._hand_back([claimed])
            return
        await self._run_handler(claimed)

    async def _renew_batch(self, waiting: Waiting) -> None:
        """Renew each message of `waiting` not started yet; mark the ones this worker lost."""
        for i in range(waiting.next, len(waiting.batch)):
            if i < waiting.next:
                continue  # started meanwhile, on the lease it had
            claimed = waiting.batch[i]
            if not await self._renew(claimed) and i >= waiting.next:
                waiting.lost = (waiting.lost or set()) | {claimed.seq}
                self.held -= 1  # not started here: it no longer counts against this worker's claims
                self.slot_free.set()

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
