"""The per-run context a handler receives: emit, dead letters, durable steps, its lease, ids."""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .durations import MAX_DURATION_MS
from .errors import LeaseLost, OkeError
from .flows import Flow
from .ids import new_id
from .runtime import Runtime
from .signals import Signal

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from .ops.records import DeadLetter
    from .runtime import FxHost
    from .store import Claimed


@dataclass(frozen=True)
class LiveBody:
    """What `fx.live()` returns: the SSE body of a tape, filtered by `match`."""

    signal: Signal
    match: Callable[[Any], bool] | None


class Fx:
    """What a flow may do while it runs. One Fx per attempt (a run)."""

    __slots__ = ("_app", "_claimed", "flow", "run_id", "parent_run_id", "attempt", "message_id", "signal", "exposes")

    def __init__(
        self,
        app: FxHost | None,
        flow: Flow,
        *,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        attempt: int = 1,
        message_id: str | None = None,
        signal: str | None = None,
        exposes: str | None = None,
        claimed: Claimed | None = None,
    ) -> None:
        self._app = app
        self._claimed = claimed  # the message a worker holds for this run (None in an HTTP flow)
        self.flow = flow
        self.run_id = run_id or new_id("run_")
        self.parent_run_id = parent_run_id
        self.attempt = attempt
        self.message_id = message_id
        self.signal = signal
        self.exposes = exposes  # the live signal of the route this run serves, if any

    def id(self) -> str:
        """A new unique, time-ordered id."""
        return new_id()

    async def emit(
        self,
        signal: Signal | str,
        payload: Any = None,
        *,
        key: str | None = None,
        delay: object = None,
        at: object = None,
        dedupe: str | None = None,
        priority: int = 0,
        conn: AsyncConnection | None = None,
        dedupe_for: object = None,
    ) -> str:
        """Validate and store a message; it records this run as its parent. Resolves on commit
        (with `conn=`, the caller's: the message is written in that transaction). The time and
        order options are `app.emit`'s."""
        if self._app is None:
            raise RuntimeError("fx.emit requires a bound signal runtime")
        return await self._app.emit(
            signal,
            payload,
            key=key,
            delay=delay,
            at=at,
            dedupe=dedupe,
            priority=priority,
            parent_run_id=self.run_id,
            emitter=self.flow.name,
            conn=conn,
            dedupe_for=dedupe_for,
        )

    async def extend_lease(self, ms: int | None = None) -> None:
        """Hold the current message until now + `ms` (default the app's lease_ms), by the store's
        lease clock. Raises LeaseLost when another worker has reclaimed it meanwhile. Never automatic."""
        if ms is not None and (isinstance(ms, bool) or not isinstance(ms, int)):
            raise TypeError(f"fx.extend_lease(ms=...): an int of milliseconds, got {ms!r}")
        if ms is not None and not 1 <= ms <= MAX_DURATION_MS:
            raise ValueError(f"fx.extend_lease(ms=...): milliseconds from 1 to {MAX_DURATION_MS}, got {ms}")
        host, claimed = self._app, self._claimed
        if not isinstance(host, Runtime) or claimed is None:
            raise RuntimeError("fx.extend_lease requires a message held by a worker (a signal flow's run)")
        if not await host.store.renew_lease(host.worker_id, claimed, host.lease_ms if ms is None else ms):
            raise LeaseLost(
                f'fx.extend_lease(): message {claimed.id} of "{claimed.signal}" was reclaimed after its lease '
                f"expired; attempt {claimed.attempts} no longer holds it, and its outcome will not be recorded"
            )

    def require_read(self, name: str) -> None:
        """OKE1001 unless this flow declared `signal:<name>` in its reads."""
        if f"signal:{name}" not in self.flow.reads:
            raise OkeError.of(1001, flow=self.flow.name or "(unnamed)", name=name)

    def live(self, signal: Signal, *, match: Callable[[Any], bool] | None = None) -> LiveBody:
        """The SSE body of a live tape inside a custom GET flow.

        The signal the route itself exposes needs no declared read (the exposure is the
        declaration); any other needs `signal:<name>` in reads (OKE1001).
        """
        if not isinstance(signal, Signal) or signal.kind != "live":
            raise TypeError(f"fx.live(): expected a signal.live(...) handle, got {signal!r}")
        if signal.name != self.exposes:
            self.require_read(signal.name)
        if match is not None and not callable(match):
            raise TypeError("fx.live(match=...): match must be callable")
        return LiveBody(signal, match)

    async def dead_letters(self, signal: Signal | str) -> list[DeadLetter]:
        """Dead messages of `signal`, newest first (needs `signal:<name>` in effects.reads)."""
        name = signal.name if isinstance(signal, Signal) else signal
        self.require_read(name)
        if self._app is None or self._app.store is None:
            raise RuntimeError("fx.dead_letters requires a bound signal runtime")
        from . import ops

        return await ops.dead_letters(self._app.store, name)

    async def step(self, name: str, fn: Callable[[], Any | Awaitable[Any]]) -> Any:
        """Run `fn` once per message; on a retry or replay a finished step returns its recorded result."""
        if not self.flow.durable:
            raise RuntimeError(f'fx.step: flow "{self.flow.name}" is not durable; declare flow(..., durable=True)')
        if self._app is None or self._app.store is None or self.message_id is None:
            raise RuntimeError("fx.step requires a bound signal runtime")
        from .store import steps

        store = self._app.store
        found = await store.read(lambda conn: steps.load(conn, self.message_id or "", name))
        if found is not None:
            return json.loads(found)
        result = fn()
        if inspect.isawaitable(result):
            result = await result
        try:
            encoded = json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise TypeError(f'fx.step("{name}"): the result must be JSON-serializable ({err})') from err
        recorded = await store.write(lambda conn: steps.save(conn, self.message_id or "", name, encoded, self.run_id))
        # The recorded value, as a retry will get it (tuples as lists, int dict keys as strings), so
        # every attempt sees the same thing, including a twin holder's result when it finished first.
        return json.loads(recorded)
