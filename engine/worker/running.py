"""Running handlers: one attempt of a message, its outcome queued for the settler; handler turns
(waiting messages run in one task while their handlers finish without waiting); the stop grace
period."""

from __future__ import annotations

import asyncio
import contextvars
import time

from .. import payloads
from ..fx import Fx
from ..ids import new_id, now_ms
from ..store import Claimed, Outcome
from .averages import ewma
from .failures import failure_code, failure_message, failure_traceback
from .invoking import call_handler, call_within_timeout
from .state import PoolState, log
from .turns import Resumed


class Running(PoolState):
    """Handler tasks: started, tracked while they hold a lease, let finish or cancelled at stop."""

    def _track(self, task: asyncio.Task[None]) -> None:
        self.running.add(task)
        task.add_done_callback(self._release)

    def _release(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        self.slot_free.set()
        self.handler_done.set()

    async def _run_waiting(self) -> None:
        """Start waiting messages while a slot is free, in this one task while each handler finishes
        without suspending; the first that suspends keeps this task to itself, the next ones go on
        in a new task, and once it ends this task takes the next waiting message. Saves a task and
        a loop iteration a message for handlers that never wait (bench/ONCE.md). Once the pool is
        stopping nothing more starts: what still waits is handed back (claim_ahead.py).

        A handler sees what a task of its own would show it: its own copy of the context, and a
        current task that runs nothing else while it waits, so asyncio.timeout() and cancels of a
        waiting handler reach it and nobody else. One difference remains: a handler shares its task
        with the handlers run before and after it, so a cancel it schedules for its own task to
        happen later (asyncio.timeout() never does) reaches the handler that task is waiting in by
        then, which ends as if the worker were stopping.
        """
        waiting, stop = self.waiting, self.runtime.stop
        while waiting and self.active < self.concurrency and not stop.is_set():
            head = waiting[0]
            claimed = head.batch[head.next]
            head.next += 1
            if head.next == len(head.batch):
                waiting.popleft()
            if head.lost is not None and claimed.seq in head.lost:
                continue  # its lease was lost while it waited (claim_ahead.py)
            self.active += 1
            began = time.monotonic()
            try:
                # on its lease as it is while enough of it is left, else on a renewed one (leases.py)
                coro = self._run_handler(claimed) if began <= head.start_by else self._start_renewed(claimed)
                context = contextvars.copy_context()
                try:
                    step = context.run(coro.send, None)
                except StopIteration:
                    continue
                if waiting and self.active < self.concurrency:
                    self._track(asyncio.create_task(self._run_waiting()))
                elif waiting:
                    self._left_waiting()
                await Resumed(coro, step, context)
            finally:
                self.active -= 1
                self.handler_s = ewma(self.handler_s, time.monotonic() - began)
        if waiting and not stop.is_set():  # every slot taken: the rest wait for a handler to end
            self._left_waiting()

    def _left_waiting(self) -> None:
        """Messages are left waiting for a slot (claim_ahead.py renews their leases meanwhile)."""

    async def _start_renewed(self, claimed: Claimed) -> None:
        """Run a message that waited for its slot past its lease's start margin, on a renewed lease
        (claim_ahead.py)."""
        raise NotImplementedError

    async def _run_handler(self, claimed: Claimed) -> None:
        """One attempt: decode, run the flow, queue the outcome for the settler. A stop cancels it
        without an outcome (the message stays inflight, reclaimable after its lease)."""
        route = self.routes[claimed.queue]
        started = now_ms()
        fx = Fx(
            self.runtime,
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
        watch = self.hooks.begin(route, claimed, fx)
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
            if task is None or task.cancelling():
                raise  # stopping: leave the message inflight, reclaimable after its lease
            # the handler's own code raised it (it awaited something cancelled): a failure
            ok, error = False, exc
            code, message, trace = failure_code(exc), failure_message(exc), failure_traceback(exc)
        except Exception as exc:
            ok, error = False, exc
            code, message, trace = failure_code(exc), failure_message(exc), failure_traceback(exc)
        finally:
            self.held -= 1  # ended, with an outcome or (stopping) without one
        carried = None if watch is None else self.hooks.end(watch, route, claimed, error)  # metrics, tracing
        backoff = route.signal.backoff
        retry_in = backoff.delay_after(claimed.attempts) if backoff is not None and not ok else None
        self.pending_outcomes.append(
            Outcome(
                claimed,
                fx.run_id,
                route.flow.name or "",
                ok,
                started,
                now_ms(),
                code,
                message,
                carried,
                retry_in,
                trace,
            )
        )
        self.outcome_ready.set()

    async def _finish_running(self) -> None:
        """Let running handlers end within the grace period; the rest are cancelled and stay
        reclaimable."""
        deadline = time.monotonic() + self.runtime.stop_grace_s
        while self.running and time.monotonic() < deadline:  # a task may hand waiting messages to a new one
            await asyncio.wait(set(self.running), timeout=deadline - time.monotonic())
        if self.running:
            log.warning(
                "%d handlers outlived the stop grace period; their messages will be reclaimed after the lease",
                len(self.running),
            )
            await self._cancel_running()

    async def _cancel_running(self) -> None:
        """Cancel the running handlers at once (their messages stay inflight, reclaimable after the
        lease) and give them the stop grace period to unwind. One that swallows the cancel and
        runs on is left behind: the settler stops waiting for it, and its message is reclaimed."""
        tasks = list(self.running)
        for task in tasks:
            task.cancel()
        _done, stuck = await asyncio.wait(tasks, timeout=self.runtime.stop_grace_s)
        if stuck:
            log.warning("%d handlers ignored the cancel; their messages will be reclaimed after the lease", len(stuck))
            self.running.difference_update(stuck)
