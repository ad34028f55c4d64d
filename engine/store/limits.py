"""Flow limits as recorded: what each app declared (oke_signals) and an operator's overrides
(oke_limits), and the limits in force that both make.

An override is a row of its own (as a pause is), so an app's boot, which upserts its signals,
never clears one. Per limit it holds NULL (follow the declaration), "none" / 0 (no limit) or the
value; `okconsole limit --reset` deletes the row.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import Connection, delete, select, text

from ..durations import parse_rate
from . import schema

lim = schema.limits
NONE = "none"  # an override that lifts a declared limit (concurrency: stored as 0)

# Plain text, so PostgreSQL's hot connections could run it as it is.
OVERRIDES_SQL = "SELECT signal, concurrency, rate FROM oke_limits"


class Override(NamedTuple):
    """An operator's override of one signal's limits: None follows the declaration, 0 / "none" lifts it."""

    concurrency: int | None
    rate: str | None


class Limits(NamedTuple):
    """The limits in force on a signal (None: none), and whether an operator's override set them."""

    concurrency: int | None
    rate: str | None
    overridden: bool

    @property
    def rate_parts(self) -> tuple[int, int] | None:
        return None if self.rate is None else parse_rate(self.rate)


def in_force(declared_concurrency: int | None, declared_rate: str | None, override: Override | None) -> Limits:
    """The limits a declaration and an override (if any) make together."""
    if override is None:
        return Limits(declared_concurrency, declared_rate, False)
    by_hand = override.concurrency
    # A row written by hand with a negative concurrency is not an override: the declaration holds.
    concurrency = declared_concurrency if by_hand is None or by_hand < 0 else by_hand or None
    rate = declared_rate if override.rate is None else None if override.rate == NONE else override.rate
    if rate is not None and parse_rate(rate) is None:
        rate = declared_rate  # a row written by hand that does not parse: the declaration holds
    return Limits(concurrency, rate, True)


def overrides(conn: Connection) -> dict[str, Override]:
    """Every signal's override, by signal."""
    return {r[0]: Override(r[1], r[2]) for r in conn.execute(text(OVERRIDES_SQL))}


def override_of(conn: Connection, signal: str) -> Override | None:
    row = conn.execute(select(lim.c.concurrency, lim.c.rate).where(lim.c.signal == signal)).first()
    return None if row is None else Override(row[0], row[1])


def declared(conn: Connection, signal: str) -> tuple[int | None, str | None]:
    """The concurrency and rate `signal`'s app declared at its last boot (None, None if unrecorded)."""
    s = schema.signals
    row = conn.execute(select(s.c.concurrency, s.c.rate).where(s.c.name == signal)).first()
    return (None, None) if row is None else (row[0], row[1])


def limits_of(conn: Connection, signal: str) -> Limits:
    concurrency, rate = declared(conn, signal)
    return in_force(concurrency, rate, override_of(conn, signal))


def all_in_force(conn: Connection) -> dict[str, Limits]:
    """The limits in force on every signal that has any (declared or overridden)."""
    s = schema.signals
    found = overrides(conn)
    declared_rows = {
        r[0]: (r[1], r[2])
        for r in conn.execute(
            select(s.c.name, s.c.concurrency, s.c.rate).where(s.c.concurrency.is_not(None) | s.c.rate.is_not(None))
        )
    }
    out: dict[str, Limits] = {}
    for signal in sorted(set(found) | set(declared_rows)):
        limits = in_force(*declared_rows.get(signal, (None, None)), found.get(signal))
        if limits.concurrency is not None or limits.rate is not None or limits.overridden:
            out[signal] = limits
    return out


def set_override(conn: Connection, signal: str, override: Override, *, at: int, actor: str, reason: str | None) -> None:
    """Write `override` over any earlier one (a limit it leaves None keeps the earlier override's)."""
    before = override_of(conn, signal)
    if before is not None:
        override = Override(
            before.concurrency if override.concurrency is None else override.concurrency,
            before.rate if override.rate is None else override.rate,
        )
        conn.execute(lim.delete().where(lim.c.signal == signal))
    conn.execute(
        lim.insert().values(
            signal=signal, concurrency=override.concurrency, rate=override.rate, set_at=at, actor=actor, reason=reason
        )
    )


def reset(conn: Connection, signal: str) -> bool:
    """Drop the override: the declared limits hold again. False when there was none."""
    return bool(conn.execute(delete(lim).where(lim.c.signal == signal)).rowcount)
