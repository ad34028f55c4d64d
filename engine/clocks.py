"""Clock triggers: `clock.every("5m")` and `clock.cron("0 * * * *", tz="Europe/Berlin")` for `on()`.

A clock is a schedule of tick times, nothing more: every process running the app computes the
same ticks from it, and each tick becomes one `once` message of the implicit signal
`clock.<flow name>` whose dedupe key is the tick time (engine/clock_runner.py emits them). Five-field
cron expressions are parsed and evaluated by cronsim (docs/design/clocks.md says why that library).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .durations import parse_duration_ms

PREFIX = "clock."
MIN_EVERY_MS = 1_000
# A tick's key stays held this much longer than the gap to the next tick, so a process that
# emits the same tick late (a stalled loop, a clock a little behind) still finds it held.
HOLD_MARGIN_MS = 60_000
# cron's wall-clock matches are searched this far back for the latest missed tick (catch_up).
_MAX_STEPS = 10_000


@dataclass(frozen=True)
class Clock:
    """An unchecked clock trigger as written; `checked(flow)` validates it for a flow's binding."""

    every: object = None
    cron: object = None
    tz: object = "UTC"
    catch_up: object = False

    def checked(self, flow: str) -> Schedule:
        """The schedule this trigger describes, or a ValueError / TypeError naming `flow` and the value."""
        where = f'on({self!r}, flow "{flow}")'
        if not isinstance(self.catch_up, bool):
            raise TypeError(f"{where}: catch_up is a flag (True or False), got {self.catch_up!r}")
        if self.cron is None:
            return Every(_every_ms(where, self.every), self.catch_up)
        return Cron(_cron_expr(where, self.cron), _zone(where, self.tz), self.catch_up)

    def __repr__(self) -> str:
        if self.cron is None:
            return f"clock.every({self.every!r})"
        return f"clock.cron({self.cron!r}, tz={self.tz!r})"


def _every_ms(where: str, every: object) -> int:
    ms = parse_duration_ms(every)
    if ms is None:
        raise ValueError(f'{where}: every takes a duration like "30s" or "5m", got {every!r}')
    if ms < MIN_EVERY_MS:
        raise ValueError(f"{where}: every is at least 1s, got {every!r}")
    return ms


def _cron_expr(where: str, expr: object) -> str:
    if not isinstance(expr, str):
        raise TypeError(f"{where}: a cron expression is a string of five fields, got {expr!r}")
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"{where}: a cron expression has five fields (minute hour day month weekday), got {expr!r}")
    try:
        CronSim(" ".join(fields), datetime.now(UTC))
    except CronSimError as err:
        raise ValueError(f"{where}: {expr!r} is not a cron expression ({err})") from None
    return " ".join(fields)


def _zone(where: str, tz: object) -> str:
    if not isinstance(tz, str) or not tz or len(tz) > 100:
        raise ValueError(f"{where}: tz is an IANA time zone name like 'Europe/Berlin', got {tz!r}")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"{where}: unknown time zone {tz!r}") from None
    return tz


@dataclass(frozen=True)
class Every:
    """Every `period_ms`, on multiples of it since the epoch (so every process agrees)."""

    period_ms: int
    catch_up: bool = False
    tz: str = "UTC"

    @property
    def spec(self) -> str:
        return f"every {_duration_text(self.period_ms)}"

    def next_after(self, ms: int) -> int:
        """The first tick strictly after `ms`."""
        return (ms // self.period_ms + 1) * self.period_ms

    def latest_at_or_before(self, ms: int) -> int | None:
        """The last tick at or before `ms`."""
        return ms // self.period_ms * self.period_ms


@dataclass(frozen=True)
class Cron:
    """A five-field cron expression in a time zone, with Debian cron's DST rules (cronsim's) except
    that the repeated hour of a fall-back day fires once: a wall-clock time that occurs twice is
    one match."""

    expr: str
    tz: str = "UTC"
    catch_up: bool = False

    @property
    def spec(self) -> str:
        return self.expr

    def next_after(self, ms: int) -> int:
        start = datetime.fromtimestamp(ms / 1000, ZoneInfo(self.tz))
        for when in CronSim(self.expr, start):
            if not when.fold:  # fold=1: the second pass of a wall-clock time, already matched
                return int(when.timestamp() * 1000)
        raise ValueError(f"{self.expr!r} has no next match")  # pragma: no cover - cronsim iterates forever

    def latest_at_or_before(self, ms: int) -> int | None:
        start = datetime.fromtimestamp((ms + 1) / 1000, ZoneInfo(self.tz))
        for step, when in enumerate(CronSim(self.expr, start, reverse=True)):
            at = int(when.timestamp() * 1000)
            if not when.fold and at <= ms:
                return at
            if step > _MAX_STEPS:
                break
        return None


Schedule = Every | Cron  # tick times in epoch milliseconds, the same in every process


def hold_ms(schedule: Schedule, at: int) -> int:
    """How long tick `at`'s dedupe key stays held after its message finished: past the next tick."""
    return schedule.next_after(at) - at + HOLD_MARGIN_MS


def _duration_text(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def from_record(spec: str, tz: str) -> Schedule | None:
    """The schedule of a clock recorded in the store (`okconsole clocks`), None if unreadable."""
    try:
        if spec.startswith("every "):
            return Every(_every_ms("clock", spec.removeprefix("every ")))
        return Cron(_cron_expr("clock", spec), _zone("clock", tz))
    except (TypeError, ValueError):
        return None


def signal_name(flow: str) -> str:
    """The implicit once signal a clock's ticks are messages of."""
    return PREFIX + flow


class _ClockFactory:
    """The `clock` namespace: `clock.every(...)`, `clock.cron(...)`."""

    @staticmethod
    def every(duration: str, *, catch_up: bool = False) -> Clock:
        """A tick every `duration` ("30s", "5m", "1h"; at least 1s), on multiples of it since the epoch."""
        return Clock(every=duration, catch_up=catch_up)

    @staticmethod
    def cron(expr: str, tz: str = "UTC", *, catch_up: bool = False) -> Clock:
        """A tick at each match of a five-field cron expression in time zone `tz`."""
        return Clock(cron=expr, tz=tz, catch_up=catch_up)


clock = _ClockFactory()
