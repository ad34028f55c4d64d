"""The records `engine.ops` returns: frozen dataclasses whose attributes are the JSON fields.

Every time is an int of epoch milliseconds. `to_json` turns any record (or list of
records, nested ones included) into plain JSON-ready data.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

STATUSES = ("pending", "inflight", "delivered", "dead")
REPLAYED = "replayed"  # the code (and kind) of the marker a replay appends to a failure history


class UnknownSignal(LookupError):
    """No signal of that name is recorded in the store (and none has messages)."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        listed = ", ".join(known) if known else "none recorded yet"
        super().__init__(f'unknown signal "{name}" (known signals: {listed})')


# What a message id looks like (`engine.ids.new_id("msg_")`): said when an id is unknown or malformed.
MESSAGE_ID_SHAPE = "msg_ then 26 letters and digits, e.g. msg_01j9zq4k7t8v2n3m5p6r7s8t9v"
_MESSAGE_ID = re.compile(r"msg_[0-9A-Za-z]{26}")
_SHOWN_ID = 60  # characters of a named id quoted back (an argument can be any length)


def looks_like_message_id(text: str) -> bool:
    """Whether `text` has the shape of a message id (not whether the store has it)."""
    return _MESSAGE_ID.fullmatch(text) is not None


def _quoted(ids: list[str]) -> str:
    shown = [i if len(i) <= _SHOWN_ID else i[: _SHOWN_ID - 1] + "…" for i in ids[:5]]
    return ", ".join(shown) + (f" … ({len(ids)} in all)" if len(ids) > 5 else "")


class UnknownMessage(LookupError):
    """No message with that id (in that signal, when one was named). The text says which ids are
    not message ids at all and which are unknown, and what an id looks like: the signal names
    would not help someone holding a mistyped id."""

    def __init__(self, ids: list[str], signal: str | None) -> None:
        self.ids = ids
        self.signal = signal
        malformed = [i for i in ids if not looks_like_message_id(i)]
        if malformed:
            noun = "a message id" if len(malformed) == 1 else "message ids"
            text = f"not {noun}: {_quoted(malformed)} (message ids look like {MESSAGE_ID_SHAPE})"
        else:
            where = f' in signal "{signal}"' if signal else ""
            noun = "message id" if len(ids) == 1 else "message ids"
            text = f"unknown {noun} {_quoted(ids)}{where}: no such message in this store (ids look like msg_…)"
        super().__init__(text)


class UnknownRun(LookupError):
    """No run with that id, and no message or run refers to it."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f'no run "{run_id}": nothing ran or was emitted under that id')


@dataclass(frozen=True)
class Failure:
    """One failed attempt, or (code "replayed") an operator's replay marker.

    `traceback`: the handler's (its last 8 KiB), read by `show` only (a list of dead letters would
    carry up to 8 KiB an attempt); None there, for a failure no handler raised (a cancel, an
    unbind), and for one recorded before okengine kept them."""

    code: str
    message: str
    at: int
    attempt: int
    traceback: str | None = None


@dataclass(frozen=True)
class DeadLetter:
    id: str
    signal: str
    key: str | None
    payload: Any
    attempts: int
    failures: list[Failure]
    created_at: int
    parent_run_id: str | None
    status: str = "dead"


@dataclass(frozen=True)
class SignalStats:
    """Counts per status of one signal; `lag_ms` is the age of its oldest pending message. A live
    signal has no messages: its figures are `kept`, `head` and `events_per_s`.

    `flows`: every flow (or live exposure) bound to the signal by a process seen in the last
    5 minutes; a once signal with two splits its messages between them."""

    signal: str
    kind: str
    description: str | None
    pending: int
    inflight: int
    delivered: int
    dead: int
    lag_ms: int | None
    flows: list[str]
    paused: bool = False  # an operator paused it: no process claims its messages
    scheduled: int = 0  # pending messages not due yet; lag_ms counts only due ones
    # a live signal's tape (None for once and broadcast): events retained, the newest event's id,
    # and events appended per second over the last minute
    kept: int | None = None
    head: str | None = None
    events_per_s: float | None = None
    # what needs a look (engine/ops/health.py), one short word per reason, the worst first:
    # "dead+12", "fail 35%", "orphaned 3", "lag 7m", "paused"; empty: nothing does
    health: list[str] = field(default_factory=list)
    # flow limits in force (declared, or an operator's override; None: none), the messages
    # inflight under a live lease, and the limit holding due messages back now ("concurrency", "rate")
    concurrency: int | None = None
    rate: str | None = None
    running: int = 0
    held_by: str | None = None


@dataclass(frozen=True)
class SignalInfo:
    """What the store knows of a signal: its recorded declaration and the flows bound to it."""

    name: str
    kind: str
    retries: int | None
    dead_letter: bool | None
    optional: bool | None
    retention: dict[str, Any] | None
    description: str | None
    app: str | None
    flows: list[str]
    recorded: bool  # False: only messages exist, no process recorded a declaration


class UnvalidatedPayload(UserWarning):
    """A replacement payload was stored unchecked: the signal has no JSON Schema to check it by."""


class UnknownFlow(LookupError):
    """No binding of that flow to that signal is recorded."""

    def __init__(self, signal: str, flow: str, known: list[str]) -> None:
        self.signal = signal
        self.flow = flow
        self.known = known
        listed = ", ".join(known) if known else "none recorded"
        super().__init__(f'no flow "{flow}" is bound to signal "{signal}" (its flows: {listed})')


@dataclass(frozen=True)
class BindingInfo:
    """A recorded binding: `active` while seen within its binding_ttl and not retired."""

    signal: str
    kind: str
    flow: str
    last_seen: int
    active: bool


@dataclass(frozen=True)
class Unbound:
    """An `unbind`: the binding is retired; `dead` pending copies ended dead (code "Unbound")."""

    signal: str
    flow: str
    dead: int
    ids: list[str]


@dataclass(frozen=True)
class MessageRow:
    """A message in a list (no payload)."""

    id: str
    status: str
    key: str | None
    attempts: int
    locked_by: str | None
    lease_expires_at: int | None
    created_at: int
    parent_run_id: str | None
    run_at: int | None = None  # not claimed before (a delay, an `at`, a back-off's next attempt)
    priority: int = 0
    dedupe: str | None = None


def waits_until(status: str, run_at: int | None, now: int) -> int | None:
    """When a pending message that is not due yet becomes due (its delay, or a back-off's next
    attempt), else None: a run_at already passed, or of a message not pending, is no wait."""
    return run_at if status == "pending" and run_at is not None and run_at > now else None


@dataclass(frozen=True)
class MessagePage:
    """One page of a message list; pass `next_cursor` (newest first: or `next_before_seq`) for the next."""

    items: list[MessageRow]
    next_before_seq: int | None
    clock_ms: int | None = None  # "now" by the clock leases are judged by, read with the page
    next_cursor: str | None = None  # None on the last page
    cut: bool = False  # a search stopped at its scan budget: the next page searches on


@dataclass(frozen=True)
class Lease:
    locked_by: str | None
    lease_expires_at: int | None
    reclaimable: bool  # inflight and its lease has expired: the next claim takes it over
    orphaned: bool = False  # inflight and its holder is gone (not seen for 30 s): stuck, not slow


@dataclass(frozen=True)
class Blocker:
    """The head of a key: the oldest unfinished message of the same queue and key."""

    id: str
    status: str
    attempts: int
    locked_by: str | None
    lease_expires_at: int | None
    created_at: int


@dataclass(frozen=True)
class EmittedMessage:
    id: str
    signal: str
    status: str
    key: str | None
    created_at: int


@dataclass(frozen=True)
class RunNode:
    """One run in a trace: the flow attempt, the messages it emitted, and the runs they caused.

    `status` is "succeeded", "failed", "lease_lost", or "unknown" for a run that is referenced
    (as a parent) but never recorded an outcome (still running, or its process died).
    `emitted` counts every message it emitted; `messages` lists at most the first 1000.
    """

    run_id: str
    flow: str | None
    status: str
    parent_run_id: str | None
    started_at: int | None
    ended_at: int | None
    message_id: str | None
    signal: str | None
    attempt: int | None
    error: str | None
    emitted: int
    messages: list[EmittedMessage]
    children: list[RunNode]


@dataclass(frozen=True)
class MessageDetail:
    """One message in full: payload, every failure, lease, what blocks it, its trace."""

    id: str
    signal: str
    flow: str | None
    key: str | None
    status: str
    payload: Any
    attempts: int
    retries: int
    replays: int
    created_at: int
    updated_at: int
    finished_at: int | None
    parent_run_id: str | None
    failures: list[Failure]
    lease: Lease
    blocked_by: Blocker | None
    runs: list[RunNode]  # the attempts that handled this message (without their subtrees)
    trace: list[RunNode]  # run trees from their roots: the emitting run's, else each handling run's
    run_at: int | None = None
    priority: int = 0
    dedupe: str | None = None
    due_at: int | None = None  # waits_until(): set while a pending message is not due yet


@dataclass(frozen=True)
class FailureGroup:
    code: str
    message: str
    count: int
    last_at: int


@dataclass(frozen=True)
class Replayed:
    replayed: int
    ids: list[str]


@dataclass(frozen=True)
class ReplayPreview:
    """A dry run: what a replay would take (ids: a sample of at most 20)."""

    replayed: int
    would_replay: int
    ids: list[str]


@dataclass(frozen=True)
class Purged:
    """`ids` lists the deleted ids, at most 10,000 (`purged` is the exact count)."""

    purged: int
    ids: list[str]


@dataclass(frozen=True)
class PurgePreview:
    purged: int
    would_purge: int
    ids: list[str]


@dataclass(frozen=True)
class Skipped:
    """A named message an operator control left alone, and the status that kept it."""

    id: str
    status: str


@dataclass(frozen=True)
class Cancelled:
    """`ids`: the messages that ended dead with code "Cancelled"; `skipped`: named ones left alone
    (finished already); `requested`: ones under a live lease whose holder is asked to stop their
    handler (it ends them dead, Cancelled, within about 2 s; until then a cancel reports them here)."""

    cancelled: int
    ids: list[str]
    skipped: list[Skipped]
    requested: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CancelPreview:
    """A dry run of `cancel`: how many it would cancel now (ids: a sample of at most 20)."""

    cancelled: int
    would_cancel: int
    ids: list[str]
    skipped: list[Skipped]
    would_request: list[str] = field(default_factory=list)  # every running one: its holder would be asked to stop


@dataclass(frozen=True)
class Deleted:
    deleted: int
    ids: list[str]
    skipped: list[Skipped]


@dataclass(frozen=True)
class Retried:
    """`ids`: pending messages that waited for their run_at and are due now."""

    retried: int
    ids: list[str]
    skipped: list[Skipped]


@dataclass(frozen=True)
class PauseState:
    """After `pause` / `resume`: whether `signal` is paused now, and whether this call changed it."""

    signal: str
    paused: bool
    changed: bool


class NotPausable(ValueError):
    """Only once and broadcast signals have messages to hold back: a live signal cannot be paused."""

    def __init__(self, signal: str, kind: str) -> None:
        self.signal = signal
        self.kind = kind
        super().__init__(
            f'signal "{signal}" is {kind}: only once and broadcast signals can be paused '
            "(a live tape has no messages to hold back)"
        )


@dataclass(frozen=True)
class AuditEntry:
    at: int
    actor: str
    action: str
    signal: str | None
    count: int
    ids: list[str]
    reason: str | None
    source: str | None = None  # where the write came from ("web ADDRESS:PORT"); None: not from a browser


def to_json(record: Any) -> Any:
    """A record (or list of records) as plain JSON-ready data."""
    if isinstance(record, list):
        return [to_json(r) for r in record]
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return dataclasses.asdict(record)
    return record


@dataclass(frozen=True)
class DoctorCheck:
    """One finding of `okconsole doctor`: the check's name, "ok" / "warn" / "fail", and what to do."""

    check: str
    status: str  # "ok" | "warn" | "fail"
    detail: str


@dataclass(frozen=True)
class Why:
    """`okconsole why`: one verdict for a message (engine/ops/verdict.py lists them and their
    precedence), one line an engineer can act on, and since when (epoch ms; None: unknown)."""

    id: str
    signal: str
    status: str
    verdict: str
    detail: str
    since: int | None


@dataclass(frozen=True)
class KeyHead:
    """A key with unfinished messages: its head (the oldest unfinished one), what the head has
    failed, and how many messages wait behind it. `flow`: the broadcast copy's flow (None for once)."""

    key: str
    flow: str | None
    head_id: str
    head_status: str
    head_attempts: int  # failed attempts of the head (a running attempt is not counted)
    head_last_failure: Failure | None
    waiting: int


@dataclass(frozen=True)
class KeyPage:
    """One page of `keys`, in key order; `next_after` (None on the last page) is the cursor of the
    next. A `blocked_only` page stops after looking at 10,000 keys: it may then hold fewer than
    `limit` with a `next_after` that looks further. `scanned`: the keys this page looked at."""

    items: list[KeyHead]
    next_after: str | None
    scanned: int
