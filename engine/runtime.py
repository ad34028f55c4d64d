"""The runtime context: what the worker pool and a handler's `Fx` need of a started app, nothing more.

The app (engine/app.py) builds one when its workers start, once the store is open. The worker and
`Fx` see only this, so neither imports `engine.app`, and neither reaches for the app's private
state (its stop event, its store check): what they use is spelled out here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .signals import Signal
    from .store import Store


class Emit(Protocol):
    """`OkeApp.emit`: validate and store a message, resolve with its id once committed."""

    async def __call__(
        self,
        signal: Signal | str,
        payload: Any = None,
        *,
        key: str | None = None,
        parent_run_id: str | None = None,
        emitter: str | None = None,
    ) -> str: ...


class FxHost(Protocol):
    """What `Fx` uses: the store (None while the app is not started) and emit. A `Runtime` is one;
    so is an `OkeApp`, which is what custom HTTP flows' `Fx` is still given."""

    @property
    def store(self) -> Store | None: ...

    async def emit(
        self,
        signal: Signal | str,
        payload: Any = None,
        *,
        key: str | None = None,
        parent_run_id: str | None = None,
        emitter: str | None = None,
    ) -> str: ...


@dataclass(frozen=True, slots=True)
class Runtime:
    """One started app as its workers see it.

    `stop` is the app's stop event (set by `stop()` / `close()`): the claim lanes end when it is set.
    `stop_grace_s` is how long running handlers may take to end once they do.
    """

    store: Store
    worker_id: str
    lease_ms: int
    stop_grace_s: float
    stop: asyncio.Event
    emit: Emit
