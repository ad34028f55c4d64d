"""What the worker asks of a store: the calls its objects make, and nothing else of `Store`.

The worker's reach into the store is this one page. A test double implements only these
(tests/workerkit.py), and a store change that the worker does not see leaves the worker alone.
`engine.store.Store` satisfies it as it is: mypy checks that where the pool takes `runtime.store`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ..store import Claimed, Outcome
from ..store.base import GatedClaim
from ..store.limits import Override
from ..store.sql.gates import Gate
from ..store.wake import PauseNotices, Waker


class WorkerStore(Protocol):
    """The store as the worker pool sees it, grouped by the object that makes each call."""

    # The claimer (claiming.py): how many claims may overlap, how many rows one may ask for.
    @property
    def concurrent_claims(self) -> int: ...

    @property
    def claim_rows_max(self) -> int: ...

    async def claim(self, queues: Sequence[str], worker_id: str, lease_ms: int, limit: int) -> list[Claimed]: ...

    async def claim_gated(
        self,
        worker_id: str,
        outcomes: Sequence[Outcome],
        queues: Sequence[str],
        gates: Sequence[Gate],
        lease_ms: int,
        limit: int,
        gated_limit: int,
    ) -> GatedClaim: ...

    async def next_due_in_ms(self, queues: Sequence[str]) -> int | None: ...

    def waker(self) -> Waker: ...

    # The settler (settling.py), and the claim that carries its outcomes where the store can.
    @property
    def settles_with_claims(self) -> bool: ...

    async def settle(self, worker_id: str, outcomes: Sequence[Outcome]) -> list[bool]: ...

    async def settle_and_claim(
        self, worker_id: str, outcomes: Sequence[Outcome], queues: Sequence[str], lease_ms: int, limit: int
    ) -> tuple[list[bool], list[Claimed]]: ...

    # The pause watcher (pausing.py).
    async def paused_signals(self) -> frozenset[str]: ...

    def pause_notices(self) -> PauseNotices | None: ...

    # The cancel watcher (cancelling.py).
    async def cancel_requests(self) -> dict[str, str]: ...

    async def confirm_cancelled(self, worker_id: str, outcomes: Sequence[Outcome]) -> list[bool]: ...

    def cancel_notices(self) -> PauseNotices | None: ...

    def cancel_waker(self) -> Waker: ...

    # The limit watcher (limiting.py).
    async def limit_overrides(self) -> dict[str, Override]: ...

    # The leases of messages claimed ahead (claim_ahead.py), and giving them back at a stop.
    async def renew_lease(self, worker_id: str, claimed: Claimed, lease_ms: int) -> bool: ...

    async def hand_back(self, worker_id: str, unstarted: Sequence[Claimed]) -> int: ...

    # The hand-off offer (handoff.py).
    @property
    def hands_off(self) -> bool: ...

    def on_handed(self, worker_id: str, take: Callable[[int], None]) -> Callable[[], None]: ...

    async def offer_idle(self, worker_id: str, queues: Sequence[str], lease_ms: int, hold_ms: int) -> bool: ...

    async def withdraw_idle(self, worker_id: str) -> None: ...

    async def handed(self, worker_id: str, seq: int) -> tuple[list[Claimed], int | None]: ...
