"""The one hook the worker calls around each handler: counts it (when metrics are served) and
traces it (when OpenTelemetry is configured). With neither, a run costs two calls that return None."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, NamedTuple

from . import tracing
from .handled import HandledStats

if TYPE_CHECKING:
    from ..fx import Fx
    from ..store import Claimed
    from ..worker.route import Route

DELIVERED, FAILED, DEAD = 0, 1, 2


class Watch(NamedTuple):
    started: float
    span: tracing.RunSpan | None


def outcome_of(route: Route, attempts: int, ok: bool) -> int:
    """What the attempt did to the message, as the store records it: a failure with
    attempts left is `failed`, an exhausted one `dead` (or `delivered` with dead_letter=False)."""
    if ok:
        return DELIVERED
    if attempts <= route.signal.retries:
        return FAILED
    return DEAD if route.signal.dead_letter else DELIVERED


class RunHooks:
    """One per app: its handler counters (read by the metrics route) and the run spans."""

    def __init__(self) -> None:
        self.handled = HandledStats()
        self.counting = False  # set by the app when a metrics route is mounted

    def begin(self, route: Route, claimed: Claimed, fx: Fx) -> Watch | None:
        if not self.counting and tracing.API_MODULE not in sys.modules:
            return None  # neither metrics nor OpenTelemetry in this process: the run costs nothing here
        span = tracing.start_run(
            route.flow.name or "", claimed.signal, claimed.id, claimed.attempts, fx.run_id, claimed.traceparent
        )
        if span is None and not self.counting:
            return None
        return Watch(time.perf_counter(), span)

    def end(self, watch: Watch | None, route: Route, claimed: Claimed, error: BaseException | None) -> str | None:
        """Count and end the run; returns what the store should carry for a retry's link (or None)."""
        if watch is None:
            return None
        if self.counting:
            seconds = time.perf_counter() - watch.started
            counts = self.handled.by_queue.get(claimed.queue) or self.handled.add_flow(
                claimed.queue, claimed.signal, route.flow.name or ""
            )
            counts.add(DELIVERED if error is None else outcome_of(route, claimed.attempts, False), seconds)
        return watch.span.end(error) if watch.span is not None else None
