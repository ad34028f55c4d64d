"""Clock schedules (engine/clocks.py) and the tick emitter (engine/clock_runner.py) without a
database: tick times over DST changes in Europe/Berlin, the checks made at declaration, and a
runner driven by a fake clock with a store double."""

from __future__ import annotations

import asyncio
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from engine import flow, on, reset
from engine.clock_runner import ClockRunner
from engine.clocks import Cron, Every, clock, hold_ms
from engine.errors import StoreUnavailable
from engine.flows import current_bindings
from engine.signals import signal

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture(autouse=True)
def _fresh():
    reset()
    yield
    reset()


def _ms(*parts: int) -> int:
    return int(datetime(*parts, tzinfo=BERLIN).timestamp() * 1000)


def _ticks(schedule, start: int, end: int) -> list[int]:
    out, at = [], schedule.next_after(start - 1)
    while at < end:
        out.append(at)
        at = schedule.next_after(at)
    return out


def _wall(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, BERLIN).strftime("%H:%M%z")


def test_every_ticks_on_multiples_of_its_period_so_every_process_agrees():
    five = Every(300_000)
    assert five.next_after(1_000) == 300_000 and five.next_after(300_000) == 600_000
    assert five.latest_at_or_before(599_999) == 300_000 and five.latest_at_or_before(600_000) == 600_000
    assert five.spec == "every 5m" and hold_ms(five, 300_000) == 300_000 + 60_000


def test_spring_forward_an_hourly_cron_skips_the_missing_hour_and_a_daily_one_fires_once():
    day = (_ms(2026, 3, 29, 0, 0), _ms(2026, 3, 30, 0, 0))
    hourly = _ticks(Cron("0 * * * *", "Europe/Berlin"), *day)
    assert len(hourly) == 23 and len(set(hourly)) == 23  # 02:00 does not exist that day
    assert [_wall(t) for t in hourly[:3]] == ["00:00+0100", "01:00+0100", "03:00+0200"]
    at_half_past_two = _ticks(Cron("30 2 * * *", "Europe/Berlin"), *day)
    assert [_wall(t) for t in at_half_past_two] == ["03:00+0200"]  # the missing 02:30 runs right after the jump


def test_fall_back_each_wall_clock_match_fires_once_in_the_repeated_hour():
    day = (_ms(2026, 10, 25, 0, 0), _ms(2026, 10, 26, 0, 0))
    hourly = _ticks(Cron("0 * * * *", "Europe/Berlin"), *day)
    walls = [_wall(t) for t in hourly]
    assert len(hourly) == 24 and len(set(walls)) == 24  # 02:00 happens twice; it fires once
    assert walls[1:4] == ["01:00+0200", "02:00+0200", "03:00+0100"]
    half_hours = _ticks(Cron("*/30 * * * *", "Europe/Berlin"), *day)
    assert len(half_hours) == 48
    daily = _ticks(Cron("30 2 * * *", "Europe/Berlin"), *day)
    assert [_wall(t) for t in daily] == ["02:30+0200"]
    assert Cron("0 * * * *", "Europe/Berlin").latest_at_or_before(_ms(2026, 10, 25, 3, 30)) == _ms(2026, 10, 25, 3, 0)


def test_a_cron_tick_in_utc_and_the_latest_missed_one():
    hourly = Cron("0 * * * *")
    assert hourly.next_after(3_600_000) == 7_200_000
    assert hourly.latest_at_or_before(7_199_999) == 3_600_000 and hourly.latest_at_or_before(7_200_000) == 7_200_000


@pytest.mark.parametrize(
    ("trigger", "words"),
    [
        (clock.cron("61 * * * *"), ["reports.hourly", "61 * * * *"]),
        (clock.cron("0 * * *"), ["reports.hourly", "0 * * *", "five fields"]),
        (clock.cron("0 0 * * * *"), ["reports.hourly", "five fields"]),
        (clock.cron("0 * * * *", tz="Mars/Olympus"), ["reports.hourly", "Mars/Olympus"]),
        (clock.every("500ms"), ["reports.hourly", "500ms", "at least 1s"]),
        (clock.every("soon"), ["reports.hourly", "soon"]),
    ],
)
def test_bad_input_is_a_value_error_at_declaration_naming_the_flow_and_the_value(trigger, words):
    with pytest.raises(ValueError) as caught:
        on(trigger, flow("reports.hourly", do=lambda tick, fx: None))
    assert all(word in str(caught.value) for word in words), caught.value
    assert current_bindings() == []


def test_a_clock_binds_its_flow_to_the_implicit_once_signal():
    hourly = flow("reports.hourly", do=lambda tick, fx: None)
    on(clock.cron("0 * * * *", tz="Europe/Berlin", catch_up=True), hourly)
    [binding] = current_bindings()
    assert binding.trigger.name == "clock.reports.hourly" and binding.trigger.kind == "once"
    assert binding.clock == Cron("0 * * * *", "Europe/Berlin", catch_up=True)
    with pytest.raises(ValueError, match="at most 194"):
        on(clock.every("1m"), flow("x" * 195, do=lambda tick, fx: None))


class _Store:
    """What the runner reads of a store: the paused set (or an outage)."""

    def __init__(self) -> None:
        self.paused: frozenset[str] = frozenset()
        self.away = 0

    async def paused_signals(self) -> frozenset[str]:
        if self.away:
            self.away -= 1
            raise StoreUnavailable("away")
        return self.paused


async def test_the_runner_emits_each_tick_with_its_time_as_dedupe_key_skips_paused_and_retries_an_outage(monkeypatch):
    now = [1_000]
    store, emitted = _Store(), []

    async def emit(sig, payload, *, dedupe, dedupe_for):
        emitted.append((sig.name, payload, dedupe, dedupe_for))
        return f"msg_{len(emitted)}"

    monkeypatch.setattr("engine.clock_runner.RETRY_S", 0)
    ticks = signal.once("clock.t")
    runner = ClockRunner(store, emit, {ticks: Every(2_000)}, asyncio.Event(), clock=lambda: now[0])
    assert await runner.tick(ticks, Every(2_000), 2_000) == "msg_1"
    assert emitted == [("clock.t", {"at": 2_000}, "2000", 62.0)]
    store.paused = frozenset({"clock.t"})
    assert await runner.tick(ticks, Every(2_000), 4_000) is None and len(emitted) == 1
    store.paused, store.away = frozenset(), 2
    assert await runner.tick(ticks, Every(2_000), 6_000) == "msg_2"  # tried again until the store answered
    store.away, now[0] = 5, 8_000  # the next tick is due: this one is given up
    assert await runner.tick(ticks, Every(2_000), 6_000) is None and len(emitted) == 2


def test_after_a_slow_emit_the_runner_emits_the_latest_tick_that_passed_and_skips_older_ones():
    now = [1_200]
    runner = ClockRunner(_Store(), None, {}, asyncio.Event(), clock=lambda: now[0])  # type: ignore[arg-type]
    assert runner._after(Every(1_000), 1_000) == 2_000  # on time: the next one
    now[0] = 2_400
    assert runner._after(Every(1_000), 1_000) == 2_000  # tick 2000 passed during the emit: at once
    now[0] = 9_700
    assert runner._after(Every(1_000), 1_000) == 9_000  # stalled: 2000 … 8000 are skipped
