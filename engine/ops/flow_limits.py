"""Flow limits for the operator: what is in force on a signal, whether it holds messages back
(stats, the overview's health mark, `why`), and `limit`, the audited override.

The limits in force are the app's declaration (recorded at boot in oke_signals) under an
operator's override (oke_limits, engine/store/limits.py). Workers of every process read the
overrides at least every 0.5 s (on PostgreSQL also at once, on the pause channel's NOTIFY), so an
override is in force cluster-wide from at most a second after it commits (engine/worker/limiting.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sqlalchemy import Connection, func, or_, select

from ..durations import parse_rate
from ..store import limits, schema
from ..store.base import lease_clock_ms
from ..store.limits import NONE, Limits, Override
from ..store.sql.gates import SlidingWindowLog, expand
from ..store.sql.notify import notify_pause
from . import queries
from .pausing import queues_of
from .records import SignalStats
from .repair import default_actor, write_audit

m = schema.messages
r = schema.rate_starts
LIMITABLE = ("once", "broadcast", "unknown")


@dataclass(frozen=True)
class LimitHold:
    """A limit holding a due message of `queue` back: which one, its figures, and until when the
    next start fits (a rate; None for a concurrency limit: until one of the running ends)."""

    limit: str  # "concurrency" or "rate"
    queue: str
    running: int
    concurrency: int | None
    rate: str | None
    until: int | None


@dataclass(frozen=True)
class LimitState:
    """After `limit`: the limits now in force on `signal`, whether an override sets them, and
    whether this call changed anything."""

    signal: str
    concurrency: int | None
    rate: str | None
    overridden: bool
    changed: bool


def running_on(conn: Connection, signal: str, now: int) -> dict[str, int]:
    """Inflight messages of `signal` under a live lease, by queue (the (signal, status, seq) index)."""
    rows = conn.execute(
        select(m.c.queue, func.count())
        .where(m.c.signal == signal, m.c.status == "inflight", m.c.lease_expires_at >= now)
        .group_by(m.c.queue)
    )
    return {str(q): int(n) for q, n in rows}


def _due_waiting(conn: Connection, signal: str, queue: str, now: int) -> bool:
    due = or_(m.c.run_at.is_(None), m.c.run_at <= now)
    found = conn.execute(
        select(m.c.seq).where(m.c.signal == signal, m.c.status == "pending", m.c.queue == queue, due).limit(1)
    ).first()
    return found is not None


def _rate_until(conn: Connection, queue: str, rate: str | None, now: int) -> int | None:
    """When the next start of `queue` fits under `rate`, if its window is full now (else None)."""
    parts = None if rate is None else parse_rate(rate)
    if parts is None:
        return None
    count, window_ms = parts
    rows = conn.execute(select(r.c.at, r.c.n).where(r.c.queue == queue, r.c.at > now - window_ms))
    starts = expand([(int(at), int(n)) for at, n in rows])
    fits = SlidingWindowLog(count, window_ms, starts).fits_at(now)
    return fits if fits > now else None


def holds(conn: Connection, signal: str, in_force: Limits, now: int, queue: str | None = None) -> list[LimitHold]:
    """The limits holding due messages of `signal` back now (of one `queue` when given)."""
    if in_force.concurrency is None and in_force.rate is None:
        return []
    running = running_on(conn, signal, now)
    out = []
    for q in [queue] if queue is not None else queues_of(conn, signal):
        busy = running.get(q, 0)
        full = in_force.concurrency is not None and busy >= in_force.concurrency
        until = None if full else _rate_until(conn, q, in_force.rate, now)
        if (full or until is not None) and _due_waiting(conn, signal, q, now):
            kind = "concurrency" if full else "rate"
            out.append(LimitHold(kind, q, busy, in_force.concurrency, in_force.rate, until))
    return out


def with_limits(conn: Connection, rows: list[SignalStats]) -> list[SignalStats]:
    """`rows` with each limited signal's `concurrency`, `rate`, `running` and `held_by` (the limit
    that holds due messages back now, if one does); a few point reads per limited signal only."""
    found = limits.all_in_force(conn)
    now = lease_clock_ms(conn)
    out = []
    for row in rows:
        in_force = found.get(row.signal)
        if in_force is None or row.kind == "live":
            out.append(row)
            continue
        held = holds(conn, row.signal, in_force, now) if row.pending else []
        out.append(
            dataclasses.replace(
                row,
                concurrency=in_force.concurrency,
                rate=in_force.rate,
                running=sum(running_on(conn, row.signal, now).values()),
                held_by=held[0].limit if held else None,
            )
        )
    return out


def _setting(override: Override) -> str:
    parts = []
    if override.concurrency is not None:
        parts.append(f"concurrency {override.concurrency or NONE}")
    if override.rate is not None:
        parts.append(f"rate {override.rate}")
    return ", ".join(parts)


def check_override(concurrency: object, rate: object) -> Override:
    """An override from the operator's words: an int ≥ 1 or "none" for concurrency, "N/duration" or
    "none" for rate (None: that limit is left as it is). ValueError for anything else."""
    conc: int | None = None
    if concurrency is not None:
        if concurrency == NONE:
            conc = 0
        elif isinstance(concurrency, str) and concurrency.isdigit() and int(concurrency) >= 1:
            conc = int(concurrency)
        elif isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency >= 1:
            conc = concurrency
        else:
            raise ValueError(f"concurrency must be an integer ≥ 1 or 'none', got {concurrency!r}")
    if rate is not None and rate != NONE and parse_rate(rate) is None:
        raise ValueError(f"rate must be 'N/duration' (such as 100/1m or 5/s) or 'none', got {rate!r}")
    if conc is None and rate is None:
        raise ValueError("give --concurrency, --rate or --reset")
    return Override(conc, rate if isinstance(rate, str) else None)


def set_limit(
    conn: Connection,
    signal: str,
    override: Override | None,
    *,
    actor: str | None,
    reason: str | None,
    source: str | None = None,
) -> LimitState:
    """Override `signal`'s limits (None: reset to the declared ones), audited as "limit", and announce
    it to the workers (NOTIFY on the pause channel on PostgreSQL). A reset with no override is a no-op."""
    queries.require_signal(conn, signal)
    kind = queries.signal_kind(conn, signal)
    if kind not in LIMITABLE:
        raise ValueError(f'signal "{signal}" is {kind}: only once and broadcast signals have flow limits')
    actor = actor or default_actor()
    now = lease_clock_ms(conn)
    if override is None:
        changed = limits.reset(conn, signal)
        setting = "reset to the declared limits"
    else:
        limits.set_override(conn, signal, override, at=now, actor=actor, reason=reason)
        changed, setting = True, _setting(override)
    if changed:
        note = f"{setting}: {reason}" if reason else setting
        write_audit(conn, "limit", actor, signal, [], note, at=now, source=source)
        notify_pause(conn, signal)
    in_force = limits.limits_of(conn, signal)
    return LimitState(signal, in_force.concurrency, in_force.rate, in_force.overridden, changed)
