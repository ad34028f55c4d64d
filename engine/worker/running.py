"""The runner: the handler slots, one attempt of a message, and the stop grace period.

Handler turns: waiting messages run in one task while their handlers finish without waiting
(turns.py); the lease-start rule decides whether a message starts on its claim's lease or on a
renewed one (leases.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from .. import payloads
from ..failures import failure_code, failure_message, failure_traceback
from ..fx import Fx
from ..ids import new_id, now_ms
from ..runtime import Runtime
from ..store import Claimed, Outcome
from ..store.cancels import CANCELLED
from .averages import ewma
from .claim_ahead import WaitingLine
from .invoking import call_handler, call_within_timeout
from .route import Route
from .turns import Resumed
from .waiting import wait_any
from .worker_store import WorkerStore

log = logging.getLogger("engine.worker")


class Runner:
    """Owns the handler slots: the messages held (running or waiting for a slot), the slots taken,
    the handler tasks, the handler-time average, and the line of claimed messages not started yet.
    Each attempt's outcome goes to `record` (the settler's)."""

    def __init__(
        self,
        runtime: Runtime,
        store: WorkerStore,
        routes: dict[str, Route],
        concurrency: int,
        record: Callable[[Outcome], None],
        stopped: Callable[[Outcome], None],
    ) -> None:
        self._runtime = runtime
        self._hooks = runtime.hooks  # counts and traces each run (engine/telemetry/hooks.py)
        self._routes = routes
        self._concurrency = concurrency
        self._record = record
        self._stopped = stopped  # an attempt an operator stopped: its Cancelled outcome (cancelling.py)
        self._line = WaitingLine(store, runtime.worker_id, runtime.lease_ms, self._dropped)
        # Tasks running handlers; while any message waits for a slot, all `concurrency` slots are
        # taken by handlers in these tasks, which start it when one ends.
        self._tasks: set[asyncio.Task[None]] = set()
        self._held = 0  # leased messages whose handler has not ended yet (running or waiting for a slot)
        self._active = 0  # handlers running: slots taken
        self._handler_s = 0.0  # moving average; 0 until measured (no claiming ahead before that)
        self._slot_free = asyncio.Event()
        self.handler_done = asyncio.Event()  # a handler task ended (set here; a drain waits on it and clears it)
        # The task running each message's handler now (a task runs one handler at a time while it
        # waits), and the running ones an operator asked to stop, with the note their attempt ends with.
        self._running: dict[str, asyncio.Task[Any]] = {}
        self._asked: dict[str, str] = {}

    @property
    def held(self) -> int:
        """Messages this worker leased whose handler has not ended: what its heartbeat reports."""
        return self._held

    @property
    def handler_s(self) -> float:
        """The moving average of a handler's time (0 until one ended): sizes claims ahead."""
        return self._handler_s

    def stop_running(self, requests: Mapping[str, str]) -> list[str]:
        """Cancel the task of each running handler `requests` names (message id → note), once: its
        attempt then ends Cancelled with that note, however the handler ends (cancelling.py). A
        message not running here is left alone: its handler ended first (the request is void for
        that attempt), or it runs elsewhere, or it has not started (the next read finds it running)."""
        stopped = []
        for message_id, note in requests.items():
            task = self._running.get(message_id)
            if task is not None and message_id not in self._asked:
                self._asked[message_id] = note
                task.cancel()
                stopped.append(message_id)
        return stopped

    def busy(self) -> bool:
        """Whether a handler task still runs."""
        return bool(self._tasks)

    async def wait_for_room(self, stop: asyncio.Event) -> None:
        """Until a slot frees, a claimed message is dropped, a claim returns (`room_changed`) or a stop."""
        self._slot_free.clear()
        await wait_any(self._slot_free, stop)

    def room_changed(self) -> None:
        """A claim returned: what it asked for may be asked for again, so lanes waiting for room look again."""
        self._slot_free.set()

    def start(self, batch: list[Claimed], leased_at: float) -> None:
        """Queue a claimed batch for the handler slots; the messages that find one start now.
        `leased_at`: the monotonic time its lease counts from (before the claim was sent)."""
        self._held += len(batch)
        self._line.add(batch, leased_at)
        if self._active < self._concurrency:
            self._track(asyncio.create_task(self._run_waiting()))
        else:
            self._line.keep_leases()

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._release)

    def _release(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slot_free.set()
        self.handler_done.set()

    def _dropped(self) -> None:
        """A held message will not start here (its lease was lost): it no longer counts against
        this worker's claims."""
        self._held -= 1
        self._slot_free.set()

    async def _run_waiting(self) -> None:
        """Start waiting messages while a slot is free, in this one task while each handler finishes
        without suspending; the first that suspends keeps this task to itself, the next ones go on
        in a new task, and once it ends this task takes the next waiting message. Saves a task and
        a loop iteration a message for handlers that never wait (docs/design/claim-ahead.md). Once
        the pool is stopping nothing more starts: what still waits is handed back.

        A handler sees what a task of its own would show it: its own copy of the context, and a
        current task that runs nothing else while it waits, so asyncio.timeout() and cancels of a
        waiting handler reach it and nobody else. One difference remains: a handler shares its task
        with the handlers run before and after it, so a cancel it schedules for its own task to
        happen later (asyncio.timeout() never does) reaches the handler that task is waiting in by
        then, which ends as if the worker were stopping.
        """
        line, stop, concurrency = self._line, self._runtime.stop, self._concurrency
        while self._active < concurrency and not stop.is_set() and (next_up := line.next()) is not None:
            claimed, start_by = next_up
            self._active += 1
            began = time.monotonic()
            try:
                # on its lease as it is while enough of it is left, else on a renewed one (leases.py)
                coro = self._run_handler(claimed) if began <= start_by else self._start_renewed(claimed)
                context = contextvars.copy_context()
                try:
                    step = context.run(coro.send, None)
                except StopIteration:
                    continue
                if line and self._active < concurrency:
                    self._track(asyncio.create_task(self._run_waiting()))
                elif line:
                    line.keep_leases()
                await Resumed(coro, step, context)
            finally:
                self._active -= 1
                self._handler_s = ewma(self._handler_s, time.monotonic() - began)
        if line and not stop.is_set():  # every slot taken: the rest wait for a handler to end
            line.keep_leases()

    async def _start_renewed(self, claimed: Claimed) -> None:
        """Run a message that waited for its slot past its lease's start margin on a renewed lease
        (leases.py); not when this worker lost it meanwhile, nor once the pool is stopping (then it
        is handed back, as the messages still waiting are)."""
        if not await self._line.renew_to_start(claimed):
            return
        if self._runtime.stop.is_set():
            await self._hand_back([claimed])
            return
        await self._run_handler(claimed)

    async def _run_handler(self, claimed: Claimed) -> None:
        """One attempt: decode, run the flow, record the outcome for the settler. A stop cancels it
        without an outcome (the message stays inflight, reclaimable after its lease)."""
        route = self._routes[claimed.queue]
        started = now_ms()
        fx = Fx(
            self._runtime,
            route.flow,
            run_id=new_id("run_"),
            parent_run_id=claimed.parent_run_id,
            attempt=claimed.attempts,
            message_id=claimed.id,
            signal=claimed.signal,
            claimed=claimed,
        )
        code = message = trace = None
        error: BaseException | None = None
        watch = self._hooks.begin(route, claimed, fx)
        running = self._running
        me = running[claimed.id] = asyncio.current_task()  # type: ignore[assignment]  # always in a task
        try:
            value = payloads.decode(route.signal, claimed.payload)
            timeout_s = route.flow.timeout_s
            if timeout_s is not None:
                await call_within_timeout(route, value, fx, timeout_s)
            elif route.is_async:  # the common case, called here: no coroutine frame in between
                assert route.flow.do is not None
                await route.flow.do(value, fx)
            else:
                await call_handler(route, value, fx)
            ok = True
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if claimed.id not in self._asked and (task is None or task.cancelling()):
                raise  # stopping: leave the message inflight, reclaimable after its lease
            # the handler's own code raised it (it awaited something cancelled): a failure
            ok, error = False, exc
            code, message, trace = failure_code(exc), failure_message(exc), failure_traceback(exc)
        except Exception as exc:
            ok, error = False, exc
            code, message, trace = failure_code(exc), failure_message(exc), failure_traceback(exc)
        finally:
            if running.get(claimed.id) is me:  # a newer attempt of it (its lease ran out) may run here too
                del running[claimed.id]
            self._held -= 1  # ended, with an outcome or (stopping) without one
        carried = None if watch is None else self._hooks.end(watch, route, claimed, error)  # metrics, tracing
        if self._asked and (note := self._asked.pop(claimed.id, None)) is not None:
            self._end_stopped(claimed, fx.run_id, route, started, note, error)
            return
        backoff = route.signal.backoff
        retry_in = backoff.delay_after(claimed.attempts) if backoff is not None and not ok else None
        name = route.flow.name or ""
        self._record(Outcome(claimed, fx.run_id, name, ok, started, now_ms(), code, message, carried, retry_in, trace))

    def _end_stopped(
        self, claimed: Claimed, run_id: str, route: Route, started: int, note: str, error: BaseException | None
    ) -> None:
        """An attempt an operator stopped ends Cancelled, however its handler ended: raising the
        cancel, swallowing it and returning, or failing on the way out. Its task's cancel request
        is spent here, so the next handler this task runs is not cancelled by it."""
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            task.uncancel()
        trace = failure_traceback(error) if error is not None else None
        flow = route.flow.name or ""
        self._stopped(Outcome(claimed, run_id, flow, False, started, now_ms(), CANCELLED, note, None, None, trace))

    async def hand_back_waiting(self) -> None:
        """At a clean stop: the messages still waiting for a slot go back to pending now (their
        attempt not counted), for another worker to take at once rather than after their lease.
        Nothing starts them here any more. If the store is away they stay inflight and are
        reclaimed after the lease, as before."""
        self._line.stop_renewing()
        await self._hand_back(self._line.take_unstarted())

    async def _hand_back(self, unstarted: list[Claimed]) -> None:
        if not unstarted:
            return
        self._held -= len(unstarted)
        await self._line.hand_back(unstarted)

    def stop_renewing(self) -> None:
        """The run is over: messages still waiting keep their leases until they run out."""
        self._line.stop_renewing()

    async def finish(self) -> None:
        """Let running handlers end within the grace period; the rest are cancelled and stay
        reclaimable."""
        deadline = time.monotonic() + self._runtime.stop_grace_s
        while self._tasks and time.monotonic() < deadline:  # a task may hand waiting messages to a new one
            await asyncio.wait(set(self._tasks), timeout=deadline - time.monotonic())
        if self._tasks:
            log.warning(
                "%d handlers outlived the stop grace period; their messages will be reclaimed after the lease",
                len(self._tasks),
            )
            await self.cancel()

    async def cancel(self) -> None:
        """Cancel the running handlers at once (their messages stay inflight, reclaimable after the
        lease) and give them the stop grace period to unwind. One that swallows the cancel and
        runs on is left behind: the settler stops waiting for it, and its message is reclaimed."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        _done, stuck = await asyncio.wait(tasks, timeout=self._runtime.stop_grace_s)
        if stuck:
            log.warning("%d handlers ignored the cancel; their messages will be reclaimed after the lease", len(stuck))
            self._tasks.difference_update(stuck)
