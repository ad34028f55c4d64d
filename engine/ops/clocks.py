"""`okconsole clocks`: each clock trigger apps declared, its next tick, and its last tick's outcome.

The clocks are what apps recorded at boot (oke_clocks); the next tick is computed here from the
recorded schedule (the same function every app process runs), the last one read off the clock
signal's newest message, and `paused` off the signal's pause.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import Connection, select

from ..clocks import from_record
from ..ids import now_ms
from ..store import schema
from ..store.pauses import paused_signals

m = schema.messages


@dataclass(frozen=True)
class ClockInfo:
    """One clock: `next_at` / `last_at` are epoch ms of ticks (null: none yet, or unreadable);
    `last_id` / `last_status` the newest tick message's (null before the first tick)."""

    flow: str
    signal: str
    spec: str
    tz: str
    catch_up: bool
    next_at: int | None
    last_at: int | None
    last_id: str | None
    last_status: str | None
    paused: bool


def clocks(conn: Connection) -> list[ClockInfo]:
    """Every recorded clock, by flow name."""
    c = schema.clocks
    paused = paused_signals(conn)
    now = now_ms()
    found = []
    for row in conn.execute(select(c).order_by(c.c.flow)).all():
        schedule = from_record(row.spec, row.tz)
        last = conn.execute(
            select(m.c.id, m.c.status, m.c.payload).where(m.c.signal == row.signal).order_by(m.c.id.desc()).limit(1)
        ).first()
        found.append(
            ClockInfo(
                flow=row.flow,
                signal=row.signal,
                spec=row.spec,
                tz=row.tz,
                catch_up=bool(row.catch_up),
                next_at=None if schedule is None else schedule.next_after(now),
                last_at=None if last is None else _tick_at(last.payload),
                last_id=None if last is None else last.id,
                last_status=None if last is None else last.status,
                paused=row.signal in paused,
            )
        )
    return found


def _tick_at(payload: str) -> int | None:
    """A tick message's `at`; None for a payload that is not a tick's (a replacement, say)."""
    try:
        at = json.loads(payload).get("at")
    except (ValueError, AttributeError):
        return None
    return at if isinstance(at, int) and not isinstance(at, bool) else None
