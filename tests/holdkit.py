"""A `once` message kept in flight under a live lease, for tests that look at it meanwhile."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

from engine import flow, oke, on, signal


@contextlib.asynccontextmanager
async def one_message_held(db_url: str, name: str, lease_ms: int = 30_000) -> AsyncIterator[tuple[Any, str]]:
    """Emit one message on a fresh `once` signal `name` and let a handler hold it (claimed, lease
    running) until the block ends; yields (app, message id). On exit the handler returns and the
    drain finishes, so the message ends delivered."""
    jobs = signal.once(name, retries=0)
    held, release = asyncio.Event(), asyncio.Event()

    @on(jobs)
    @flow(f"w.{name}")
    async def hold(payload: Any, fx: Any) -> None:
        held.set()
        await release.wait()

    async with oke("t", database_url=db_url, lease_ms=lease_ms) as app:
        msg = await app.emit(jobs, {"n": 1})
        drain = asyncio.create_task(app.drain(concurrency=1))
        await asyncio.wait_for(held.wait(), 10)
        try:
            yield app, msg
        finally:
            release.set()
            await drain
