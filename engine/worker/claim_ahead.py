"""Claim-ahead: how many messages a claim asks for, and how a message claimed ahead waits for a
handler slot without losing its lease (docs/design/claim-ahead.md has the measurements)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from ..store import Claimed
from .leases import START_RENEWALS, start_by
from .worker_store import WorkerStore

log = logging.getLogger("engine.worker")

# A claimed-ahead message has its lease renewed each time it has waited this share of its lease for
# a slot: it could otherwise run out while it waits (another worker takes it, the attempt is lost).
# A handler starts on more than that: a message that waited past leases.py's margin is renewed again
# right before its handler starts.
AHEAD_LEASE_SHARE = 0.5
# Fast handlers finish far more than `concurrency` messages while one claim is on the wire, and each
# round trip costs the client more CPU than the handlers of a small batch. So a worker may hold up
# to AHEAD_MAX × concurrency (at most the store's `claim_rows_max` per claim in flight) beyond its
# running ones, and one claim may ask for all of that (CLAIM_MAX × concurrency is more than the hold
# allows), at most `claim_rows_max`: fewer, larger claims (docs/design/claim-ahead.md). The hold is
# what bounds the cost: a worker killed mid-run leaves its claimed-ahead messages, too, to be
# reclaimed after their lease.
CLAIM_MAX = 8
AHEAD_MAX = 6
# Claims above this size ask for a multiple of it: PostgreSQL prepares one claim statement per size
# (engine/store/sql/claim.py), and asyncpg keeps 100 a connection.
CLAIM_STEP = 8


def claim_size(held: int, concurrency: int, ahead: int, claim_rows_max: int) -> int:
    """How many messages the next claim asks for, `held` being the messages leased or asked for
    already: the free slots, plus `ahead`; beyond `concurrency`, at most CLAIM_MAX × `concurrency`
    and the store's `claim_rows_max`, in steps of CLAIM_STEP. Zero or less: no claim now."""
    most = max(concurrency, min(CLAIM_MAX * concurrency, claim_rows_max))
    size = min(most, concurrency + ahead - held)
    return size if size <= CLAIM_STEP else size - size % CLAIM_STEP


def claim_ahead(concurrency: int, claim_s: float, handler_s: float, concurrent_claims: int, claim_rows_max: int) -> int:
    """Messages the handlers finish, on average, while one claim is on the wire (at most AHEAD_MAX ×
    `concurrency`, and `claim_rows_max` per claim in flight); none until both are measured. Rounded
    down: handlers slower than `concurrency` claims take none, so a message never waits here behind
    a slow handler while another worker is free."""
    if not claim_s or not handler_s:
        return 0
    cap = min(AHEAD_MAX * concurrency, concurrent_claims * claim_rows_max)
    return min(cap, int(concurrency * claim_s / handler_s))


class Waiting:
    """A claimed batch whose messages from `next` on wait for a handler slot; when their leases are
    next renewed, until when they start on their lease as it is (leases.py: renewed first after
    that), and the ones whose lease was lost meanwhile (by seq, not to be run here)."""

    __slots__ = ("batch", "lost", "next", "renew_at", "start_by")

    def __init__(self, batch: list[Claimed], renew_at: float, start_by: float) -> None:
        self.batch, self.next, self.renew_at, self.start_by = batch, 0, renew_at, start_by
        self.lost: set[int] | None = None


class WaitingLine:
    """The claimed batches not all started yet, in claim order, and the renewals of their leases.

    The runner takes messages from the head as slots free; this line keeps the leases of the ones
    still waiting (one renewer task, started only when something is left waiting, so fast handlers
    that leave nothing waiting cost no task a claim). A message whose lease it finds lost is not
    run here: `on_lost` tells the runner, which stops counting it as held."""

    def __init__(self, store: WorkerStore, worker_id: str, lease_ms: int, on_lost: Callable[[], None]) -> None:
        self._store, self._worker_id, self._lease_ms = store, worker_id, lease_ms
        self._on_lost = on_lost
        self._batches: deque[Waiting] = deque()
        self._renewer: asyncio.Task[None] | None = None

    def __bool__(self) -> bool:
        return bool(self._batches)

    def add(self, batch: list[Claimed], leased_at: float) -> None:
        """Queue a claimed batch; `leased_at`: the monotonic time its lease counts from (before the
        claim was sent)."""
        lease_ms = self._lease_ms
        renew_at = leased_at + lease_ms / 1000 * AHEAD_LEASE_SHARE
        self._batches.append(Waiting(batch, renew_at, start_by(leased_at, lease_ms)))

    def next(self) -> tuple[Claimed, float] | None:
        """The next message to start and until when it starts on its lease as it is; None when
        nothing (or only messages whose lease was lost) waits."""
        batches = self._batches
        while batches:
            head = batches[0]
            claimed = head.batch[head.next]
            head.next += 1
            if head.next == len(head.batch):
                batches.popleft()
            if head.lost is None or claimed.seq not in head.lost:
                return claimed, head.start_by
        return None

    def keep_leases(self) -> None:
        """Messages are left waiting for a slot: renew their leases while they wait."""
        if self._renewer is None and self._batches:
            self._renewer = asyncio.create_task(self.renew_due(), name="oke-lease-renewer")

    def stop_renewing(self) -> None:
        """No more renewals: messages still waiting keep their leases until they run out."""
        if self._renewer is not None:
            self._renewer.cancel()

    def take_unstarted(self) -> list[Claimed]:
        """Empty the line: the messages not started and not lost, for a stop to hand back."""
        unstarted = [
            claimed
            for waiting in self._batches
            for claimed in waiting.batch[waiting.next :]
            if waiting.lost is None or claimed.seq not in waiting.lost
        ]
        self._batches.clear()
        return unstarted

    async def renew_due(self) -> None:
        """While messages wait for a slot: each time a batch has waited AHEAD_LEASE_SHARE of its
        lease, renew the leases of its messages not started yet, so no other worker (nor this one)
        reclaims them unstarted and their attempts are not lost; one whose lease was lost meanwhile
        is dropped (not run here)."""
        share_s = self._lease_ms / 1000 * AHEAD_LEASE_SHARE
        try:
            while self._batches:
                # The earliest of all, not the first batch's: a batch renewed just now stays first
                # with its next renewal a share of a lease away, and one claimed a moment after it
                # would wait that long past its own (a handler then started on 15 % of its lease).
                due_in = min(w.renew_at for w in self._batches) - time.monotonic()
                if due_in > 0:
                    await asyncio.sleep(due_in)
                    continue
                for waiting in [w for w in self._batches if w.renew_at <= time.monotonic()]:
                    renewed_at = time.monotonic()
                    await self._renew_batch(waiting)
                    waiting.renew_at = time.monotonic() + share_s
                    waiting.start_by = start_by(renewed_at, self._lease_ms)
        finally:
            self._renewer = None

    async def _renew_batch(self, waiting: Waiting) -> None:
        """Renew each message of `waiting` not started yet; mark the ones this worker lost."""
        for i in range(waiting.next, len(waiting.batch)):
            if i < waiting.next:
                continue  # started meanwhile, on the lease it had
            claimed = waiting.batch[i]
            if not await self.renew(claimed) and i >= waiting.next:
                waiting.lost = (waiting.lost or set()) | {claimed.seq}
                self._on_lost()

    async def renew_to_start(self, claimed: Claimed) -> bool:
        """Before the handler of a message that waited past its lease's start margin (leases.py):
        renew its lease, again while a renewal itself took longer than the margin (at most
        START_RENEWALS in all). False when this worker lost it meanwhile (`on_lost` was told)."""
        for _ in range(START_RENEWALS):
            renewed_at = time.monotonic()
            if not await self.renew(claimed):
                self._on_lost()
                return False
            if time.monotonic() <= start_by(renewed_at, self._lease_ms):
                break
        return True

    async def renew(self, claimed: Claimed) -> bool:
        """Renew the lease of a message still waiting for a slot, or leave the message (another
        worker may hold it now)."""
        try:
            if await self._store.renew_lease(self._worker_id, claimed, self._lease_ms):
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

    async def hand_back(self, unstarted: list[Claimed]) -> None:
        """Messages claimed ahead and not started, back to pending (fenced: one another worker took
        over stays its); if the store is away they stay inflight and are reclaimed after the lease."""
        try:
            back = await self._store.hand_back(self._worker_id, unstarted)
        except Exception as err:
            log.warning(
                "could not hand back %d messages claimed ahead (%s: %s); they are reclaimed after the lease",
                len(unstarted),
                type(err).__name__,
                err,
            )
            return
        log.info("stopping: handed %d messages claimed ahead back to the queue", back)
