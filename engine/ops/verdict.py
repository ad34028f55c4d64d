"""Why a message is (not) running: one verdict from a small snapshot, decided without a store.

`decide(snapshot)` is pure: `engine/ops/why.py` reads the snapshot in one read transaction and the
unit tests build snapshots by hand. A message that is not finished can be held for several reasons
at once; the verdict is the first that applies, in the order an engineer acts on them:

    running > orphaned > paused > no_worker > blocked_by_key > not_due > concurrency_limited >
    rate_limited > due

- a message under a live lease is `running` whatever else holds (a paused signal lets a running
  handler finish); one whose holder is gone is `orphaned`, the state of the message itself;
- `paused` before everything else that holds a ready message: it is an operator's decision, and
  nothing of the signal runs until `resume`, whatever else is fixed;
- `no_worker` before `blocked_by_key`: without a process bound to the signal the head cannot run
  either, so fixing the head changes nothing yet;
- `blocked_by_key` before `not_due`: when its time comes the message still waits for the head;
- a flow limit (`concurrency_limited`, `rate_limited`) holds only a due message, so it comes last
  before `due`: the limit's figures and, for a rate, when the next start fits.

The detail names the other reasons that also hold ("also: blocked_by_key, not_due"), so the
precedence hides nothing. A cancelled message is `dead` (cancel ends it dead with code
"Cancelled", replayable); its detail says it was cancelled, by whom's reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..display import cut, one_line
from .records import Failure, Why

ORPHAN_AFTER_MS = 30_000  # the holder not seen for this long: its lease is orphaned
NO_WORKER_AFTER_MS = 5 * 60_000  # no process bound to the signal seen for this long: no_worker
CANCELLED = "Cancelled"  # the failure code `cancel` records (engine/ops/controls.py)
TEXT_BYTES = 200  # of one stored text (a failure message, a reason) in the one-line detail

VERDICTS = (
    "delivered", "dead", "running", "orphaned", "paused", "no_worker", "blocked_by_key", "not_due",
    "concurrency_limited", "rate_limited", "due",
)  # fmt: skip


@dataclass(frozen=True)
class Holder:
    """The worker a lease names, as `oke_workers` last saw it (`last_seen` None: no record)."""

    worker_id: str
    host: str | None = None
    pid: int | None = None
    last_seen: int | None = None
    stopped_at: int | None = None


@dataclass(frozen=True)
class Head:
    """The unfinished message a keyed message waits behind; `failed` counts its failed attempts."""

    id: str
    status: str
    failed: int
    last_failure: Failure | None = None


@dataclass(frozen=True)
class Pause:
    paused_at: int
    actor: str
    reason: str | None = None


@dataclass(frozen=True)
class LimitHeld:
    """A flow limit holding the message's queue back: "concurrency" (`running` of `concurrency`
    inflight) or "rate" (its window full until `until`, by the lease clock)."""

    limit: str
    running: int
    concurrency: int | None
    rate: str | None
    until: int | None


@dataclass(frozen=True)
class Snapshot:
    """What the verdict needs of one message, read in one transaction. Lease times by the store's
    lease clock (`now`); `bound_seen_ago_ms`: since a process bound to the message's queue was last
    seen (None: no binding recorded)."""

    id: str
    signal: str
    status: str
    attempts: int
    created_at: int
    updated_at: int
    now: int
    key: str | None = None
    finished_at: int | None = None
    run_at: int | None = None
    lease_expires_at: int | None = None
    holder: Holder | None = None
    last_failure: Failure | None = None
    head: Head | None = None
    pause: Pause | None = None
    bound_seen_ago_ms: int | None = 0
    limit: LimitHeld | None = None


def shown(value: object) -> str:
    """Stored text as one inert line, cut to TEXT_BYTES."""
    head, more = cut(one_line(value), TEXT_BYTES)
    return head + ("…" if more else "")


def span(ms: int) -> str:
    """A duration as a person reads it: 850 ms, 12 s, 4 min 5 s, 3 h 12 min, 2 d 4 h."""
    ms = max(0, ms)
    if ms < 1000:
        return f"{ms} ms"
    s = ms // 1000
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s} s" if s else f"{m} min"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m} min"
    d, h = divmod(h, 24)
    return f"{d} d {h} h"


def clock(at_ms: int) -> str:
    """A time of day (local, as the console shows times), with the date when it is not today."""
    at = time.localtime(at_ms / 1000)
    today = time.localtime()
    day = "" if at[:3] == today[:3] else time.strftime("%Y-%m-%d ", at)
    return day + time.strftime("%H:%M:%S", at)


def failure_text(failure: Failure | None) -> str:
    if failure is None:
        return "no failure recorded"
    return f"{shown(failure.code)}: {shown(failure.message)}" if failure.message else shown(failure.code)


def _holder_text(h: Holder | None, now: int) -> str:
    if h is None:
        return "no worker"
    where = f" ({shown(h.host)}:{h.pid})" if h.host is not None else ""
    if h.last_seen is None:
        return f"worker {shown(h.worker_id)}, which has no heartbeat record"
    state = f"stopped {span(now - h.stopped_at)} ago" if h.stopped_at is not None else ""
    seen = f"seen {span(now - h.last_seen)} ago"
    return f"worker {shown(h.worker_id)}{where}, {state or seen}"


def holder_alive(s: Snapshot) -> bool:
    h = s.holder
    return h is not None and h.last_seen is not None and h.stopped_at is None and s.now - h.last_seen < ORPHAN_AFTER_MS


def _lease_live(s: Snapshot) -> bool:
    return s.lease_expires_at is not None and s.lease_expires_at >= s.now


def _due_since(s: Snapshot) -> int:
    return max(s.run_at or 0, s.updated_at)


# -- the reasons a ready message is held, each (verdict, detail, since) or None ------------------
Reason = tuple[str, str, int | None]


def _paused(s: Snapshot) -> Reason | None:
    p = s.pause
    if p is None:
        return None
    why = f": {shown(p.reason)}" if p.reason else ""
    return (
        "paused",
        f"signal {shown(s.signal)} paused by {shown(p.actor)}{why} at {clock(p.paused_at)}; "
        f"okconsole resume {shown(s.signal)} lets it run",
        p.paused_at,
    )


def _no_worker(s: Snapshot) -> Reason | None:
    ago = s.bound_seen_ago_ms
    if ago is not None and ago < NO_WORKER_AFTER_MS:
        return None
    seen = "no process bound to it was ever recorded" if ago is None else f"last seen {span(ago)} ago"
    return (
        "no_worker",
        f"no process bound to {shown(s.signal)} seen in the last 5 min ({seen}): start a worker for it",
        None if ago is None else s.now - ago,
    )


def _blocked(s: Snapshot) -> Reason | None:
    h = s.head
    if h is None:
        return None
    return (
        "blocked_by_key",
        f"waits behind {shown(h.id)} ({shown(h.status)}, {h.failed} failed attempt{'s' * (h.failed != 1)}, "
        f"last: {failure_text(h.last_failure)}), the head of key '{shown(s.key)}': okconsole why {shown(h.id)}",
        _due_since(s),
    )


def _not_due(s: Snapshot) -> Reason | None:
    if s.status != "pending" or s.run_at is None or s.run_at <= s.now:
        return None
    why = f"a back-off after attempt {s.attempts} (last: {failure_text(s.last_failure)})" if s.attempts else "a delay"
    return (
        "not_due",
        f"not due until {clock(s.run_at)} (in {span(s.run_at - s.now)}): {why}; "
        f"okconsole retry {shown(s.signal)} {shown(s.id)} makes it due now",
        s.updated_at,
    )


def _limited(s: Snapshot) -> Reason | None:
    held = s.limit
    if held is None or s.status != "pending" or (s.run_at is not None and s.run_at > s.now):
        return None
    change = f"okconsole limit {shown(s.signal)} changes it"
    if held.limit == "concurrency":
        return (
            "concurrency_limited",
            f"{held.running} of at most {held.concurrency} running (concurrency limit): "
            f"waits until one of them ends; {change}",
            _due_since(s),
        )
    until = held.until if held.until is not None else s.now
    return (
        "rate_limited",
        f"the rate limit {shown(held.rate)} is used up: the next start fits at {clock(until)} "
        f"(in {span(until - s.now)}); {change}",
        _due_since(s),
    )


def _due(s: Snapshot) -> Reason:
    if s.status == "inflight":
        lost = f"its lease expired {span(s.now - (s.lease_expires_at or s.now))} ago"
        return "due", f"{lost}; held by {_holder_text(s.holder, s.now)}: the next claim takes it over", _due_since(s)
    after = f" (after {s.attempts} attempts, last: {failure_text(s.last_failure)})" if s.attempts else ""
    return (
        "due",
        f"due for {span(s.now - _due_since(s))}{after}; waiting for a free worker",
        _due_since(s),
    )


HOLDS = (_paused, _no_worker, _blocked, _not_due, _limited)


def _finished(s: Snapshot) -> Why:
    since = s.finished_at if s.finished_at is not None else s.updated_at
    if s.status == "delivered":
        return Why(s.id, s.signal, s.status, "delivered", f"delivered at {clock(since)} (attempt {s.attempts})", since)
    f = s.last_failure
    if f is not None and f.code == CANCELLED:
        why = f" ({shown(f.message)})" if f.message else ""
        detail = f"cancelled by an operator{why} at {clock(since)}"
    else:
        detail = f"dead after {s.attempts} attempt{'s' * (s.attempts != 1)}, last: {failure_text(f)}"
    replay = f"okconsole replay {shown(s.signal)} {shown(s.id)} requeues it"
    return Why(s.id, s.signal, s.status, "dead", f"{detail}; {replay}", since)


def _held(s: Snapshot) -> Reason | None:
    """An inflight message's lease: running, orphaned, or None (expired, holder alive: reclaimable)."""
    if s.status != "inflight":
        return None
    lease_until = s.lease_expires_at or s.now
    if not holder_alive(s):
        when = f"at {clock(lease_until)} (in {span(lease_until - s.now)})" if lease_until > s.now else "now"
        seen = s.holder.last_seen if s.holder is not None else None
        return "orphaned", f"held by {_holder_text(s.holder, s.now)}; reclaimable {when}", seen
    if _lease_live(s):
        return (
            "running",
            f"held by {_holder_text(s.holder, s.now)}; lease until {clock(lease_until)} (attempt {s.attempts})",
            s.updated_at,
        )
    return None


def decide(s: Snapshot) -> Why:
    """The one verdict for the message `s` describes (the precedence is the module's docstring)."""
    if s.status in ("delivered", "dead"):
        return _finished(s)
    held = _held(s)
    if held is not None and held[0] == "running":
        return Why(s.id, s.signal, s.status, *held)
    holds = [r for r in (hold(s) for hold in HOLDS) if r is not None]
    first = held or (holds[0] if holds else _due(s))
    also = [r[0] for r in holds if r[0] != first[0]]
    detail = first[1] + (f" (also: {', '.join(also)})" if also else "")
    return Why(s.id, s.signal, s.status, first[0], detail, first[2])
