"""Calling a flow's handler: async in this task, sync in a thread; within its flow's `timeout`."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from ..errors import HandlerTimeout
from ..fx import Fx
from .route import Route


async def call_handler(route: Route, value: Any, fx: Fx) -> None:
    """Run the handler once: an async one here, a sync one in a thread (whatever it returns awaited)."""
    handler = route.flow.do
    assert handler is not None
    if route.is_async:
        await handler(value, fx)
        return
    result = await asyncio.to_thread(handler, value, fx)
    if inspect.isawaitable(result):
        await result


async def call_within_timeout(route: Route, value: Any, fx: Fx, timeout_s: float) -> None:
    """`call_handler`, cancelled once it runs `timeout_s`; then the attempt fails with HandlerTimeout.

    A handler that swallows the cancel and returns still fails: it outlived its timeout. A sync
    handler's thread cannot be interrupted; it runs to its end, but its attempt has already failed.
    The worker's own stop cancel is not a timeout and goes through as a cancel.
    """
    within = asyncio.timeout(timeout_s)
    try:
        async with within:
            await call_handler(route, value, fx)
    except TimeoutError:
        if not within.expired():
            raise  # the handler's own TimeoutError: an ordinary failure
        raise _timed_out(route, timeout_s) from None
    if within.expired():
        raise _timed_out(route, timeout_s)


def _timed_out(route: Route, timeout_s: float) -> HandlerTimeout:
    return HandlerTimeout(f'flow "{route.flow.name}" ran longer than its timeout of {timeout_s:g}s and was cancelled')
