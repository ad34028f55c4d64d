"""A store double for the worker's objects (engine/worker/worker_store.py's `WorkerStore`, and
nothing more), a clock moved by hand, and the `Runtime` a pool runs on. No database: where the
store's own behaviour is the point, the tests in tests/ use a real one."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from engine import flow, signal
from engine.errors import StoreUnavailable
from engine.runtime import Runtime
from engine.store import Claimed, Outcome
from engine.store.wake import PauseNotices, Waker
from engine.telemetry import RunHooks
from engine.worker.route import Route

_urls = itertools.count()


class Clock:
    """Stands in for the `time` module of a worker module: a monotonic clock moved by hand."""

    def __init__(self, now: float = 5_000.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


def claimed(seq: int, payload: str = "", queue: str = "unit.q") -> Claimed:
    return Claimed(seq, f"m{seq}", queue, queue, "unit.w", None, f'"{payload or seq}"', 1, None)


class StoreDouble:
    """An in-memory queue behind the worker's store calls. Every call is recorded in `calls` (name
    and what it carried); `fail` holds the outage each next call of that name raises instead."""

    concurrent_claims = 1
    claim_rows_max = 64
    hands_off = False

    def __init__(self, messages: Sequence[Claimed] = (), settles_with_claims: bool = False) -> None:
        self.gate: asyncio.Event | None = None  # not None: each settle waits until it is set
        self.settles_with_claims = settles_with_claims
        self.pending = list(messages)
        self.settled: list[Outcome] = []
        self.calls: list[tuple[str, Any]] = []
        self.fail: dict[str, list[Exception]] = {}
        self.paused: frozenset[str] = frozenset()
        self.notices: PauseNotices | None = None
        self.requests: dict[str, str] = {}  # standing cancel requests: message id -> note
        self.cancel_heard: PauseNotices | None = None
        self.confirmed: list[Outcome] = []
        self.holds = True  # whether renewals find the message still this worker's
        self.handed_back: list[str] = []
        self.url = f"test://unit-{next(_urls)}"

    def _call(self, name: str, carried: Any = None) -> None:
        self.calls.append((name, carried))
        if self.fail.get(name):
            raise self.fail[name].pop(0)

    def outage(self, name: str, times: int = 1) -> None:
        self.fail.setdefault(name, []).extend(StoreUnavailable(f"{name} away") for _ in range(times))

    async def claim(self, queues: Sequence[str], worker_id: str, lease_ms: int, limit: int) -> list[Claimed]:
        await asyncio.sleep(0)
        self._call("claim", limit)
        batch = [c for c in self.pending if c.queue in queues][:limit]
        self.pending = [c for c in self.pending if c not in batch]
        return batch

    async def settle(self, worker_id: str, outcomes: Sequence[Outcome]) -> list[bool]:
        await asyncio.sleep(0)
        self._call("settle", [o.claimed.id for o in outcomes])
        if self.gate is not None:
            await self.gate.wait()
        self.settled += outcomes
        return [True] * len(outcomes)

    async def settle_and_claim(
        self, worker_id: str, outcomes: Sequence[Outcome], queues: Sequence[str], lease_ms: int, limit: int
    ) -> tuple[list[bool], list[Claimed]]:
        """One transaction: an outage settles nothing and claims nothing."""
        await asyncio.sleep(0)
        self._call("settle_and_claim", [o.claimed.id for o in outcomes])
        batch = [c for c in self.pending if c.queue in queues][:limit]
        self.pending = [c for c in self.pending if c not in batch]
        self.settled += outcomes
        return [True] * len(outcomes), batch

    async def next_due_in_ms(self, queues: Sequence[str]) -> int | None:
        return None

    def waker(self) -> Waker:
        return Waker(self.url)

    async def paused_signals(self) -> frozenset[str]:
        self._call("paused_signals")
        return self.paused

    def pause_notices(self) -> PauseNotices | None:
        return self.notices

    async def cancel_requests(self) -> dict[str, str]:
        self._call("cancel_requests")
        return dict(self.requests)

    async def confirm_cancelled(self, worker_id: str, outcomes: Sequence[Outcome]) -> list[bool]:
        self._call("confirm_cancelled", [o.claimed.id for o in outcomes])
        self.confirmed += outcomes
        return [True] * len(outcomes)

    def cancel_notices(self) -> PauseNotices | None:
        return self.cancel_heard

    def cancel_waker(self) -> Waker:
        return Waker(self.url, "cancel\x1f")

    async def limit_overrides(self) -> dict:
        return {}  # no flow limits: the pool claims with the plain claim

    async def renew_lease(self, worker_id: str, claimed: Claimed, lease_ms: int) -> bool:
        self._call("renew", claimed.id)
        await asyncio.sleep(0)
        return self.holds

    async def hand_back(self, worker_id: str, unstarted: Sequence[Claimed]) -> int:
        self.handed_back += [c.id for c in unstarted]
        return len(unstarted)

    def on_handed(self, worker_id: str, take: Callable[[int], None]) -> Callable[[], None]:
        return lambda: None

    async def offer_idle(self, worker_id: str, queues: Sequence[str], lease_ms: int, hold_ms: int) -> bool:
        return False

    async def withdraw_idle(self, worker_id: str) -> None:
        return None

    async def handed(self, worker_id: str, seq: int) -> tuple[list[Claimed], int | None]:
        return [], None


def runtime(store: Any, lease_ms: int = 10_000, grace_s: float = 1.0) -> Runtime:
    """The runtime a pool of worker "w1" runs on over `store` (the double passes for a `Store`)."""
    return Runtime(store, "w1", lease_ms, grace_s, asyncio.Event(), None, RunHooks())  # type: ignore[arg-type]


def route(queue: str, do: Callable[..., Any]) -> dict[str, Route]:
    return {queue: Route(signal.once(queue), flow("unit.w", do=do))}


def outcome(seq: int) -> Outcome:
    return Outcome(claimed(seq), f"run_{seq}", "unit.w", True, 0, 1)
