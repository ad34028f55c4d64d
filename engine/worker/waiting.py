"""Waiting on several events at once, and the retry back-off after a database outage."""

from __future__ import annotations

import asyncio

IDLE_POLL_S = 1.0  # fallback re-check (expired leases need no wake-up to become claimable)
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 5.0


async def wait_any(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Until one of `events` is set (or `timeout` passes); the waits left over are cancelled."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


class Backoff:
    """The delay before the next retry: doubles at each failure up to MAX_BACKOFF_S, and starts
    over at the first success."""

    __slots__ = ("delay",)

    def __init__(self) -> None:
        self.delay = FIRST_BACKOFF_S

    def reset(self) -> None:
        self.delay = FIRST_BACKOFF_S

    def grow(self) -> None:
        self.delay = min(self.delay * 2, MAX_BACKOFF_S)

    @property
    def exhausted(self) -> bool:
        """The delay has reached its ceiling: the outage is not a short one."""
        return self.delay >= MAX_BACKOFF_S
