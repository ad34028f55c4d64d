"""What an emitter knows of the bindings other processes recorded, never older than
BINDINGS_CACHE_S (ops.unbind waits that long before sweeping the copies emitted meanwhile).

A copy is re-read in the background once it is half that old, so an emitter that emits steadily
never waits for the read (through SQLAlchemy about 1.5 ms, which one emit in forty of the latency
benchmark used to pay); an emit that finds its copy past the limit reads it in line, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from .store import registry

BINDINGS_CACHE_S = registry.BINDINGS_CACHE_S
log = logging.getLogger("engine.app")

Read = Callable[[str], Awaitable[registry.Recorded]]


class BindingsCache:
    """Per signal, the last read of its recorded bindings and when that read began."""

    def __init__(self, read: Read) -> None:
        self._read = read
        self._copies: dict[str, tuple[float, registry.Recorded]] = {}
        self._refreshing: dict[str, asyncio.Task[None]] = {}

    async def get(self, signal: str) -> registry.Recorded:
        """The bindings of `signal` as read at most BINDINGS_CACHE_S ago (read now if need be)."""
        copy = self._copies.get(signal)
        age = time.monotonic() - copy[0] if copy is not None else float("inf")
        if copy is None or age >= BINDINGS_CACHE_S:
            return await self._read_into(signal)
        if age >= BINDINGS_CACHE_S / 2 and signal not in self._refreshing:
            task = asyncio.get_running_loop().create_task(self._refresh(signal), name="oke-bindings-refresh")
            self._refreshing[signal] = task
        return copy[1]

    async def _read_into(self, signal: str) -> registry.Recorded:
        began = time.monotonic()
        recorded = await self._read(signal)
        held = self._copies.get(signal)
        if held is None or held[0] <= began:  # a later read that finished first stays
            self._copies[signal] = (began, recorded)
        return recorded

    async def _refresh(self, signal: str) -> None:
        try:
            await self._read_into(signal)
        except Exception as err:  # the copy ages out and the next emit reads in line (and reports)
            log.debug("background read of %s's bindings failed (%s: %s)", signal, type(err).__name__, err)
        finally:
            self._refreshing.pop(signal, None)

    async def close(self) -> None:
        """Cancel the reads still running on this loop (an app closed under another loop has its
        tasks there, gone with it)."""
        loop = asyncio.get_running_loop()
        mine = [task for task in self._refreshing.values() if task.get_loop() is loop]
        for task in mine:
            task.cancel()
        await asyncio.gather(*mine, return_exceptions=True)
        self._refreshing.clear()
