"""A handler gets its lease (engine/worker/leases.py): a message claimed ahead that waited for the
handler slot longer than a tenth of its lease is renewed before its handler starts; one that waited
less starts on its claim's lease, with no renewal; one whose renewal finds it lost is not started
here. The runner and the hand-off offer run for real on a fake monotonic clock and a store double:
no database."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from engine import flow, signal
from engine.runtime import Runtime
from engine.store import Claimed
from engine.telemetry import RunHooks
from engine.worker import claim_ahead, handoff, running
from engine.worker.handoff import HandoffOffer
from engine.worker.leases import START_LEASE_SHARE, START_RENEWALS, start_by
from engine.worker.pausing import PauseWatcher
from engine.worker.route import Route
from engine.worker.running import Runner

LEASE_MS = 10_000
LEASE_S = LEASE_MS / 1000
QUEUE = "unit.lease"


class Clock:
    """Stands in for the `time` module of the worker's modules: a monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 5_000.0

    def monotonic(self) -> float:
        return self.now


class Store:
    """What the runner asks of a store here: renewals (each a round trip, recorded in `events`) and
    hand-backs. `holds`: whether this worker still holds the message; `on_renew` runs in each."""

    concurrent_claims = 1
    claim_rows_max = 64

    def __init__(self, events: list[tuple[str, str]], holds: bool = True) -> None:
        self.events, self.holds = events, holds
        self.on_renew: Callable[[], None] = lambda: None
        self.handed_back: list[str] = []

    async def renew_lease(self, worker_id: str, claimed: Claimed, lease_ms: int) -> bool:
        assert (worker_id, lease_ms) == ("w1", LEASE_MS)
        self.events.append(("renew", claimed.id))
        await asyncio.sleep(0)
        self.on_renew()
        return self.holds

    async def hand_back(self, worker_id: str, unstarted: list[Claimed]) -> int:
        self.handed_back += [c.id for c in unstarted]
        return len(unstarted)

    async def handed(self, worker_id: str, seq: int) -> tuple[list[Claimed], int | None]:
        """An emit handed this worker message "handed", whose lease has `handed_left_ms` left by the
        store's clock when it is read (less than a whole lease when the take notice came late)."""
        return [Claimed(seq, "handed", QUEUE, QUEUE, "unit.w", None, '"handed"', 1, None)], self.handed_left_ms

    handed_left_ms = LEASE_MS


class Run:
    """One runner of one slot on `store`: the message "first" holds the slot until `release()`, the
    others start when it frees; every handler start is recorded in `events`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, holds: bool = True) -> None:
        self.clock = Clock()
        monkeypatch.setattr(running, "time", self.clock)
        monkeypatch.setattr(claim_ahead, "time", self.clock)
        monkeypatch.setattr(handoff, "time", self.clock)
        self.events: list[tuple[str, str]] = []
        self.store = Store(self.events, holds)
        self.gate = asyncio.Event()

        async def handle(payload: str, fx: Any) -> None:
            self.events.append(("start", payload))
            if payload == "first":
                await self.gate.wait()

        jobs = signal.once(QUEUE)
        runtime = Runtime(self.store, "w1", LEASE_MS, 1.0, asyncio.Event(), None, RunHooks())  # type: ignore[arg-type]
        self.stop = runtime.stop
        self.outcomes: list[Any] = []
        routes = {QUEUE: Route(jobs, flow("unit.w", do=handle))}
        store: Any = self.store
        self.runner = Runner(runtime, store, routes, 1, self.outcomes.append, self.outcomes.append)
        self.offer = HandoffOffer(store, runtime, PauseWatcher(store, routes), self.runner, lambda: False)

    async def claim(self, *names: str) -> None:
        """A batch claimed now, by the fake clock; the first message takes the slot at once."""
        batch = [Claimed(n, name, QUEUE, QUEUE, "unit.w", None, f'"{name}"', 1, None) for n, name in enumerate(names)]
        self.runner.start(batch, self.clock.now)
        while ("start", names[0]) not in self.events:
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)  # the lease renewer, started now, sleeps until half the lease

    async def release(self, waited_share: float) -> None:
        """The first handler ends after the others waited `waited_share` of their lease; until the
        runner is idle again."""
        self.clock.now += LEASE_S * waited_share
        self.gate.set()
        async with asyncio.timeout(5):
            await self.runner.finish()
        self.runner.stop_renewing()


def test_the_margin_is_a_tenth_of_the_lease_from_before_the_claim_was_sent() -> None:
    assert START_LEASE_SHARE == 0.9
    assert start_by(100.0, 2_000) == pytest.approx(100.2)
    assert start_by(100.0, 30_000) == pytest.approx(103.0)


async def test_a_message_that_waited_more_than_a_tenth_of_its_lease_is_renewed_before_its_handler_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = Run(monkeypatch)
    await run.claim("first", "second", "third")
    await run.release(waited_share=0.15)
    assert run.events == [
        ("start", "first"),
        ("renew", "second"),
        ("start", "second"),
        ("renew", "third"),
        ("start", "third"),
    ]
    assert run.runner.held == 0 and len(run.outcomes) == 3


async def test_a_message_that_waited_less_starts_on_its_claims_lease_without_a_renewal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = Run(monkeypatch)
    await run.claim("first", "second")
    await run.release(waited_share=0.09)
    assert run.events == [("start", "first"), ("start", "second")]


async def test_a_message_whose_renewal_finds_it_lost_is_not_started_here(monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(monkeypatch, holds=False)
    await run.claim("first", "second")
    await run.release(waited_share=0.5)
    assert run.events == [("start", "first"), ("renew", "second")], run.events
    assert run.runner.held == 0 and [o.claimed.id for o in run.outcomes] == ["first"]


async def test_a_renewal_slower_than_the_margin_is_made_again_at_most_a_few_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each renewal here takes a fifth of the lease: the handler would start on 80 % of it, so the
    lease is renewed again (START_RENEWALS times in all), then the handler starts anyway."""
    run = Run(monkeypatch)

    def slow_round_trip() -> None:
        run.clock.now += LEASE_S * 0.2

    run.store.on_renew = slow_round_trip
    await run.claim("first", "second")
    await run.release(waited_share=0.5)
    assert run.events == [("start", "first")] + [("renew", "second")] * START_RENEWALS + [("start", "second")]


async def test_a_message_renewed_while_the_pool_stops_is_handed_back_not_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = Run(monkeypatch)
    run.store.on_renew = run.stop.set
    await run.claim("first", "second")
    await run.release(waited_share=0.5)
    assert run.events == [("start", "first"), ("renew", "second")], run.events
    assert run.store.handed_back == ["second"] and run.runner.held == 0


@pytest.mark.parametrize(("left_share", "renewed"), [(0.95, False), (0.5, True)])
async def test_a_handed_message_starts_on_what_the_store_says_is_left_of_its_lease(
    monkeypatch: pytest.MonkeyPatch, left_share: float, renewed: bool
) -> None:
    """An emit begins a handed message's lease before its commit and the take notice: on a slow
    link the notice comes late, and the read says so. Under 90 % left, it is renewed first."""
    run = Run(monkeypatch)
    run.store.handed_left_ms = int(LEASE_MS * left_share)
    async with asyncio.timeout(5):
        await run.offer.take(7)
        await run.runner.finish()
    renewal = [("renew", "handed")] if renewed else []
    assert run.events == [*renewal, ("start", "handed")]
