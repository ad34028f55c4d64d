"""Health marks: the short words the overview and `okconsole stats` put beside a signal that needs a look.

One word per reason, the worst first: `dead+12` (dead letters added in the last 15 min), `fail 35%`
(failed and dead attempts over every finished one in the last 5 min, at 20 % or more), `orphaned 3`
(leases held by a worker not seen for 30 s), `lag 7m` (the oldest due message waited over 5 min),
`limit 5/5` or `rate 100/1m` (due messages wait behind a flow limit), `paused`. No word: nothing
needs a look. The overview refreshes every second, so the marks cost a
bounded read whatever the store's size:
- the windows come from the per-minute history through `signal_checks.window_sums`, the read doctor's
  `dead_letters` and `failure_rate` make (one statement, its (signal, minute) key: at most 16 rows
  a signal);
- the orphans from the inflight rows of the signals through the (signal, status, seq) index (one
  statement, as many rows as there are leases), then their holders by the workers' key;
- lag and paused are already in the stats row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Select, func, select

from ..ids import now_ms
from ..store import schema
from ..store.base import lease_clock_ms
from ..store.workers import live_holders
from .records import SignalStats
from .signal_checks import DEAD_WINDOW_MS, FAILURE_RATE, FAILURE_WINDOW_MS, WindowSums, window_sums
from .workers import ORPHAN_AFTER_MS

LAG_LIMIT_MS = 5 * 60_000  # a due message waiting longer than this marks its signal
m = schema.messages


def leases_statement(signals: Sequence[str]) -> Select[Any]:
    """Inflight messages per (signal, holder) of `signals`: the (signal, status, seq) index reads
    only the inflight rows."""
    return (
        select(m.c.signal, m.c.locked_by, func.count())
        .where(m.c.signal.in_(sorted(set(signals))), m.c.status == "inflight", m.c.locked_by.is_not(None))
        .group_by(m.c.signal, m.c.locked_by)
    )


def orphaned_by_signal(
    conn: Connection, signals: Sequence[str], orphan_after_ms: int = ORPHAN_AFTER_MS
) -> dict[str, int]:
    """How many leases of each signal are held by a worker not seen for `orphan_after_ms` (or
    stopped, or never recorded), judged by the store's lease clock as `okconsole workers` does."""
    if not signals:
        return {}
    held = [(str(signal), str(holder), int(n)) for signal, holder, n in conn.execute(leases_statement(signals))]
    alive = live_holders(conn, {holder for _, holder, _ in held}, lease_clock_ms(conn) - orphan_after_ms)
    out: dict[str, int] = {}
    for signal, holder, n in held:
        if holder not in alive:
            out[signal] = out.get(signal, 0) + n
    return out


def short_age(ms: int) -> str:
    """A wait in one short word: 7m, 3h, 2d."""
    if ms < 3_600_000:
        return f"{ms // 60_000}m"
    if ms < 172_800_000:
        return f"{ms // 3_600_000}h"
    return f"{ms // 86_400_000}d"


def marks(row: SignalStats, dead: WindowSums, recent: WindowSums, orphaned: int) -> list[str]:
    """The words for one queue signal, the worst first: lost messages, then failing work, stuck
    leases, a backlog, then a flow limit and a pause an operator chose."""
    words = []
    if dead.dead:
        words.append(f"dead+{dead.dead}")
    if recent.finished and recent.failure_share >= FAILURE_RATE:
        words.append(f"fail {recent.failure_share:.0%}")
    if orphaned:
        words.append(f"orphaned {orphaned}")
    if row.lag_ms is not None and row.lag_ms > LAG_LIMIT_MS:
        words.append(f"lag {short_age(row.lag_ms)}")
    if row.held_by == "concurrency":
        words.append(f"limit {row.running}/{row.concurrency}")
    elif row.held_by == "rate":
        words.append(f"rate {row.rate}")
    if row.paused:
        words.append("paused")
    return words


def with_health(conn: Connection, rows: list[SignalStats]) -> list[SignalStats]:
    """`rows` with each queue signal's `health` marks (a live signal has none: no attempts, no leases)."""
    queues = [r.signal for r in rows if r.kind != "live"]
    now = now_ms()
    dead = window_sums(conn, queues, now - DEAD_WINDOW_MS)
    recent = window_sums(conn, queues, now - FAILURE_WINDOW_MS)
    orphaned = orphaned_by_signal(conn, queues)
    return [
        dataclasses.replace(r, health=marks(r, dead[r.signal], recent[r.signal], orphaned.get(r.signal, 0)))
        if r.kind != "live"
        else r
        for r in rows
    ]
