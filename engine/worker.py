"""The worker loop: claim a batch, run each flow, settle outcomes in group commits.

Claim lanes keep up to `concurrency` handlers running. Finished attempts queue
for one settler task that writes whatever has accumulated in a single
transaction, so under load many acks share one commit. Database outages are
retried with back-off; nothing is settled twice and nothing is left half-written:
a message whose outcome was never written stays inflight and is reclaimed after
its lease.

Where the store overlaps claims (PostgreSQL: two lanes, each its own connection),
a worker claims ahead: besides the messages running it may hold as many more as
its handlers are expected to finish while one claim is on the wire (at most
`concurrency`), so a slot that frees finds its next message already here instead
of waiting a round trip. Slow handlers claim ahead by little or nothing.
"""
from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import payloads
from .errors import OkeError
from .flows import Flow
from .fx import Fx
from .ids import new_id, now_ms
from .signals import Signal
from .store import Claimed, Outcome
from .store.outage import is_outage

if TYPE_CHECKING:
    from .app import OkeApp

log = logging.getLogger("engine.worker")
IDLE_POLL_S = 1.0          # fallback re-check (expired leases need no wake-up to become claimable)
MAX_BACKOFF_S = 5.0
EWMA_WEIGHT = 0.1          # weight of the newest sample in the handler-time and claim-time averages
# A claimed-ahead message has its lease renewed each time it has waited this share of its lease for
# a slot: it could otherwise run out while it waits (another worker takes it, the attempt is lost) or
# soon after its handler starts. So a handler always starts with more than half its lease left.
AHEAD_LEASE_SHARE = 0.5


@dataclass(frozen=True)
class Route:
    """Which flow handles a queue, and the signal whose schema re-validates the payload."""

    signal: Signal
    flow: Flow
    # Asked once here, not per message: inspect's check costs about 1 µs a call.
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.flow.do))


def failure_code(exc: BaseException) -> str:
    """The exception's string `code` attribute if it has one, else its class name."""
    if isinstance(exc, OkeError):
        return f"OKE{exc.code}"
    try:
        code = getattr(exc, "code", None)
    except Exception:  # a `code` property that raises: fall back to the class name
        code = None
    return code if isinstance(code, str) and code else type(exc).__name__


def failure_message(exc: BaseException) -> str:
    """`str(exc)`, or a stand-in when the exception cannot describe itself."""
    try:
        return str(exc)
    except Exception as err:
        return f"<str() of {type(exc).__name__} failed: {type(err).__name__}>"


class WorkerPool:
    """Runs the flows of one app until stopped (`run`) or until nothing is eligible (`drain`)."""

    def __init__(self, app: "OkeApp", routes: dict[str, Route], concurrency: int) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an int ≥ 1, got {concurrency!r}")
        self.app = app
        self.store = app.store
        self.routes = routes
        self.queues = sorted(routes)
        self.concurrency = concurrency
        # Every leased message of this worker has a task here: running its handler, or (claimed
        # ahead) waiting for one of the `concurrency` slots.
        self.running: set[asyncio.Task[None]] = set()
        self.held = 0  # leased messages whose handler has not ended yet (running or waiting for a slot)
        self.slots = asyncio.Semaphore(concurrency)
        self.lanes = max(1, self.store.concurrent_claims)
        self.requested = 0  # rows asked for by claims in flight
        self.handler_s = 0.0  # moving averages; 0 until measured (no claiming ahead before that)
        self.claim_s = 0.0
        self.slot_free = asyncio.Event()
        self.handler_done = asyncio.Event()  # a handler task ended (drain: is everything idle now?)
        self.pending_outcomes: list[Outcome] = []
        self.outcome_ready = asyncio.Event()
        self.settled = asyncio.Event()
        self.settle_count = 0  # finished settles; drain compares it across a claim
        self.settles_in_flight = 0
        # Set while the claim loop is about to claim (or waits for a slot to claim into): on stores
        # that settle with claims, the outcomes ride along with that claim (one commit, not two)
        # and the settler leaves them; it settles them itself only when no claim is coming.
        self.claim_pending = False
        self.stopping = False
        self.store_back = asyncio.Event()  # set by each successful claim: cuts a settle back-off short

    async def run(self, until_idle: bool = False) -> None:
        if not self.queues:
            if not until_idle:
                await self.app._stop_requested.wait()
            return
        wakers = [self.store.waker() for _ in range(self.lanes)]
        settler = asyncio.create_task(self._settle_loop(), name="oke-settler")
        try:
            try:
                async with asyncio.TaskGroup() as lanes:
                    for n, waker in enumerate(wakers):
                        lanes.create_task(self._claim_loop(waker, until_idle), name=f"oke-claim-{n}")
            except BaseExceptionGroup as group:  # one lane's error, not a group, to the caller
                raise group.exceptions[0] from None
            finally:
                self._claim_idle()  # no more claims: the settler takes every outcome from here on
            if self.running:
                await self._finish_running()
        except asyncio.CancelledError:
            if self.running:  # the caller gave up (a timeout around drain()): do not wait on handlers
                await self._cancel_running()
            raise
        except BaseException:
            if self.running:  # a lane failed: running handlers may still end within the grace
                await self._finish_running()
            raise
        finally:
            for waker in wakers:
                waker.close()
            self.stopping = True
            self.outcome_ready.set()
            await settler

    async def _finish_running(self) -> None:
        """Let running handlers end within the grace period; the rest are cancelled and stay
        reclaimable."""
        _done, late = await asyncio.wait(self.running, timeout=self.app.stop_grace_s)
        if late:
            log.warning("%d handlers outlived the stop grace period; their messages will be "
                        "reclaimed after the lease", len(late))
            await self._cancel_running()

    async def _cancel_running(self) -> None:
        """Cancel the running handlers at once (their messages stay inflight, reclaimable after the
        lease) and give them the stop grace period to unwind. One that swallows the cancel and
        runs on is left behind: the settler stops waiting for it, and its message is reclaimed."""
        tasks = list(self.running)
        for task in tasks:
            task.cancel()
        _done, stuck = await asyncio.wait(tasks, timeout=self.app.stop_grace_s)
        if stuck:
            log.warning("%d handlers ignored the cancel; their messages will be reclaimed after the lease",
                        len(stuck))
            self.running.difference_update(stuck)

    async def _claim_loop(self, waker: Any, until_idle: bool) -> None:
        stop = self.app._stop_requested
        backoff = 0.05
        while not stop.is_set():
            size = self._claim_size()
            if size <= 0:
                self.slot_free.clear()
                await _wait_any(self.slot_free, stop)
                await asyncio.sleep(0)  # let sibling completions land: claim in batches
                continue
            waker.clear()
            settles_before = self.settle_count
            outcomes = self._outcomes_for_claim()
            self.requested += size
            started = time.monotonic()
            try:
                if outcomes:
                    _held, batch = await self.store.settle_and_claim(
                        self.app.worker_id, outcomes, self.queues, self.app.lease_ms, size)
                else:
                    batch = await self.store.claim(self.queues, self.app.worker_id, self.app.lease_ms, size)
                backoff = 0.05
                self.store_back.set()
                self.claim_s = _ewma(self.claim_s, time.monotonic() - started)
            except Exception as err:
                if outcomes:  # not settled: back to the settler, which retries or gives up as usual
                    self.pending_outcomes[:0] = outcomes
                    self.outcome_ready.set()
                if not is_outage(err):
                    raise
                log.warning("claim failed (%s: %s); retrying in %.2fs", type(err).__name__, err, backoff)
                # a wake-up (the LISTEN connection is back, a local emit landed) cuts the back-off short
                await _wait_any(stop, waker.event, timeout=backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            finally:
                self.requested -= size
                self.slot_free.set()  # what this claim asked for is free to ask for again, whatever it got
                if outcomes:
                    self._end_settle()
                    self.settled.set()
            if self.lanes > 1:
                for claimed in batch:
                    self._track(asyncio.create_task(self._attempt(claimed, started)), 1)
            elif batch:
                # One lane never claims ahead (`_ahead` is 0): every claimed message has its slot,
                # so it runs at once, without the slot wait, the lease renewal and the handler-time
                # average that claiming ahead needs.
                self._track(asyncio.create_task(self._run_in_turn(batch, 0)), len(batch))
            if batch:
                continue
            if until_idle:
                self._claim_idle()
                idle = not self.running and not self.pending_outcomes and not self.settles_in_flight
                if idle:
                    if settles_before == self.settle_count:
                        return
                    # A settle landed during the claim: claim again now. Waiting for its `settled`
                    # could wait out IDLE_POLL_S, since the other lane may have cleared it already.
                    continue
                # Not slot_free: every claim's `finally` sets it, so two lanes would wake each other
                # into empty claims for as long as a handler runs. A finished handler (the drain may
                # be over), a settle (work may be eligible again) or an emit is what counts here.
                await _wait_any(self.handler_done, self.settled, stop, waker.event, timeout=IDLE_POLL_S)
                self.handler_done.clear()
                self.settled.clear()
                continue
            self._claim_idle()
            waits = [asyncio.ensure_future(waker.wait(IDLE_POLL_S)), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()

    def _claim_size(self) -> int:
        """How many messages the next claim asks for: the free slots, plus (claiming ahead) what the
        handlers should finish while the claim is on the wire, never more than `concurrency`."""
        held = self.held + self.requested
        return min(self.concurrency, self.concurrency + self._ahead() - held)

    def _ahead(self) -> int:
        """Messages the handlers finish, on average, while one claim is on the wire (at most
        `concurrency`). Rounded down: handlers slower than `concurrency` claims take none, so a
        message never waits here behind a slow handler while another worker is free."""
        if self.lanes == 1 or not self.claim_s or not self.handler_s:  # see _claim_loop
            return 0
        return min(self.concurrency, int(self.concurrency * self.claim_s / self.handler_s))

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
        return self.store.settles_with_claims and self.claim_pending and not self.stopping

    def _track(self, task: asyncio.Task[None], messages: int) -> None:
        self.held += messages
        self.running.add(task)
        task.add_done_callback(self._release)

    def _release(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        self.slot_free.set()
        self.handler_done.set()

    async def _run_in_turn(self, batch: list[Claimed], start: int) -> None:
        """Run the handlers of `batch` from `start` in this one task while each finishes without
        suspending; the first that suspends keeps this task to itself, and the rest of the batch
        goes on in a new task. Saves a task a message (3 µs of the event loop's 8.5) for handlers
        that never wait.

        A handler sees what a task of its own would show it: its own copy of the context, and a
        current task that runs nothing else while it waits, so asyncio.timeout() and cancels of a
        waiting handler reach it and nobody else. One difference remains: a handler that finishes
        without waiting shares its task with the handlers run in turn after it, so a cancel it
        schedules for its own task to happen later (asyncio.timeout() never does) reaches the
        handler that task is waiting in by then, which ends as if the worker were stopping.
        """
        for i in range(start, len(batch)):
            coro = self._run_handler(batch[i])
            context = contextvars.copy_context()
            try:
                step = context.run(coro.send, None)
            except StopIteration:
                continue
            if i + 1 < len(batch):
                self._track(asyncio.create_task(self._run_in_turn(batch, i + 1)), 0)
            await _Resumed(coro, step, context)
            return

    async def _attempt(self, claimed: Claimed, claimed_at: float) -> None:
        if not await self._take_slot(claimed, claimed_at):
            self.held -= 1  # not started here: it no longer counts against this worker's claims
            return
        try:
            began = time.monotonic()
            await self._run_handler(claimed)
            self.handler_s = _ewma(self.handler_s, time.monotonic() - began)
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
        share_s = self.app.lease_ms / 1000 * AHEAD_LEASE_SHARE
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
            if await self.store.renew_lease(self.app.worker_id, claimed, self.app.lease_ms):
                return True
            log.info("message %s was reclaimed while it waited for a slot; not started here", claimed.id)
        except Exception as err:
            log.warning("could not renew the lease of message %s (%s: %s); not started, it is reclaimed "
                        "after the lease", claimed.id, type(err).__name__, err)
        return False

    async def _run_handler(self, claimed: Claimed) -> None:
        route = self.routes[claimed.queue]
        started = now_ms()
        fx = Fx(self.app, route.flow, run_id=new_id("run_"), parent_run_id=claimed.parent_run_id,
                attempt=claimed.attempts, message_id=claimed.id, signal=claimed.signal)
        code = message = None
        try:
            value = payloads.decode(route.signal, claimed.payload)
            handler = route.flow.do
            assert handler is not None
            if route.is_async:
                await handler(value, fx)
            else:
                result = await asyncio.to_thread(handler, value, fx)
                if inspect.isawaitable(result):
                    await result
            ok = True
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # stopping: leave the message inflight, reclaimable after its lease
            # the handler's own code raised it (it awaited something cancelled): a failure
            ok = False
            code, message = failure_code(exc), failure_message(exc)
        except Exception as exc:
            ok = False
            code, message = failure_code(exc), failure_message(exc)
        finally:
            self.held -= 1  # ended, with an outcome or (stopping) without one
        self.pending_outcomes.append(Outcome(claimed, fx.run_id, route.flow.name or "", ok, started,
                                             now_ms(), code, message))
        self.outcome_ready.set()

    async def _settle_loop(self) -> None:
        backoff = 0.05
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
                await self.store.settle(self.app.worker_id, batch)
                backoff = 0.05
            except Exception as err:
                if not is_outage(err):
                    # Not a passing outage: retrying cannot help. The attempts stay inflight and
                    # are reclaimed after their lease, so nothing is lost or half-written.
                    log.exception("settle of %d outcomes failed; they will be reclaimed after the lease",
                                  len(batch))
                    continue
                log.warning("settle failed (%s: %s); retrying in %.2fs", type(err).__name__, err, backoff)
                self.pending_outcomes[:0] = batch
                # retry when a claim gets through (the store is back) rather than sleeping out the
                # back-off: an outcome left unsettled past its lease is re-run by the next claimer
                await _wait_any(self.store_back, timeout=backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                if self.stopping and backoff >= MAX_BACKOFF_S:
                    log.error("giving up settling %d outcomes at stop; they will be reclaimed", len(batch))
                    return
            finally:
                self._end_settle()
            self.settled.set()


class _Resumed:
    """Awaiting it drives `coro` on from the step it suspended at, inside `context`, as `await coro`
    would have from the start: what the task sends or throws in goes to the coroutine."""

    __slots__ = ("coro", "step", "context")

    def __init__(self, coro: Any, step: Any, context: contextvars.Context) -> None:
        self.coro, self.step, self.context = coro, step, context

    def __await__(self) -> Any:
        coro, context, step = self.coro, self.context, self.step
        while True:
            try:
                sent = yield step
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                try:
                    step = context.run(coro.throw, exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    step = context.run(coro.send, sent)
                except StopIteration as stop:
                    return stop.value


def _ewma(average: float, sample: float) -> float:
    return sample if not average else average + EWMA_WEIGHT * (sample - average)


async def _wait_any(*events: asyncio.Event, timeout: float | None = None) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
