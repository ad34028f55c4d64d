"""Doctor's per-signal checks: dead letters piling up, a high failure rate, keys blocked by a failing head.

They must stay cheap on a store of millions of messages, so none scans the messages:
- `dead_letters` and `failure_rate` read the per-minute history (store/history.py: one row per
  signal and minute, read by its (signal, minute) key), so their windows are whole minutes: the
  current one and those before it back to the window's start (up to a minute more than asked).
  `window_sums` is that read, for every signal at once; the overview's health marks
  (engine/ops/health.py) use it too, so doctor and the console judge alike.
  The top failure code is read from the newest DEAD_SAMPLE dead letters of the signal (the
  (signal, status, seq) index) and their last failure row (the (message_id, id) index).
- `blocked_keys` starts from the newest FAILURE_SAMPLE failure rows (the failures' primary key),
  so it finds the heads that failed recently: a head whose failures are all older than that sample
  is not reported. Each candidate's place and the count behind it come from the partial index of
  ready keyed rows (queue, key, seq).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Select, func, select

from ..ids import now_ms
from ..store import schema
from ..store.history import minute_of
from . import keyheads, queries
from .records import DoctorCheck

DEAD_WINDOW_MS = 15 * 60_000
FAILURE_WINDOW_MS = 5 * 60_000
FAILURE_RATE = 0.20  # failed + dead attempts over all finished attempts
BLOCKED_ATTEMPTS = 3  # a key's head that failed this many attempts blocks the key
DEAD_SAMPLE = 200
FAILURE_SAMPLE = 1000
SHOWN = 5

m = schema.messages
f = schema.failures
h = schema.history
READY = ("pending", "inflight")


def _listed(items: Sequence[str]) -> str:
    more = f" … and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return "; ".join(items[:SHOWN]) + more


@dataclass(frozen=True)
class WindowSums:
    """A signal's finished attempts in a window: delivered, failed (retried) and dead."""

    delivered: int = 0
    failed: int = 0
    dead: int = 0

    @property
    def finished(self) -> int:
        return self.delivered + self.failed + self.dead

    @property
    def failure_share(self) -> float:
        """Failed and dead attempts over every finished one (0 with none finished)."""
        return (self.failed + self.dead) / self.finished if self.finished else 0.0


def sums_statement(signals: Sequence[str], since_ms: int) -> Select[Any]:
    """Per signal of `signals`: its history summed over the minutes from the one holding `since_ms`
    on. The (signal, minute) key bounds it to those minutes of those signals."""
    return (
        select(h.c.signal, func.sum(h.c.delivered), func.sum(h.c.failed), func.sum(h.c.dead))
        .where(h.c.signal.in_(sorted(set(signals))), h.c.minute >= minute_of(since_ms))
        .group_by(h.c.signal)
    )


def window_sums(conn: Connection, signals: Sequence[str], since_ms: int) -> dict[str, WindowSums]:
    """`WindowSums` of each of `signals` since `since_ms` (a signal with no history reads zeros)."""
    found = (
        {
            str(r[0]): WindowSums(int(r[1] or 0), int(r[2] or 0), int(r[3] or 0))
            for r in conn.execute(sums_statement(signals, since_ms))
        }
        if signals
        else {}
    )
    return {signal: found.get(signal, WindowSums()) for signal in signals}


def _top_code(conn: Connection, signal: str, since_ms: int) -> str | None:
    """The commonest last failure code among the newest dead letters that died since `since_ms`."""
    last_code = (
        select(f.c.code)
        .where(f.c.message_id == m.c.id, f.c.kind == "failure")
        .order_by(f.c.id.desc())
        .limit(1)
        .correlate(m)
        .scalar_subquery()
    )
    rows = conn.execute(
        select(func.coalesce(m.c.finished_at, m.c.updated_at), last_code)
        .where(m.c.signal == signal, m.c.status == "dead")
        .order_by(m.c.seq.desc())
        .limit(DEAD_SAMPLE)
    ).all()
    codes = Counter(str(code) for at, code in rows if code is not None and at is not None and int(at) >= since_ms)
    return codes.most_common(1)[0][0] if codes else None


def dead_letters(conn: Connection, window_ms: int = DEAD_WINDOW_MS) -> DoctorCheck:
    since = now_ms() - window_ms
    found = []
    for signal, sums in window_sums(conn, queries.known_signals(conn), since).items():
        if sums.dead:
            code = _top_code(conn, signal, since)
            rate = sums.dead / (window_ms / 60_000)
            found.append(
                f"{signal}: {sums.dead} new in {window_ms // 60_000} min ({rate:.1f}/min), top code {code or '-'}"
            )
    if not found:
        return DoctorCheck("dead_letters", "ok", f"no dead letter added in the last {window_ms // 60_000} min")
    first = found[0].split(":", 1)[0]
    return DoctorCheck(
        "dead_letters",
        "warn",
        f"{_listed(found)}. See why with okconsole failures {first}; once fixed, okconsole replay {first} --all.",
    )


def failure_rate(conn: Connection, window_ms: int = FAILURE_WINDOW_MS, limit: float = FAILURE_RATE) -> DoctorCheck:
    since = now_ms() - window_ms
    high = [
        f"{signal}: {sums.failure_share:.0%} of {sums.finished} attempts failed"
        for signal, sums in window_sums(conn, queries.known_signals(conn), since).items()
        if sums.finished and sums.failure_share >= limit
    ]
    minutes = window_ms // 60_000
    if not high:
        return DoctorCheck("failure_rate", "ok", f"under {limit:.0%} of attempts failed in the last {minutes} min")
    first = high[0].split(":", 1)[0]
    return DoctorCheck(
        "failure_rate",
        "warn",
        f"{_listed(high)} in the last {minutes} min. See what fails with okconsole failures {first}.",
    )


def _blocked_heads(conn: Connection, attempts: int) -> list[tuple[str, str, str, int, int]]:
    """(signal, key, head id, head attempts, waiting behind) of each key whose head failed
    `attempts` times or more, among the messages of the newest failures."""
    recent = select(f.c.message_id).where(f.c.kind == "failure").order_by(f.c.id.desc()).limit(FAILURE_SAMPLE)
    ids = sorted({r[0] for r in conn.execute(recent)})
    heads = conn.execute(
        select(m.c.id, m.c.signal, m.c.queue, m.c.key, m.c.seq, m.c.attempts, m.c.status)
        .where(m.c.id.in_(ids), m.c.status.in_(READY), m.c.key.is_not(None), m.c.attempts >= attempts)
        .order_by(m.c.seq)
    ).all()
    blocked = []
    for head in heads:
        failed = keyheads.failed_attempts(head.status, head.attempts)
        if failed < attempts or not keyheads.is_head(conn, head.queue, head.key, head.seq):
            continue  # its current attempt has not failed (yet), or it waits behind another
        waiting = keyheads.waiting_behind(conn, head.queue, head.key, head.seq)
        if waiting:
            blocked.append((head.signal, head.key, head.id, failed, waiting))
    return blocked


def blocked_keys(conn: Connection, attempts: int = BLOCKED_ATTEMPTS) -> DoctorCheck:
    blocked = _blocked_heads(conn, attempts)
    if not blocked:
        return DoctorCheck("blocked_keys", "ok", f"no key waits behind a head that failed {attempts}+ attempts")
    items = [
        f"{signal} key {key!r}: head {head} failed {n} attempts, {waiting} waiting"
        for signal, key, head, n, waiting in blocked
    ]
    return DoctorCheck(
        "blocked_keys",
        "warn",
        f"{_listed(items)}. Messages of a key run in order, so those wait until the head is delivered or "
        f"ends dead: see okconsole show {blocked[0][2]}; okconsole cancel {blocked[0][0]} {blocked[0][2]} lets the key "
        f"move on; okconsole keys {blocked[0][0]} --blocked lists every such key.",
    )
