"""The runtime contexts: what the worker pool, a handler's `Fx` and the HTTP server need of an app.

The app (engine/app.py) builds a `Runtime` when its workers start, once the store is open, and an
`HttpRuntime` with its ASGI server. The worker, `Fx` and the server see only these, so none imports
`engine.app`, and none reaches for the app's private state (its stop event, its store check): what
they use is spelled out here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .payloads import DEFAULT_MAX_PAYLOAD_BYTES

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from .signals import Signal
    from .store import Store
    from .telemetry import RunHooks

# open connections `serve()` answers at once, SSE streams included; one more gets 503 (http/limits.py)
DEFAULT_MAX_CONNECTIONS = 10_000


class Emit(Protocol):
    """`OkeApp.emit`: validate and store a message, resolve with its id once committed."""

    async def __call__(
        self,
        signal: Signal | str,
        payload: Any = None,
        *,
        key: str | None = None,
        delay: object = None,
        at: object = None,
        dedupe: str | None = None,
        priority: int = 0,
        parent_run_id: str | None = None,
        emitter: str | None = None,
        conn: AsyncConnection | None = None,
        dedupe_for: object = None,
    ) -> str: ...


class FxHost(Protocol):
    """What `Fx` uses: the store (None while the app is not started) and emit. A `Runtime` is one
    (workers' handlers), so is an `HttpRuntime` (custom HTTP flows)."""

    @property
    def store(self) -> Store | None: ...

    @property
    def emit(self) -> Emit: ...


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
    hooks: RunHooks  # the app's handler counters and run spans


def not_started(app_name: str) -> RuntimeError:
    """The error for using an app's store before `start()` (or after `close()`)."""
    return RuntimeError(f'oke("{app_name}") is not started: use "async with app:" or await app.start()')


@dataclass(frozen=True, slots=True)
class HttpRuntime:
    """One app as its HTTP server sees it.

    The server exists before the app starts (`app.asgi` may be taken first, and its lifespan boots
    the app), and outlives a stop and a start again, so it asks for the store on each use
    (`current_store`) rather than holding one. `start` boots the app (ASGI lifespan startup);
    `request_stop` sets the app's stop event, which `start()` renews; `heartbeat_s` is the SSE
    heartbeat interval; `max_payload_bytes` bounds a request body (plus 64 KiB) and
    `max_connections` the open connections (engine/http/limits.py).
    """

    app_name: str
    current_store: Callable[[], Store | None]
    start: Callable[[], Awaitable[None]]
    request_stop: Callable[[], None]
    emit: Emit
    heartbeat_s: float
    hooks: RunHooks | None = None  # what the metrics route reads of this process's handlers
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    @property
    def store(self) -> Store | None:
        """The app's open store; None while it is not started (what `Fx` asks)."""
        return self.current_store()

    def require_store(self) -> Store:
        store = self.current_store()
        if store is None:
            raise not_started(self.app_name)
        return store
