"""The operator model: counts, lists, failures, traces, replay and purge over a store.

Every reader of the store outside the hot path (fx.dead_letters, the CLI, the
TUI) goes through here; the statements live in the submodules, one job each:
`queries` (reads), `trace` (run trees), `repair` (replay, purge, audit writes).
Each function takes an open `Store` and runs one `store.read` / `store.write`
transaction (a rate-limited replay runs one per chunk). Records are frozen
dataclasses whose attributes are the JSON fields (`to_json`); times are epoch ms.

Errors: `UnknownSignal`, `UnknownMessage`, `UnknownRun`, `UnknownFlow` (LookupErrors
naming what is known; for a message id, what an id looks like), `ValueError` for a bad
argument, `OkeError` 1250 for a replacement payload the signal's schema (or its recorded JSON
Schema) refuses.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from .. import json_schemas
from ..signals import declared
from ..store import Store, registry
from ..store.limits import Override
from ..store.wake import CANCELS, wake_local
from . import clocks as _clocks
from . import controls, flow_limits, keyheads, pausing, queries, repair, unbinding, verdict
from . import doctor as _doctor
from . import health as _health
from . import history as _history
from . import trace as _trace
from . import why as _why
from . import workers as _workers
from .clocks import ClockInfo
from .doctor import DUE_AFTER_MS
from .flow_limits import LimitState
from .history import HistoryPoint
from .records import (
    STATUSES,
    AuditEntry,
    BindingInfo,
    Blocker,
    Cancelled,
    CancelPreview,
    DeadLetter,
    Deleted,
    DoctorCheck,
    EmittedMessage,
    Failure,
    FailureGroup,
    KeyHead,
    KeyPage,
    Lease,
    MessageDetail,
    MessagePage,
    MessageRow,
    NotPausable,
    PauseState,
    Purged,
    PurgePreview,
    Replayed,
    ReplayPreview,
    Retried,
    RunNode,
    SignalInfo,
    SignalStats,
    Skipped,
    Unbound,
    UnknownFlow,
    UnknownMessage,
    UnknownRun,
    UnknownSignal,
    UnvalidatedPayload,
    Why,
    to_json,
    waits_until,
)
from .repair import UNCHANGED, default_actor
from .workers import ORPHAN_AFTER_MS, SEEN_WITHIN_MS, WorkerInfo

__all__ = [
    "AuditEntry",
    "BindingInfo",
    "Blocker",
    "CancelPreview",
    "Cancelled",
    "DeadLetter",
    "Deleted",
    "DoctorCheck",
    "EmittedMessage",
    "Failure",
    "FailureGroup",
    "HistoryPoint",
    "KeyHead",
    "KeyPage",
    "Lease",
    "MessageDetail",
    "MessagePage",
    "MessageRow",
    "NotPausable",
    "LimitState",
    "check_limit",
    "PauseState",
    "waits_until",
    "Purged",
    "PurgePreview",
    "Replayed",
    "ReplayPreview",
    "Retried",
    "RunNode",
    "STATUSES",
    "SignalInfo",
    "SignalStats",
    "Skipped",
    "UNCHANGED",
    "Unbound",
    "UnknownFlow",
    "UnknownMessage",
    "UnknownRun",
    "UnknownSignal",
    "UnvalidatedPayload",
    "WorkerInfo",
    "Why",
    "audit",
    "binding",
    "bindings",
    "ClockInfo",
    "clocks",
    "cancel",
    "dead_letters",
    "delete",
    "default_actor",
    "doctor",
    "doctor_schema_too_new",
    "failures",
    "history",
    "keys",
    "known_signals",
    "message_page",
    "messages",
    "pause",
    "purge",
    "replay",
    "resume",
    "retry",
    "show",
    "signal_info",
    "stats",
    "to_json",
    "trace",
    "unbind",
    "why",
    "workers",
]


# -- reads --------------------------------------------------------------------------------------
async def known_signals(store: Store) -> list[str]:
    """Every signal recorded by an app, plus any signal that has messages but no record."""
    return await store.read(queries.known_signals)


async def signal_info(store: Store, name: str) -> SignalInfo | None:
    """The recorded declaration of `name` and its bound flows; None when the store knows no such signal."""
    return await store.read(lambda conn: queries.signal_info(conn, name))


async def stats(store: Store) -> list[SignalStats]:
    """Per signal (recorded ones included at zero): counts by status, the oldest pending age and
    the health marks of what needs a look (engine/ops/health.py)."""
    return await store.read(lambda conn: _health.with_health(conn, flow_limits.with_limits(conn, queries.stats(conn))))


async def history(store: Store, signal: str, since_ms: int, until_ms: int | None = None) -> list[HistoryPoint]:
    """`signal`'s counts per minute since `since_ms` (epoch ms), oldest first and gap-free
    (engine/ops/history.py); UnknownSignal when the store knows no such signal."""
    return await store.read(lambda conn: _history.history(conn, signal, since_ms, until_ms))


async def message_page(
    store: Store,
    signal: str,
    status: str | None = None,
    key: str | None = None,
    limit: int = 50,
    before_seq: int | None = None,
    *,
    search: str | None = None,
    sort: str | None = None,
    descending: bool = True,
    cursor: str | None = None,
) -> MessagePage:
    """A page of `messages` plus the cursor of the next page (None on the last).

    `sort` orders by a MessageRow column (or "seq", emit order; the default) by value, over the
    whole signal, `descending` or not (empty values last either way); `search` keeps messages
    whose payload, key or last failure message contains it, case-insensitively, from the text index
    (engine/ops/indexed_search.py). Where that index cannot answer (none, still filling, a text
    under three characters) a searched page reads a bounded stretch of the signal: it may hold
    fewer than `limit` rows with `cut` set and a `next_cursor` that searches on. Pass
    `cursor=page.next_cursor` for the next page.
    """
    return await store.read(
        lambda conn: queries.message_page(
            conn, signal, status, key, limit, before_seq, search=search, sort=sort, descending=descending, cursor=cursor
        )
    )


async def messages(
    store: Store,
    signal: str,
    status: str | None = None,
    key: str | None = None,
    limit: int = 50,
    before_seq: int | None = None,
    *,
    search: str | None = None,
) -> list[MessageRow]:
    """Messages of `signal`, newest first (paged by seq: rows strictly below `before_seq`); with
    `search`, up to `limit` matches from the whole signal (every searched page, walked in turn)."""
    if not search:
        return (await message_page(store, signal, status, key, limit, before_seq)).items
    found: list[MessageRow] = []
    cursor = None
    while True:
        page = await message_page(
            store, signal, status, key, limit - len(found), before_seq, search=search, cursor=cursor
        )
        found += page.items
        before_seq, cursor = None, page.next_cursor
        if cursor is None or len(found) >= limit:
            return found


async def show(store: Store, message_id: str, *, orphan_after_ms: int = ORPHAN_AFTER_MS) -> MessageDetail:
    """One message: payload, every failure (replay markers too), lease (orphaned when its holder has
    not been seen for `orphan_after_ms`), what blocks it, its trace."""
    return await store.read(lambda conn: queries.show(conn, message_id, orphan_after_ms))


async def workers(
    store: Store, *, seen_within_ms: int = SEEN_WITHIN_MS, orphan_after_ms: int = ORPHAN_AFTER_MS
) -> list[WorkerInfo]:
    """Workers seen in the last hour (by default), each with its leases and how many are orphaned
    (its holder not seen for `orphan_after_ms`), then lease holders with no record (state unknown)."""
    return await store.read(lambda conn: _workers.workers(conn, seen_within_ms, orphan_after_ms))


async def doctor(
    store: Store, *, orphan_after_ms: int = ORPHAN_AFTER_MS, due_after_ms: int = DUE_AFTER_MS
) -> list[DoctorCheck]:
    """The store's health, one `DoctorCheck` per check, each detail naming what to do."""
    return await store.read(lambda conn: _doctor.checks(conn, orphan_after_ms, due_after_ms))


def doctor_schema_too_new(error: Exception) -> list[DoctorCheck]:
    """Doctor's report on a store this okengine cannot open: its schema is newer."""
    return [_doctor.too_new(error)]


async def why(store: Store, message_id: str) -> Why:
    """One verdict on why `message_id` is (not) running: delivered, dead, running, orphaned, paused,
    no_worker, blocked_by_key, not_due or due (engine/ops/verdict.py: what each means and which wins
    when several hold), with one line to act on. UnknownMessage (a LookupError) for an unknown id."""
    return verdict.decide(await store.read(lambda conn: _why.snapshot(conn, message_id)))


async def keys(
    store: Store, signal: str, blocked_only: bool = False, *, limit: int = 100, after: str | None = None
) -> KeyPage:
    """Keys of `signal` with unfinished messages, each with its head (the oldest unfinished message
    of the key), the head's failed attempts and last failure, and how many wait behind it; in key
    order, `limit` a page (`after=page.next_after` for the next). `blocked_only`: keys whose head
    failed at least once with messages waiting (doctor's `blocked_keys` warns from 3 failures)."""
    return await store.read(lambda conn: keyheads.keys(conn, signal, blocked_only, limit, after))


async def dead_letters(store: Store, signal: str, limit: int | None = None) -> list[DeadLetter]:
    """Dead messages of `signal`, newest first, each with every failure."""
    return await store.read(lambda conn: queries.dead_letters(conn, signal, limit))


async def failures(store: Store, signal: str) -> list[FailureGroup]:
    """Dead and failing messages grouped by latest failure code and message, newest first."""
    return await store.read(lambda conn: queries.failures(conn, signal))


async def audit(store: Store, limit: int = 100, action: str | None = None) -> list[AuditEntry]:
    """The operator audit log, newest first."""
    return await store.read(lambda conn: queries.audit(conn, limit, action))


async def trace(store: Store, run_id: str) -> RunNode:
    """The run tree `run_id` belongs to, from its root down to every descendant."""
    return await store.read(lambda conn: _trace.trace(conn, run_id))


async def bindings(store: Store) -> list[BindingInfo]:
    """Every recorded binding (retired ones too): signal, kind, flow, last_seen, active."""
    rows = await store.read(registry.listing)
    return [
        BindingInfo(signal=r.signal, kind=r.kind, flow=r.flow, last_seen=r.last_seen, active=r.active) for r in rows
    ]


async def clocks(store: Store) -> list[ClockInfo]:
    """Every clock trigger apps recorded: flow, spec, tz, next_at, last_at, last_id, last_status, paused."""
    return await store.read(_clocks.clocks)


async def binding(store: Store, signal: str, flow: str) -> BindingInfo:
    """One recorded binding; UnknownSignal / UnknownFlow (naming the known ones) when there is none."""
    await store.read(lambda conn: unbinding.binding_kind(conn, signal, flow))
    return next(b for b in await bindings(store) if (b.signal, b.flow) == (signal, flow))


# -- writes -------------------------------------------------------------------------------------
def _parse_rate(rate: float | None) -> float | None:
    if rate is None:
        return None
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"rate must be a positive number of messages per second, got {rate!r}")
    return float(rate)


async def replay(
    store: Store,
    signal: str,
    ids: Iterable[str] | None = None,
    *,
    all: bool = False,
    code: str | None = None,
    match: str | None = None,
    key: str | None = None,
    older_than_ms: int | None = None,
    text: str | None = None,
    dry_run: bool = False,
    payload: Any = UNCHANGED,
    reason: str | None = None,
    actor: str | None = None,
    rate: float | None = None,
    warn: Callable[[str], None] | None = None,
    source: str | None = None,
) -> Replayed | ReplayPreview:
    """Requeue dead letters of `signal`: dead → pending, same id and seq, attempts 0.

    Select by `ids`, or every dead letter with `all=True`; `code`, `match` (substring of the last
    failure message, case-insensitive), `key`, `older_than_ms` (dead for at least that long) and `text`
    (the console's `/` filter: in the id, key, or last failure's code or message; '!' inverts) narrow
    either. Without `rate` the whole replay is ONE transaction: status changes, "replayed" markers and
    the audit row commit together or not at all. With `rate` (messages per second) it runs in chunks
    of about one second's worth, each chunk atomic and audited, with pauses between: the whole is then
    NOT atomic (an interruption leaves the earlier chunks replayed). `payload` replaces the payload of
    exactly one named message (checked by the schema when the signal is declared in this process, else
    by the JSON Schema its app recorded at boot; with neither, `warn` gets a notice that it was stored
    unchecked, or a `UnvalidatedPayload` warning is issued). `dry_run` changes nothing and returns the
    count and up to 20 ids. Named ids that are no longer dead are skipped (a concurrent replay took
    them). `source` (every write here takes it) is where the write came from, recorded in the audit
    row: `okconsole web` passes the browser's address; None for the CLI and scripts.
    """
    id_list = _replay_ids(ids, all)
    _check_age(older_than_ms)
    pace = _parse_rate(rate)
    payload_text = None
    unchecked: str | None = None
    if payload is not UNCHANGED:
        if id_list is None or len(id_list) != 1:
            raise ValueError("a replacement payload applies to exactly one message: name one id")
        unchecked = await _check_payload(store, signal, payload)
        payload_text = repair.encode_payload(signal, payload)
    sel = repair.Selection(signal, id_list, code, match, key, older_than_ms, text)  # in the fields' order
    if dry_run:
        return await store.read(lambda conn: repair.preview(conn, sel))
    replay_chunk = functools.partial(
        repair.replay, sel=sel, actor=actor or default_actor(), reason=reason, payload_text=payload_text, source=source
    )
    if pace is None:  # one transaction
        done = (await store.write(replay_chunk)).ids
        if done:
            wake_local(store.url)
    else:
        done = await _replay_paced(store, sel, pace, replay_chunk)
    if done and unchecked is not None:
        _warn(unchecked, warn)
    return Replayed(replayed=len(done), ids=done)


def _replay_ids(ids: Iterable[str] | None, all: bool) -> tuple[str, ...] | None:
    """The named ids, once each and in order; None for `all=True` (refusing both or neither)."""
    if isinstance(ids, str):
        ids = [ids]  # one id, not its characters
    id_list = None if ids is None else tuple(dict.fromkeys(ids))
    if all and id_list:
        raise ValueError("name message ids or pass all=True, not both")
    if not all and not id_list:
        raise ValueError("name the dead letters to replay (ids), or pass all=True")
    return None if all else id_list


def _check_age(older_than_ms: int | None) -> None:
    if older_than_ms is not None and (
        isinstance(older_than_ms, bool) or not isinstance(older_than_ms, int) or older_than_ms < 0
    ):
        raise ValueError(f"older_than_ms must be an int ≥ 0, got {older_than_ms!r}")


async def _replay_paced(
    store: Store, sel: repair.Selection, pace: float, replay_chunk: Callable[..., repair.ReplayBatch]
) -> list[str]:
    """A replay in chunks of about one second's worth, each its own transaction, paced to `pace` a second."""
    seqs = await store.read(lambda conn: repair.candidate_seqs(conn, sel))
    size = max(1, int(pace))
    done: list[str] = []
    started = time.monotonic()
    for start in range(0, len(seqs), size):
        chunk = seqs[start : start + size]
        batch = await store.write(functools.partial(replay_chunk, seqs=chunk, verify=False))
        if batch.ids:
            wake_local(store.url)
        done += batch.ids
        wait = started + (start + len(chunk)) / pace - time.monotonic()
        if wait > 0 and start + size < len(seqs):
            await asyncio.sleep(wait)
    return done


async def _check_payload(store: Store, signal: str, value: Any) -> str | None:
    """Refuse (OKE1250) a replacement the recorded JSON Schema rejects; the notice to give when
    nothing could check it. A signal declared in this process is checked by its own schema."""
    if declared(signal) is not None:
        return None
    recorded, schema_text = await store.read(lambda conn: registry.json_schema_of(conn, signal))
    if schema_text is not None:
        json_schemas.check(signal, schema_text, value)
        return None
    why = "its schema is a plain callable, which has no JSON Schema" if recorded else "no app recorded its declaration"
    return f'"{signal}": the replacement payload was stored without being validated ({why})'


def _warn(text: str, warn: Callable[[str], None] | None) -> None:
    if warn is not None:
        warn(text)
    else:
        warnings.warn(text, UnvalidatedPayload, stacklevel=3)


async def purge(
    store: Store,
    signal: str,
    status: str,
    older_than_ms: int | None = None,
    *,
    actor: str | None = None,
    reason: str | None = None,
    dry_run: bool = False,
    ids: Iterable[str] | None = None,
    source: str | None = None,
    text: str | None = None,
) -> Purged | PurgePreview:
    """Delete finished (`delivered` or `dead`) messages of `signal`, finished at least
    `older_than_ms` ago if given (and among `ids` if given, and matching `text` if given: the
    console's `/` filter, as for replay), with their failure and step rows: one transaction, audited."""
    id_list = None if ids is None else ([ids] if isinstance(ids, str) else list(dict.fromkeys(ids)))
    _check_age(older_than_ms)
    if dry_run:
        return await store.read(lambda conn: repair.purge_preview(conn, signal, status, older_than_ms, id_list, text))
    actor = actor or default_actor()
    return await store.write(
        lambda conn: repair.purge(
            conn, signal, status, older_than_ms, actor=actor, reason=reason, ids=id_list, source=source, text=text
        )
    )


async def unbind(
    store: Store,
    signal: str,
    flow: str,
    *,
    actor: str | None = None,
    reason: str | None = None,
    source: str | None = None,
) -> Unbound:
    """Retire one binding at once: no new copies for it, and its pending broadcast copies end
    `dead` with failure code "Unbound" (replayable), audited as action "unbind".

    An emitter may have read the bindings up to BINDINGS_CACHE_S before the retirement: after
    that long, the copies it enqueued meanwhile are ended too (a second transaction, audited)."""
    actor = actor or default_actor()
    who = {"actor": actor, "reason": reason, "source": source}
    kind, ids = await store.write(lambda conn: unbinding.retire(conn, signal, flow, **who))
    if kind == "broadcast":
        await asyncio.sleep(registry.BINDINGS_CACHE_S + 0.5)
        ids += await store.write(lambda conn: unbinding.sweep(conn, signal, flow, kind, **who))
    return Unbound(signal=signal, flow=flow, dead=len(ids), ids=ids)


# -- operator controls -------------------------------------------------------------------------
def _named(ids: Iterable[str] | None, what: str) -> tuple[str, ...]:
    """The named ids, once each and in order (one id given as a str is one id); refuse none."""
    if isinstance(ids, str):
        ids = [ids]
    named = tuple(dict.fromkeys(ids or ()))
    if not named:
        raise ValueError(f"name the messages to {what} (ids)")
    return named


async def pause(
    store: Store, signal: str, *, actor: str | None = None, reason: str | None = None, source: str | None = None
) -> PauseState:
    """Pause a once or broadcast signal: from at most 1 s on no process sharing the store claims its
    messages (emits are still stored, running handlers finish); durable until `resume`. Audited.
    NotPausable (a ValueError) for a live signal; UnknownSignal for a name the store does not know."""
    actor = actor or default_actor()
    return await store.write(lambda conn: pausing.pause(conn, signal, actor=actor, reason=reason, source=source))


async def resume(
    store: Store, signal: str, *, actor: str | None = None, reason: str | None = None, source: str | None = None
) -> PauseState:
    """Lift a pause: workers in every process take the signal's messages again (woken at commit). Audited."""
    actor = actor or default_actor()
    state = await store.write(lambda conn: pausing.resume(conn, signal, actor=actor, reason=reason, source=source))
    if state.changed:
        wake_local(store.url)
    return state


def check_limit(concurrency: int | str | None, rate: str | None, *, reset: bool = False) -> Override | None:
    """The override `limit` would write (None: a reset); ValueError for a bad value or mix."""
    if reset and (concurrency is not None or rate is not None):
        raise ValueError("--reset restores the declared limits: give it alone")
    return None if reset else flow_limits.check_override(concurrency, rate)


async def limit(
    store: Store,
    signal: str,
    *,
    concurrency: int | str | None = None,
    rate: str | None = None,
    reset: bool = False,
    actor: str | None = None,
    reason: str | None = None,
    source: str | None = None,
) -> LimitState:
    """Override `signal`'s flow limits cluster-wide (each process's workers follow from at most 1 s
    later) until `reset=True` restores the declared ones. `concurrency`: an int ≥ 1 or "none";
    `rate`: "N/duration" or "none"; a limit not given keeps its override (or declaration). Audited.
    ValueError for a bad value or a live signal (nothing changes); UnknownSignal for an unknown name."""
    override = check_limit(concurrency, rate, reset=reset)
    actor = actor or default_actor()
    state = await store.write(
        lambda conn: flow_limits.set_limit(conn, signal, override, actor=actor, reason=reason, source=source)
    )
    if state.changed:
        wake_local(store.url)  # a raised or lifted limit: this process's idle workers claim at once
    return state


async def cancel(
    store: Store,
    signal: str,
    ids: Iterable[str] | None = None,
    *,
    all: bool = False,
    key: str | None = None,
    actor: str | None = None,
    reason: str | None = None,
    dry_run: bool = False,
    source: str | None = None,
) -> Cancelled | CancelPreview:
    """End pending messages (due or not yet due) and inflight ones whose lease expired `dead`, each
    with a failure {code "Cancelled", message: reason, attempt}: kept and replayable. A message under
    a live lease is asked to stop: its holder cancels the handler's task within about 2 s and ends it
    the same way; until then it is reported under `requested` (a holder that is gone leaves it to
    the lease: a cancel after that ends it). Name `ids`, or pass `all=True` (`key` narrows either).
    One transaction, audited; `dry_run` changes nothing."""
    named = None if all else _named(ids, "cancel")
    if all and ids:
        raise ValueError("name message ids or pass all=True, not both")
    if dry_run:
        return await store.read(lambda conn: controls.cancel_preview(conn, signal, named, key=key))
    actor = actor or default_actor()
    done = await store.write(
        lambda conn: controls.cancel(conn, signal, named, key=key, actor=actor, reason=reason, source=source)
    )
    if done.requested:
        wake_local(store.url, CANCELS)  # this process's cancel watchers (others: NOTIFY, or their poll)
    return done


async def delete(
    store: Store,
    signal: str,
    ids: Iterable[str],
    *,
    actor: str | None = None,
    reason: str | None = None,
    source: str | None = None,
) -> Deleted:
    """Delete named finished (delivered / dead) messages with their failure and step rows; others are
    skipped. One transaction, audited; the per-status counters follow (triggers)."""
    named = _named(ids, "delete")
    actor = actor or default_actor()
    return await store.write(
        lambda conn: controls.delete_finished(conn, signal, named, actor=actor, reason=reason, source=source)
    )


async def retry(
    store: Store,
    signal: str,
    ids: Iterable[str],
    *,
    actor: str | None = None,
    reason: str | None = None,
    source: str | None = None,
) -> Retried:
    """A named pending message waiting for its run_at (a delay or a back-off) becomes due now; others
    are skipped (a dead letter is requeued by `replay`). One transaction, audited."""
    named = _named(ids, "retry")
    actor = actor or default_actor()
    done = await store.write(
        lambda conn: controls.retry_now(conn, signal, named, actor=actor, reason=reason, source=source)
    )
    if done.ids:
        wake_local(store.url)
    return done


# -- what the console needs from the store, so it imports no engine.store module ----------------
from ..store import make_store, resolve_url  # noqa: E402
from ..store.outage import is_outage  # noqa: E402
from .tapes import TapeEntry, TapeInfo, live_signals, tape_after, tape_info, tape_last  # noqa: E402

__all__ += [
    "Store",
    "TapeEntry",
    "TapeInfo",
    "is_outage",
    "live_signals",
    "open_store",
    "resolve_url",
    "tape_after",
    "tape_info",
    "tape_last",
]


async def open_store(database_url: str | None = None) -> Store:
    """The store at `database_url` (else env OKE_DATABASE_URL, else the default), opened: the caller closes it."""
    store = make_store(database_url)
    await store.open()
    return store
