"""The client's back-off between reopenings: 500 ms doubling to 30 s, jitter only lengthening a wait,
and back to 500 ms after a successful open (the seeds' table; the browser module's twin is checked
in tests/test_browser_client.py)."""
from __future__ import annotations

import asyncio

from engine.client import BACKOFF_MAX_S, BACKOFF_MIN_S, _Resume


def test_the_back_off_doubles_from_half_a_second_to_thirty_and_resets_on_open(monkeypatch):
    slept: list[float] = []

    async def record(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", record)
    resume = _Resume(None, None)

    async def waits(n: int) -> None:
        for _ in range(n):
            await resume.back_off()

    asyncio.run(waits(9))
    bases = [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert (BACKOFF_MIN_S, BACKOFF_MAX_S) == (0.5, 30.0)
    for wait, base in zip(slept, bases, strict=True):
        assert base <= wait <= min(base * 1.25, 30.0), slept
    resume.opened()
    slept.clear()
    asyncio.run(waits(1))
    assert 0.5 <= slept[0] <= 0.625
