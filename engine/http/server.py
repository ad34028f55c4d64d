"""The ASGI application: live exposures over SSE, flow routes, gates, JSON error envelopes."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from ..errors import OkeError, StoreUnavailable
from ..flows import Binding
from ..fx import Fx, LiveBody
from ..live import tape
from ..live.hub import HubRegistry
from ..live.stream import REPLAY_BATCH, StreamControl, live_stream
from ..ops.records import to_json
from ..store.outage import describe, is_outage
from .assets import client_js
from .limits import BodyLimit, PayloadTooLarge
from .routes import Gate, HttpError, Route, check_routes, exposure_match, param_match

if TYPE_CHECKING:
    from ..runtime import HttpRuntime

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}
MAX_TAIL = 10_000
MAX_CURSOR_ECHO = 128  # characters of a refused cursor that a 410 quotes back
_TAIL = re.compile(r"[0-9]{1,9}")


def envelope(
    status: int, code: str, message: str, data: dict[str, Any] | None = None, oke: int | None = None
) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": message}
    if oke is not None:
        error["oke"] = oke
    if data is not None:
        error["data"] = data
    return JSONResponse({"data": None, "error": error}, status_code=status)


def resume_gap(signal: str, cursor: str, gap: tape.Gap) -> JSONResponse:
    """The 410 for a cursor the tape cannot honour; it quotes at most 128 characters of the cursor
    (a header may hold kilobytes of anything, and the answer need not carry them back)."""
    quoted = cursor[:MAX_CURSOR_ECHO]
    return envelope(
        410,
        "LiveResumeGap",
        f'Cursor "{quoted}" missing on "{signal}".',
        oke=1210,
        data={"signal": signal, "afterId": quoted, "reason": gap.reason, "firstId": gap.first_id, "missed": gap.missed},
    )


def too_large(err: PayloadTooLarge) -> JSONResponse:
    """The 413 envelope, with `Connection: close`: uvicorn then drops the socket instead of reading
    (and discarding) the rest of the body."""
    response = envelope(err.status, err.code, err.message)
    response.headers["Connection"] = "close"
    return response


@dataclass(frozen=True)
class _Compiled:
    """A route matched segment by segment against the request's decoded path segments."""

    binding: Binding
    segments: tuple[re.Pattern[str] | str, ...]

    @property
    def route(self) -> Route:
        route: Route = self.binding.trigger
        return route

    @property
    def specificity(self) -> tuple[int, ...]:
        """Static segments sort before params, segment by segment: /orders/vip beats /orders/:id."""
        return tuple(1 if isinstance(seg, re.Pattern) else 0 for seg in self.segments)

    def match(self, segments: list[str]) -> dict[str, str] | None:
        if len(segments) != len(self.segments):
            return None
        params: dict[str, str] = {}
        for want, got in zip(self.segments, segments, strict=False):
            if isinstance(want, str):
                if want != got:
                    return None
                continue
            found = want.fullmatch(got)
            if found is None:
                return None
            params.update(found.groupdict())
        return params


def _compile(path: str) -> tuple[re.Pattern[str] | str, ...]:
    out: list[re.Pattern[str] | str] = []
    for segment in path.split("/")[1:]:
        if ":" not in segment:
            out.append(segment)
            continue
        parts = re.split(r"(:[A-Za-z_][A-Za-z0-9_]*)", segment)
        out.append(
            re.compile("".join(f"(?P<{p[1:]}>.+)" if p.startswith(":") else re.escape(p) for p in parts), re.DOTALL)
        )
    return tuple(out)


def _segments(raw_path: str) -> list[str] | None:
    """The path's segments, each percent-decoded once; None for a path no route may match.

    Splitting before decoding keeps an encoded slash inside its segment (a param may hold one);
    empty segments (`//`, a trailing `/`) and dot segments (`.`, `..`, also when encoded) are
    refused outright rather than normalised, so no spelling of a path reaches another route.
    One exception: the name in `/_oke/live/{name}` may be an encoded `%2E` or `%2E%2E`, the only
    spelling by which a signal named "." or ".." can be asked for (clients normalise a bare `..`
    away); it names a declared signal, never a place in the path.
    """
    if not raw_path.startswith("/"):
        return None
    raw = raw_path[1:].split("/")
    segments = [unquote(seg, errors="strict") for seg in raw]
    if raw_path == "/":
        return segments
    firehose_name = len(segments) == 3 and segments[0] == "_oke" and segments[1] == "live"
    for index, (spelled, seg) in enumerate(zip(raw, segments, strict=False)):
        if seg == "" or "\x00" in seg or spelled in (".", ".."):
            return None
        if seg in (".", "..") and not (firehose_name and index == 2):
            return None
    return segments


class HttpServer:
    """Routes requests to live exposures and flows; ends open streams on shutdown."""

    def __init__(self, runtime: HttpRuntime, bindings: list[Binding]) -> None:
        check_routes(bindings)
        self.runtime = runtime
        self.firehoses: dict[str, Binding] = {}  # one per signal: a second is OKE1041 at boot
        self.routes: list[_Compiled] = []
        self.metrics_route: Route | None = None  # GET /_oke/metrics, when the app mounts it
        self._metrics: Any = None  # its MetricsEndpoint, made at the first scrape
        for b in bindings:
            route: Route = b.trigger
            if route.metrics:
                self.metrics_route = route
            elif route.firehose:
                self.firehoses[route.live_signal.name] = b  # type: ignore[union-attr]
            else:
                self.routes.append(_Compiled(b, _compile(route.path)))
        self.routes.sort(key=lambda c: c.specificity)  # stable: among equals, binding order
        self.control = StreamControl()
        self.heartbeat_s = runtime.heartbeat_s
        self._hubs: HubRegistry | None = None

    @property
    def live_signals(self) -> list[Any]:
        found = {
            b.trigger.live_signal.name: b.trigger.live_signal
            for b in self.firehoses_and_routes()
            if b.trigger.live_signal is not None
        }
        return list(found.values())

    def firehoses_and_routes(self) -> list[Binding]:
        return list(self.firehoses.values()) + [c.binding for c in self.routes]

    def hubs(self) -> HubRegistry:
        store = self.runtime.require_store()
        if self._hubs is None or self._hubs.store is not store:
            self._hubs = HubRegistry(store)
        return self._hubs

    def wake(self, signal: str) -> None:
        if self._hubs is not None:
            self._hubs.wake(signal)

    def shutdown(self) -> None:
        """End every open stream with `data: [DONE]`; streams opened from now on end at once."""
        self.control.close_all()

    def close(self) -> None:
        """End every open stream and stop the tapes' readers: the app is closing its store."""
        self.shutdown()
        if self._hubs is not None:
            self._hubs.close()
            self._hubs = None

    def reopen(self) -> None:
        """Serve streams again after a shutdown (a server started anew in the same process)."""
        if self.control.closing:
            self.control = StreamControl()

    def uvicorn_server(self, host: str, port: int, **options: Any) -> Any:
        """A uvicorn server for this app whose exit (stop, SIGINT, SIGTERM) first ends the streams.

        uvicorn waits for open connections before it returns; SSE streams never end by themselves,
        so without this a signal would wait out the graceful timeout and cut them without [DONE].

        Its limits: request headers within 10 s (engine/http/protocol.py), and `max_connections`
        by uvicorn's `limit_concurrency`, which answers 503 to a request that arrives while that many
        connections are open (idle, half-sent and streaming ones alike) or that many requests run.
        It counts the asking connection too, hence N + 1: N connections are served, one more is not.
        """
        import uvicorn

        from .protocol import HeaderDeadlineProtocol

        http = self

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                def end_streams() -> None:
                    http.shutdown()
                    http.runtime.request_stop()

                try:  # from a signal handler: hand the work to the loop rather than run it mid-step
                    asyncio.get_running_loop().call_soon_threadsafe(end_streams)
                except RuntimeError:
                    end_streams()
                super().handle_exit(sig, frame)

        config = uvicorn.Config(
            self,
            host=host,
            port=port,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=5,
            http=HeaderDeadlineProtocol,
            limit_concurrency=self.runtime.max_connections + 1,
            **options,
        )
        return Server(config)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = BodyLimit(self.runtime.max_payload_bytes)
        if body.declared_over(scope):  # refused before any route, gate or read
            response: Response = too_large(PayloadTooLarge(body.limit))
        else:
            response = await self._dispatch(Request(scope, body.counting(receive)))
        await response(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.reopen()
                try:
                    await self.runtime.start()
                except Exception as err:
                    await send({"type": "lifespan.startup.failed", "message": str(err)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _dispatch(self, request: Request) -> Response:
        try:
            raw_path = request.scope.get("raw_path") or request.scope["path"].encode()
            segments = _segments(raw_path.decode("latin-1").split("?", 1)[0])
            if segments is None:
                return PlainTextResponse("Not Found", status_code=404)
            if segments[0] == "_oke":  # the engine's own paths; user routes cannot start with /_oke/
                if len(segments) == 3 and segments[1] == "live":
                    return await self._firehose(request, segments[2])
                if segments == ["_oke", "client.js"]:
                    return client_js(request)
                if segments == ["_oke", "exposures"] and request.method == "GET":
                    return JSONResponse({"data": await self.exposures(request), "error": None})
                if segments == ["_oke", "metrics"] and self.metrics_route is not None:
                    return await self._scrape(request, self.metrics_route)
                return PlainTextResponse("Not Found", status_code=404)
            allowed = False
            for compiled in self.routes:
                params = compiled.match(segments)
                if params is None:
                    continue
                allowed = True
                if compiled.route.method == request.method:
                    return await self._route(request, compiled, params)
            if allowed:
                return PlainTextResponse("Method Not Allowed", status_code=405)
            return PlainTextResponse("Not Found", status_code=404)
        except PayloadTooLarge as err:  # a body counted past the limit as a gate or a route read it
            return too_large(err)
        except HttpError as err:
            return envelope(err.status, err.code, err.message)
        except StoreUnavailable as err:  # the database is away: say so, and when to come back
            response = envelope(503, "StoreUnavailable", str(err))
            response.headers["Retry-After"] = "1"
            return response
        except UnicodeDecodeError:
            return envelope(400, "BadRequest", "the path is not valid UTF-8 once decoded")

    async def exposures(self, request: Request) -> list[dict[str, Any]]:
        """Live exposures for clients choosing a path by their params: those whose gates this caller
        passes (public ones to anyone), so a caller learns nothing of a route it may not open.

        Each gate is asked as a live request asks it, once per listing however many exposures
        share it; a gate's Unauthorized or Forbidden (any HttpError) hides its exposures.
        """
        verdicts: dict[int, bool] = {}  # id(gate) -> passed
        out = []
        for b in self.firehoses_and_routes():
            route: Route = b.trigger
            if route.live_signal is None or not await self._admits(route, request, verdicts):
                continue
            custom = b.flow.do is not None
            out.append(
                {
                    "signal": route.live_signal.name,
                    "path": route.path,
                    "params": list(route.params),
                    "gates": [g.name for g in route.gates],
                    "public": route.is_public,
                    "custom": custom,
                    "flow": b.flow.name if custom else None,
                    "match": exposure_match(b),
                }
            )
        return out

    async def _pass_gates(self, route: Route, request: Request) -> dict[str, Any]:
        return {g.name: await _ask(g, request) for g in route.gates}

    async def _admits(self, route: Route, request: Request, verdicts: dict[int, bool]) -> bool:
        for g in route.gates:
            if id(g) not in verdicts:
                try:
                    await _ask(g, request)
                    verdicts[id(g)] = True
                except PayloadTooLarge:
                    raise
                except HttpError:
                    verdicts[id(g)] = False
            if not verdicts[id(g)]:
                return False
        return True

    async def _scrape(self, request: Request, route: Route) -> Response:
        """The Prometheus exposition, behind the route's gates (engine/http/metrics.py)."""
        if request.method != "GET":
            return PlainTextResponse("Method Not Allowed", status_code=405)
        await self._pass_gates(route, request)
        from .metrics import MetricsEndpoint, subscriber_counts

        if self._metrics is None:
            hooks = self.runtime.hooks
            assert hooks is not None, "an app's HTTP runtime carries its hooks"
            self._metrics = MetricsEndpoint(hooks.handled)
        subscribers = subscriber_counts(self.live_signals, self._hubs)
        body = await self._metrics.scrape(self.runtime.require_store(), subscribers)
        return Response(body, media_type=self._metrics.content_type)

    async def _firehose(self, request: Request, name: str) -> Response:
        exposure = self.firehoses.get(name)
        if exposure is None:
            return PlainTextResponse("Not Found", status_code=404)
        if request.method != "GET":
            return PlainTextResponse("Method Not Allowed", status_code=405)
        await self._pass_gates(exposure.trigger, request)
        return await self._serve_live(request, exposure.trigger.live_signal, None)

    async def _route(self, request: Request, compiled: _Compiled, params: dict[str, str]) -> Response:
        route = compiled.route
        await self._pass_gates(route, request)
        binding = compiled.binding
        if route.live_signal is not None and binding.flow.do is None:
            return await self._serve_live(request, route.live_signal, param_match(params))
        value = await self._input(request, route, params)
        fx = Fx(self.runtime, binding.flow, exposes=route.live_signal.name if route.live_signal else None)
        handler = binding.flow.do
        assert handler is not None
        try:
            if inspect.iscoroutinefunction(handler):
                result = await handler(value, fx)
            else:  # sync handlers run in a thread, as workers run them
                result = await asyncio.to_thread(handler, value, fx)
                if inspect.isawaitable(result):
                    result = await result
        except HttpError:
            raise
        except OkeError as err:
            return envelope(400 if err.code == 1250 else 500, f"OKE{err.code}", str(err), oke=err.code)
        if isinstance(result, LiveBody):
            if route.live_signal is None or result.signal.name != route.live_signal.name:
                return envelope(500, "InternalError", "fx.live() returned for a route not exposing that signal")
            return await self._serve_live(request, result.signal, result.match)
        if isinstance(result, Response):  # a flow may answer with any Starlette response (HTML, redirects)
            return result
        try:
            return JSONResponse({"data": _jsonable(result), "error": None})
        except (TypeError, ValueError) as err:
            return envelope(500, "InternalError", f"the flow returned a value JSON cannot carry: {err}")

    async def _input(self, request: Request, route: Route, params: dict[str, str]) -> Any:
        value: Any = dict(request.query_params)
        value.update(params)
        if request.method in ("POST", "PUT", "PATCH"):
            body = await request.body()
            if body:
                try:
                    decoded = json.loads(body)
                except ValueError as err:
                    return _raise_bad(f"the body is not JSON: {err}")
                if isinstance(decoded, dict):
                    value.update(decoded)
                else:
                    value = decoded
        schema = route.input
        try:
            if isinstance(schema, type) and issubclass(schema, BaseModel):
                return schema.model_validate(value)
            if isinstance(schema, TypeAdapter):
                return schema.validate_python(value)
            if callable(schema):
                return schema(value)
        except ValidationError as err:
            _raise_bad(
                f"invalid input: {err.errors()[0].get('msg')} at "
                f"{'.'.join(str(p) for p in err.errors()[0].get('loc', ()))}"
            )
        except HttpError:
            raise
        except Exception as err:
            _raise_bad(f"invalid input: {err}")
        return value

    async def _serve_live(self, request: Request, signal: Any, match: Any) -> Response:
        """Check the cursor and read the first replay page in one transaction, then stream.

        With an age rule the same transaction prunes first (a write), so a cursor is judged against
        the tape as it stands; one round of the store per connection either way.
        """
        store = self.runtime.require_store()
        cursor = request.headers.get("last-event-id")
        if cursor is not None:
            cursor = cursor.strip(" \t")  # a field value excludes surrounding whitespace (RFC 9110 §5.5)
        else:
            cursor = request.query_params.get("lastEventId")
        tail = _tail(request) if not cursor else None
        name = signal.name

        def look(conn: Any) -> tuple[tape.TapeState | None, tape.Gap | None, int, list[tape.TapeEvent]]:
            if signal.retention_rule.max_age_ms is not None:
                tape.prune(conn, signal)
            state = tape.state(conn, name)
            if state is None:
                return None, None, 0, []
            if cursor:
                after, gap = tape.check_cursor(state, cursor)
                if gap is not None:
                    return state, gap, 0, []
                assert after is not None
            else:
                after = 0 if tail is None else max(state.head - tail, 0)
            return state, None, after, tape.read_after(conn, name, after, REPLAY_BATCH)

        run = store.write if signal.retention_rule.max_age_ms is not None else store.read
        try:
            state, gap, after, page = await run(look)
            if state is None:
                await store.write(lambda c: tape.ensure_tape(c, name))
                state, gap, after, page = await run(look)
                assert state is not None
        except Exception as err:
            if not is_outage(err):
                raise
            raise StoreUnavailable(f'live "{name}": the store is unreachable ({describe(err)})') from err
        if gap is not None:
            return resume_gap(name, cursor or "", gap)
        body = live_stream(
            store,
            self.hubs(),
            self.control,
            name,
            state.epoch,
            after,
            match,
            heartbeat_s=self.heartbeat_s,
            first_page=page,
            page_head=state.head,
        )
        return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)


async def _ask(g: Gate, request: Request) -> Any:
    """The gate's identity for this request; it raises Unauthorized / Forbidden to refuse."""
    result = g.check(request)
    if inspect.isawaitable(result):
        result = await result
    return result


def _tail(request: Request) -> int | None:
    """Without a cursor: the whole tape, or only the last N with ?tail=N (console extension)."""
    tail = request.query_params.get("tail")
    if tail is None:
        return None
    # ASCII digits only, and few: str.isdigit() admits "²" (int() then raises) and int() refuses
    # more than 4,300 digits; either was a 500
    if _TAIL.fullmatch(tail) is None or int(tail) > MAX_TAIL:
        raise _BadRequest(f"tail must be an integer from 0 to {MAX_TAIL}")
    return int(tail)


class _BadRequest(HttpError):
    status = 400
    code = "BadRequest"


def _raise_bad(message: str) -> Any:
    raise _BadRequest(message)


def _jsonable(value: Any) -> Any:
    """What a flow returned, as JSON-ready data: pydantic models by their JSON dump, the records
    of `engine.ops` and `fx` (frozen dataclasses) by their fields, at any depth."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(to_json(value))
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    json.dumps(value)  # anything else must be JSON already (a TypeError names what is not)
    return value
