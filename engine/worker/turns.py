"""Driving a suspended handler on from where it stopped, inside its own context (handler turns)."""

from __future__ import annotations

import contextvars
from collections.abc import Generator
from typing import Any


class Resumed:
    """Awaiting it drives `coro` on from the step it suspended at, inside `context`, as `await coro`
    would have from the start: what the task sends or throws in goes to the coroutine."""

    __slots__ = ("context", "coro", "step")

    def __init__(self, coro: Any, step: Any, context: contextvars.Context) -> None:
        self.coro, self.step, self.context = coro, step, context

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, context, step = self.coro, self.context, self.step
        while True:
            try:
                sent = yield step
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                try:
                    step = context.run(coro.throw, exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    step = context.run(coro.send, sent)
                except StopIteration as stop:
                    return stop.value
