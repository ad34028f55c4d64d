"""`oke()`: boot (manifest checks, store, schema), emit outside a flow, drain / run / serve."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socket
from collections.abc import Iterable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from . import history, payloads
from .background import Background
from .bindings_cache import BindingsCache
from .clock_runner import ClockRunner
from .durations import parse_duration_ms
from .emitting import check_emit_key, emit_options, rows_for, rows_for_many
from .errors import BIND_A_FLOW, MOUNT_AN_EXPOSURE, OkeError, StoreUnavailable
from .flows import Binding, Manifest, build_manifest, current_bindings, is_signal_binding
from .heartbeat import DEFAULT_INTERVAL_S, WorkerHeartbeat
from .http.limits import check_max_connections
from .http.routes import check_routes
from .http.server import HttpServer
from .ids import new_id
from .live import tape
from .live.appender import AppendInterrupted, LiveAppender
from .retention import parse_policy
from .runtime import DEFAULT_MAX_CONNECTIONS, HttpRuntime, Runtime, not_started
from .signals import MAX_NAME_LENGTH, Signal, all_declared, check_name, declared
from .store import NewMessage, Store, check_sqlite_writer, make_store, queue_name, registry, resolve_url
from .store.caller import check_caller_connection
from .store.outage import describe, is_outage
from .store.postgres.pooler import check_listen_url
from .telemetry import RunHooks, tracing
from .worker import Route, WorkerPool

BINDING_HEARTBEAT_S = 60.0  # a running app refreshes its bindings' last_seen this often (one UPDATE)
log = logging.getLogger("engine.app")


class OkeApp:
    """An embedded engine: one store, the flows bound in this process, and their workers."""

    def __init__(
        self,
        name: str,
        *,
        database_url: str | None = None,
        bindings: list[Binding] | None = None,
        lease_ms: int = 30_000,
        worker_id: str | None = None,
        max_payload_bytes: int = payloads.DEFAULT_MAX_PAYLOAD_BYTES,
        stop_grace_s: float = 10.0,
        sse_heartbeat_s: float = 15.0,
        busy_timeout_ms: int | None = None,
        sqlite_writer: str = "process",
        binding_ttl: str = registry.DEFAULT_BINDING_TTL,
        worker_heartbeat_s: float = DEFAULT_INTERVAL_S,
        history_ttl: str = history.DEFAULT_HISTORY_TTL,
        keep_delivered: str | None = None,
        keep_dead: str | None = None,
        keep_runs: str | None = None,
        listen_url: str | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"oke(name): the app name must be a non-empty string, got {name!r}")
        if len(name) > MAX_NAME_LENGTH:
            raise ValueError(f"oke(name): an app name has at most {MAX_NAME_LENGTH} characters")
        if worker_id is not None and (not isinstance(worker_id, str) or not 1 <= len(worker_id) <= MAX_NAME_LENGTH):
            raise ValueError(f"oke(worker_id=...): a worker id is a string of 1 to {MAX_NAME_LENGTH} characters")
        if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms < 1:
            raise TypeError(f"oke(lease_ms=...): the lease is an int of milliseconds ≥ 1, got {lease_ms!r}")
        self.name = name
        self.database_url = resolve_url(database_url)
        self.listen_url = None if listen_url is None else check_listen_url(listen_url, self.database_url)
        self._bindings = bindings
        self.lease_ms = lease_ms
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{new_id()[-6:]}"
        self.max_payload_bytes = _max_payload_bytes(max_payload_bytes)  # an emit's; HTTP bodies get 64 KiB more
        self.stop_grace_s = stop_grace_s
        self.sse_heartbeat_s = _sse_heartbeat_s(sse_heartbeat_s)  # SSE heartbeat interval (at least every 15 s)
        # SQLite: how long a write waits for another process's lock before it fails (default 30 s)
        self.busy_timeout_ms = _busy_timeout_ms(busy_timeout_ms)
        check_sqlite_writer(sqlite_writer, "oke(sqlite_writer=...)")
        self.sqlite_writer = sqlite_writer  # SQLite: where emits, claims and settles are written
        self.binding_ttl_ms = _binding_ttl_ms(binding_ttl)
        self.worker_heartbeat_s = _heartbeat_s(worker_heartbeat_s)  # how often a running pool records itself
        self.history_ttl_ms = history.parse_ttl_ms("history_ttl", history_ttl)
        self.retention_policy = parse_policy(keep_delivered, keep_dead, keep_runs)
        self.max_connections = check_max_connections(max_connections)  # HTTP: one more gets 503
        self.background: Background | None = None  # history writer and retention, while started
        self.store: Store | None = None
        self.manifest: Manifest | None = None
        self._stop_requested = asyncio.Event()
        self._recorded = BindingsCache(self._read_bindings)  # what other processes recorded
        self._http: HttpServer | None = None
        self._appender: LiveAppender | None = None
        self.hooks = RunHooks()  # this process's handler counters (metrics) and run spans (tracing)

    # -- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> OkeApp:
        await self.start()
        return self

    async def __aexit__(self, *_exc: Any) -> None:
        await self.close()

    async def start(self) -> None:
        """Boot: check the manifest, open the store, create the schema, record declarations."""
        if self.store is not None:
            return
        manifest = build_manifest(self._bindings if self._bindings is not None else current_bindings())
        check_routes(manifest.routes)
        store = make_store(
            self.database_url,
            busy_timeout_ms=self.busy_timeout_ms,
            sqlite_writer=self.sqlite_writer,
            listen_url=self.listen_url,
        )
        await store.open()
        try:
            declared_here = dict(manifest.signals)
            declared_here.update((s.name, s) for s in all_declared())
            binding_rows: list[tuple[str, str, str]] = [
                (name, f.name or "", manifest.signals[name].kind)
                for name, flows in manifest.signal_flows.items()
                for f in flows
            ]
            binding_rows += live_exposures(manifest)
            await store.write(
                lambda conn: registry.record(conn, self.name, declared_here.values(), binding_rows, self.binding_ttl_ms)
            )
            if manifest.clocks:
                await store.write(lambda conn: registry.record_clocks(conn, self.name, clock_rows(manifest)))
            _warn_of_other_once_flows(manifest, await store.read(registry.recent_flows))
            live_names = sorted(s.name for s in declared_here.values() if s.kind == "live")
            await store.write(lambda conn: tape.ensure_tapes(conn, live_names))
        except BaseException:
            await store.close()
            raise
        self.manifest = manifest
        self.hooks.counting = any(getattr(b.trigger, "metrics", False) for b in manifest.routes)
        self.store = store
        self._appender = LiveAppender(store, self._wake_live)
        self._stop_requested = asyncio.Event()
        self.background = Background(store, self.history_ttl_ms, self.retention_policy)
        self.background.start()

    async def stop(self) -> None:
        """Ask `run()` / `serve()` to return: running handlers finish (within the grace period)."""
        self._stop_requested.set()

    async def close(self) -> None:
        self._stop_requested.set()
        if self._http is not None:
            self._http.close()
        if self.store is not None:
            appender, self._appender = self._appender, None
            try:
                if appender is not None:
                    await appender.close()  # queued live appends commit (or fail) before the store goes
                background, self.background = self.background, None
                if background is not None:
                    await background.close()  # the last history counts are written
                await self._recorded.close()
            finally:
                store, self.store = self.store, None
                await store.close()

    def _require_store(self) -> Store:
        if self.store is None:
            raise not_started(self.name)
        return self.store

    # -- emit ------------------------------------------------------------------------------
    def _resolve(self, target: Signal | str) -> Signal:
        if isinstance(target, Signal):
            return target
        if isinstance(target, str):
            check_name(target, "emit")
            assert self.manifest is not None
            found = self.manifest.signals.get(target) or declared(target)
            if found is None:
                raise LookupError(f'emit("{target}"): no signal of that name is declared in this process')
            return found
        raise TypeError(f"emit(): expected a signal or a signal name, got {type(target).__name__}")

    async def _read_bindings(self, signal: str) -> registry.Recorded:
        return await self._require_store().read(lambda conn: registry.recorded_flows(conn, signal))

    async def _flows_of(self, signal: Signal) -> list[str]:
        """Subscribers: this process's flows (or live exposures), else those other processes
        recorded (engine/bindings_cache.py)."""
        assert self.manifest is not None and self.store is not None
        if signal.kind == "live":
            local = [path for name, path, _kind in live_exposures(self.manifest) if name == signal.name]
        else:
            local = [f.name or "" for f in self.manifest.signal_flows.get(signal.name, [])]
        if local and signal.kind != "broadcast":
            return local
        recorded = await self._recorded.get(signal.name)
        if signal.kind == "broadcast":  # copies for active bindings only, never for a retired one
            return sorted((set(local) | set(recorded.active)) - recorded.retired)
        return local or recorded.bound

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
        parent_run_id: str | None = None,
        emitter: str | None = None,
        conn: AsyncConnection | None = None,
        dedupe_for: object = None,
    ) -> str:
        """Validate and store a message; returns its id once committed (OKE1240, OKE1250). With
        `conn=`, it is written in the caller's transaction and exists iff that commits. With a
        `dedupe` key held by a pending or inflight message, stores nothing and returns that one's id;
        `dedupe_for="24h"` keeps the key held that long after this message finished."""
        store = self._require_store()
        target = self._resolve(signal)
        options = emit_options(target, delay, at, dedupe, priority, dedupe_for=dedupe_for)
        caller = self._caller(target, conn, "emit")
        check_emit_key(target, key)
        encoded = payloads.encode(target, payload, self.max_payload_bytes)
        flows = await self._subscribers(target, emitter)
        if target.kind == "live":
            return await self._append_live(target, encoded, parent_run_id)
        msg_id, rows = rows_for(target, encoded, key, parent_run_id, flows, options, tracing.current_traceparent())
        if rows:
            holder = await self._store_rows(store, target, rows, caller)
            if holder is not None:
                return holder
        return msg_id

    async def emit_many(
        self,
        signal: Signal | str,
        payloads: Iterable[Any],
        *,
        keys: Iterable[str | None] | None = None,
        delay: object = None,
        at: object = None,
        priority: int = 0,
        conn: AsyncConnection | None = None,
    ) -> list[str]:
        """Many messages of one signal in one transaction: all stored or none, in the order given;
        their ids in that order. A bad payload is OKE1250 naming its index, and nothing is stored."""
        store = self._require_store()
        target = self._resolve(signal)
        if target.kind == "live":
            raise TypeError(f'emit_many("{target.name}"): a live signal\'s events are appended one by one with emit')
        options = emit_options(target, delay, at, None, priority, "emit_many")
        caller = self._caller(target, conn, "emit_many")
        flows = await self._subscribers(target, None)
        ids, rows = rows_for_many(
            target, payloads, keys, flows, self.max_payload_bytes, tracing.current_traceparent(), options
        )
        if rows:
            await self._store_rows(store, target, rows, caller)
        return ids

    def _caller(self, target: Signal, conn: object, what: str) -> AsyncConnection | None:
        """The caller's transaction, checked against this app's database (None without `conn=`)."""
        if conn is None:
            return None
        if target.kind == "live":
            raise TypeError(
                f'{what}("{target.name}", conn=...): a live signal cannot be written in the caller\'s '
                "transaction (a tape's order is the engine's own commit order)"
            )
        return check_caller_connection(conn, self.database_url, f'{what}("{target.name}", conn=...)')

    async def _subscribers(self, target: Signal, emitter: str | None) -> list[str]:
        """The flows (or exposures) an emit reaches; OKE1240 when none and the signal is not optional."""
        try:
            flows = await self._flows_of(target)
        except Exception as err:  # reading the bindings other processes recorded
            if not is_outage(err):
                raise
            raise StoreUnavailable(
                f'emit("{target.name}"): the store is unreachable, so the message was not stored ({describe(err)})'
            ) from err
        if not flows and not target.optional:
            bind = MOUNT_AN_EXPOSURE if target.kind == "live" else BIND_A_FLOW
            raise OkeError.of(1240, flow=emitter or self.name, resource=target.name, bind=bind)
        return flows

    async def _store_rows(
        self, store: Store, target: Signal, rows: list[NewMessage], caller: AsyncConnection | None
    ) -> str | None:
        """Our own transaction, or the caller's (whose errors are the caller's to handle); the id of
        a dedupe key's holder when nothing was stored for it."""
        if caller is not None:
            return await store.enqueue_on(caller, rows)
        try:
            return await store.enqueue(rows)
        except Exception as err:
            if not is_outage(err):
                raise
            raise StoreUnavailable(
                f'emit("{target.name}"): the store did not confirm the write, so the '
                f"message may not be stored ({describe(err)})"
            ) from err

    async def _append_live(self, signal: Signal, encoded: str, parent_run_id: str | None) -> str:
        """Append to the tape; every connected stream on every process sees it.

        Concurrent emits on one tape share a transaction (engine/live/appender.py): one fsync or
        round trip for many events is what keeps emit→receive latency low under load.
        """
        if self._appender is None:
            raise AppendInterrupted(f'emit("{signal.name}"): the app is closing, so the event was not stored')
        try:
            return await self._appender.append(signal, encoded, parent_run_id)
        except AppendInterrupted:
            raise
        except Exception as err:
            if not is_outage(err):
                raise
            raise StoreUnavailable(
                f'emit("{signal.name}"): the store did not confirm the append, so the '
                f"event may not be stored ({describe(err)})"
            ) from err

    def _wake_live(self, signal_name: str) -> None:
        """After a committed append: the local hub reads it now rather than at its next poll."""
        if self._http is not None:
            self._http.wake(signal_name)

    # -- HTTP ------------------------------------------------------------------------------
    @property
    def asgi(self) -> HttpServer:
        """The ASGI application (HTTP routes + SSE); its lifespan boots the app if needed."""
        if self._http is None:
            routes = (
                self.manifest.routes
                if self.manifest is not None
                else [
                    b
                    for b in (self._bindings if self._bindings is not None else current_bindings())
                    if not is_signal_binding(b)
                ]
            )
            self._http = HttpServer(self._http_runtime(), routes)
        return self._http

    def _http_runtime(self) -> HttpRuntime:
        """What the HTTP server needs of this app (engine/runtime.py): asked for at each use, since
        the server may exist before `start()` and `start()` opens a new store and stop event."""
        return HttpRuntime(
            self.name,
            lambda: self.store,
            self.start,
            lambda: self._stop_requested.set(),
            self.emit,
            self.sse_heartbeat_s,
            self.hooks,
            max_payload_bytes=self.max_payload_bytes,
            max_connections=self.max_connections,
        )

    async def serve(self, host: str = "127.0.0.1", port: int = 6530, concurrency: int = 8) -> None:
        """Run HTTP/SSE and the workers until `stop()`; open streams end with `data: [DONE]`."""
        await self.start()
        self._stop_requested.clear()  # a server started again after stop() serves again
        self.asgi.reopen()
        server = self.asgi.uvicorn_server(host, port)
        server_task = asyncio.create_task(server.serve(), name="oke-http")
        workers = asyncio.create_task(self.run(concurrency), name="oke-workers")
        stopped = asyncio.create_task(self._stop_requested.wait())
        try:
            await asyncio.wait({server_task, stopped, workers}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._stop_requested.set()
            self.asgi.shutdown()
            server.should_exit = True
            await asyncio.gather(server_task, workers, return_exceptions=True)
            stopped.cancel()
        for task in (server_task, workers):
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    # -- workers ---------------------------------------------------------------------------
    def _routes(self) -> dict[str, Route]:
        assert self.manifest is not None
        routes: dict[str, Route] = {}
        for name, flows in self.manifest.signal_flows.items():
            sig = self.manifest.signals[name]
            for f in flows:
                routes[queue_name(name, f.name, sig.kind)] = Route(sig, f)
        return routes

    async def drain(self, concurrency: int = 8) -> None:
        """Run workers until no message of this app's flows is eligible (tests, scripts)."""
        runtime = self._runtime()
        self._stop_requested.clear()
        pool = WorkerPool(runtime, self._routes(), concurrency)
        async with self._worker_heartbeat(pool):
            await pool.run(until_idle=True)
        await history.flush_or_keep(runtime.store)  # what the drain did is in history when it returns

    async def run(self, concurrency: int = 8) -> None:
        """Run workers until `stop()`, refreshing this app's bindings' last_seen meanwhile."""
        runtime = self._runtime()
        pool = WorkerPool(runtime, self._routes(), concurrency)
        heartbeat = asyncio.create_task(self._heartbeat(), name="oke-bindings-heartbeat")
        ticks = asyncio.create_task(self._clock_runner().run(), name="oke-clocks")
        try:
            async with self._worker_heartbeat(pool):
                await pool.run(until_idle=False)
        finally:
            heartbeat.cancel()
            ticks.cancel()
            await asyncio.gather(heartbeat, ticks, return_exceptions=True)

    def _clock_runner(self) -> ClockRunner:
        """This app's clocks (engine/clock_runner.py): run by `run()` and `serve()`, not by `drain()`."""
        assert self.manifest is not None
        signals = self.manifest.signals
        clocks = {signals[name]: schedule for name, schedule in self.manifest.clocks.items()}
        return ClockRunner(self._require_store(), self.emit, clocks, self._stop_requested)

    def _worker_heartbeat(self, pool: WorkerPool) -> WorkerHeartbeat:
        """This pool's row in oke_workers: recorded before it claims, beating while it runs."""
        store = self._require_store()
        return WorkerHeartbeat(
            store, self.worker_id, self.name, pool.concurrency, lambda: pool.held, self.worker_heartbeat_s
        )

    async def _heartbeat(self) -> None:
        """Every BINDING_HEARTBEAT_S: this app still runs its flows (keeps them active)."""
        assert self.manifest is not None and self.store is not None
        pairs = [(name, f.name or "") for name, flows in self.manifest.signal_flows.items() for f in flows]
        pairs += [(name, path) for name, path, _kind in live_exposures(self.manifest)]
        if not pairs:
            return
        while True:
            await asyncio.sleep(BINDING_HEARTBEAT_S)
            try:
                await self._require_store().write(lambda conn: registry.touch(conn, pairs))
            except Exception as err:  # the store is away: the next beat tries again
                if not is_outage(err):
                    raise
                log.warning(
                    "could not refresh the bindings' last_seen (%s); retrying in %.0fs",
                    describe(err),
                    BINDING_HEARTBEAT_S,
                )

    def _runtime(self) -> Runtime:
        """What the workers and their handlers' `Fx` need of this started app (engine/runtime.py)."""
        return Runtime(
            self._require_store(),
            self.worker_id,
            self.lease_ms,
            self.stop_grace_s,
            self._stop_requested,
            self.emit,
            self.hooks,
        )


def _binding_ttl_ms(ttl: object) -> int:
    if not isinstance(ttl, str):
        raise TypeError(f'oke(binding_ttl=...): a duration string like "7d" or "12h", got {ttl!r}')
    ms = parse_duration_ms(ttl)
    if ms is None:
        raise ValueError(
            f'oke(binding_ttl=...): "{ttl}" is not a duration: use a positive integer and a '
            f'unit (ms, s, m, h, d), e.g. "7d"'
        )
    return ms


def _max_payload_bytes(value: object) -> int:
    """An int ≥ 1, refused at `oke()`: anything else made every emit and every HTTP request fail."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"oke(max_payload_bytes=...): an int of bytes ≥ 1, got {value!r}")
    return value


def _sse_heartbeat_s(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise TypeError(f"oke(sse_heartbeat_s=...): seconds > 0, got {value!r}")
    return float(value)


def _busy_timeout_ms(value: object) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise TypeError(f"oke(busy_timeout_ms=...): an int of milliseconds ≥ 0, got {value!r}")
    return value


def _heartbeat_s(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"oke(worker_heartbeat_s=...): seconds in (0, 5], got {value!r}")
    if not 0 < value <= DEFAULT_INTERVAL_S:
        raise ValueError(f"oke(worker_heartbeat_s=...): seconds in (0, 5], got {value!r}")
    return float(value)


def _warn_of_other_once_flows(manifest: Manifest, recent: dict[str, list[str]]) -> None:
    """OKE1071's text as a warning when a process seen lately binds another flow to one of our once
    signals: they would split its messages. Boot goes on (a rolling rename must not deadlock)."""
    for name, flows in sorted(manifest.signal_flows.items()):
        if manifest.signals[name].kind != "once":
            continue
        mine = [f.name or "" for f in flows]
        others = [f for f in recent.get(name, []) if f not in mine]
        if others:
            listed = ", ".join(f'"{f}"' for f in mine + others)
            log.warning(
                "%s (Another process seen in the last 5 minutes binds %s; the flows split the messages between them.)",
                OkeError.of(1071, signal=name, flows=listed),
                ", ".join(f'"{f}"' for f in others),
            )


def clock_rows(manifest: Manifest) -> list[tuple[str, str, str, str, bool]]:
    """(flow, implicit signal, spec, tz, catch_up) of each clock in `manifest`, as oke_clocks keeps them."""
    return [
        (flows[0].name or "", name, schedule.spec, schedule.tz, schedule.catch_up)
        for name, schedule in sorted(manifest.clocks.items())
        for flows in [manifest.signal_flows[name]]
    ]


def live_exposures(manifest: Manifest) -> list[tuple[str, str, str]]:
    """(signal, "http GET /path", "live") for every live exposure bound in `manifest`: a live
    signal's subscribers, recorded at boot so an emitter in another process finds them too."""
    return sorted(
        {
            (b.trigger.live_signal.name, exposure_label(b.trigger.method, b.trigger.path), "live")
            for b in manifest.routes
            if getattr(b.trigger, "live_signal", None) is not None
        }
    )


def exposure_label(method: str, path: str) -> str:
    """`http GET /path`, or a digest of the path when that would not fit the 200-character column."""
    label = f"http {method} {path}"
    if len(label) <= MAX_NAME_LENGTH:
        return label
    return f"http {method} {path[:100]}…{hashlib.sha256(path.encode()).hexdigest()[:32]}"


def oke(
    name: str,
    *,
    database_url: str | None = None,
    bindings: list[Binding] | None = None,
    lease_ms: int = 30_000,
    worker_id: str | None = None,
    binding_ttl: str = registry.DEFAULT_BINDING_TTL,
    **options: Any,
) -> OkeApp:
    """Declare an embedded engine app; boot it with `async with`."""
    return OkeApp(
        name,
        database_url=database_url,
        bindings=bindings,
        lease_ms=lease_ms,
        worker_id=worker_id,
        binding_ttl=binding_ttl,
        **options,
    )
