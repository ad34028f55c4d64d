"""What the pool's parts share: the leases held, the slots, the outcomes waiting, the averages.

The claim lanes, the settler and the handler tasks of one pool run on one event loop and hand work
to each other through these fields. Each module of this package adds the methods of one job to
this one object (claiming, claim-ahead, running, settling) rather than being an object of its
own: the claim/settle loop reads and writes these fields for every message, and it is tuned to the
microsecond (bench/ONCE.md), so they stay plain attributes of one instance.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from ..runtime import Runtime
from ..store import Claimed, Outcome
from .route import Route

log = logging.getLogger("engine.worker")


class Waiting:
    """A claimed batch whose messages from `next` on wait for a handler slot; when their leases are
    next renewed, until when they start on their lease as it is (leases.py: renewed first after
    that), and the ones whose lease was lost meanwhile (by seq, not to be run here)."""

    __slots__ = ("batch", "lost", "next", "renew_at", "start_by")

    def __init__(self, batch: list[Claimed], renew_at: float, start_by: float) -> None:
        self.batch, self.next, self.renew_at, self.start_by = batch, 0, renew_at, start_by
        self.lost: set[int] | None = None


class PoolState:
    """The state of one worker pool; the methods are in the modules that subclass it."""

    def __init__(self, runtime: Runtime, routes: dict[str, Route], concurrency: int) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an int ≥ 1, got {concurrency!r}")
        self.runtime = runtime
        self.store = runtime.store
        self.hooks = runtime.hooks  # counts and traces each run (engine/telemetry/hooks.py)
        self.routes = routes
        self.queues = sorted(routes)
        self.concurrency = concurrency
        # Tasks running handlers (running.py); while any message waits for a slot, all
        # `concurrency` slots are taken by handlers in these tasks, which start it when one ends.
        self.running: set[asyncio.Task[None]] = set()
        self.held = 0  # leased messages whose handler has not ended yet (running or waiting for a slot)
        self.active = 0  # handlers running: slots taken
        self.waiting: deque[Waiting] = deque()  # claimed batches not all started yet, in claim order
        self.renewer: asyncio.Task[None] | None = None  # renews the leases of long waits (claim_ahead.py)
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
        self.lane_listening = False  # an idle lane waits for wake-ups; the others for `burst` (claiming.py)
        self.burst = asyncio.Event()  # a claim came back full: there may be more work than one lane takes
        self.store_back = asyncio.Event()  # set by each successful claim: cuts a settle back-off short
        # Signals an operator paused, as last read (pausing.py), and the queues a claim may take from.
        self.paused: frozenset[str] = frozenset()
        self.paused_read_at = float("-inf")  # the last read that answered
        self.paused_tried_at = float("-inf")  # the last read begun, answered or not
        self.paused_epoch: int | None = None  # the pause notices' epoch that read began in, if listening
        self.paused_lock = asyncio.Lock()
        self.claimable: list[str] = self.queues
        # The pool's standing offer to emits (handoff.py): its queues and when it was made; the
        # unsubscribe from take notices while subscribed; the reads of handed messages under way.
        self.offered: list[str] = []
        self.offered_at = float("-inf")
        self.stop_taking: Callable[[], None] | None = None
        self.takes: set[asyncio.Task[None]] = set()
