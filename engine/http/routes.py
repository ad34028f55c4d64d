"""HTTP route declarations: `http.get/post/...(path)`, `http.live(signal)`, gates, `.public()`.

Routes are immutable builders: `.gate()`, `.public()` and `.live()` return new
routes. `on(route)` binds a live exposure; `on(route, flow)` binds a flow.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

from ..errors import OkeError
from ..flows import Binding, Flow, add_binding, register_route_binder
from ..signals import Signal

LIVE_PREFIX = "/_oke/live/"
METRICS_PATH = "/_oke/metrics"
_PARAM = re.compile(r":([A-Za-z_][A-Za-z0-9_]*)")


class HttpError(Exception):
    """An error with an HTTP status and a code for the JSON envelope."""

    status = 500
    code = "InternalError"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Unauthorized(HttpError):
    """Raised by a gate: no or bad credentials (401)."""

    status = 401
    code = "Unauthorized"


class Forbidden(HttpError):
    """Raised by a gate: known caller, not allowed (403)."""

    status = 403
    code = "Forbidden"


@dataclass(frozen=True)
class Gate:
    """A named check; `check(request)` returns an identity or raises Unauthorized / Forbidden."""

    name: str
    check: Callable[[Any], Any | Awaitable[Any]]


def gate(name: str, check: Callable[[Any], Any]) -> Gate:
    if not isinstance(name, str) or not name:
        raise TypeError("gate(name, check): the name must be a non-empty string")
    if not callable(check):
        raise TypeError(f'gate("{name}", check): check must be callable')
    return Gate(name, check)


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    gates: tuple[Gate, ...] = ()
    is_public: bool = False
    live_signal: Signal | None = None
    firehose: bool = False
    input: Any = None
    metrics: bool = False  # GET /_oke/metrics: the Prometheus exposition (engine/http/metrics.py)

    def gate(self, *gates: Gate) -> Route:
        for g in gates:
            if not isinstance(g, Gate):
                raise TypeError(f"{self.method} {self.path}: .gate() takes gates made by gate(name, check)")
        return replace(self, gates=self.gates + tuple(gates))

    def public(self) -> Route:
        return replace(self, is_public=True)

    def live(self, signal: Signal) -> Route:
        if self.method != "GET":
            raise TypeError("on(http.*.live(signal)): live exposure must be GET")
        if not isinstance(signal, Signal) or signal.kind != "live":
            raise TypeError(f"{self.method} {self.path}: .live() takes a signal.live(...) handle, got {signal!r}")
        return replace(self, live_signal=signal)

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(_PARAM.findall(self.path))

    def describe(self) -> str:
        return f"{self.method} {self.path}"


def param_text(value: Any) -> str:
    """How a value compares with a path param's text, on the server and in the client: a string
    as it is, anything else as JSON writes it (`true`/`false`, `7`, `1.5`, `null`)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def param_match(params: dict[str, str]) -> Callable[[Any], bool] | None:
    """Forward an event when every path param present on the payload equals the request's value."""
    if not params:
        return None

    def match(value: Any) -> bool:
        if not isinstance(value, dict):
            return True
        for name, wanted in params.items():
            if name in value and param_text(value[name]) != wanted:
                return False
        return True

    return match


def fill_path(path: str, params: dict[str, Any]) -> str:
    """`path` with each `:name` replaced by its value's text, percent-encoded (one segment each)."""
    return _PARAM.sub(lambda m: quote(param_text(params[m.group(1)]), safe=""), path)


def live_path(signal_name: str) -> str:
    """`/_oke/live/` and the name percent-encoded; "." and ".." as %2E (a bare dot segment is
    normalised away by every client, so it could never be asked for)."""
    encoded = quote(signal_name, safe="")
    return LIVE_PREFIX + (encoded.replace(".", "%2E") if encoded in (".", "..") else encoded)


class _Http:
    """The `http` namespace of route builders."""

    @staticmethod
    def _route(method: str, path: str, input: Any = None) -> Route:
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"http.{method.lower()}({path!r}): a path starts with '/'")
        if path.startswith("/_oke/"):
            raise ValueError(f"http.{method.lower()}({path!r}): /_oke/ is reserved for the engine")
        return Route(method, path, input=input)

    def get(self, path: str, *, input: Any = None) -> Route:
        return self._route("GET", path, input)

    def post(self, path: str, *, input: Any = None) -> Route:
        return self._route("POST", path, input)

    def put(self, path: str, *, input: Any = None) -> Route:
        return self._route("PUT", path, input)

    def patch(self, path: str, *, input: Any = None) -> Route:
        return self._route("PATCH", path, input)

    def delete(self, path: str, *, input: Any = None) -> Route:
        return self._route("DELETE", path, input)

    def live(self, signal: Signal) -> Route:
        """The firehose of a live tape at /_oke/live/{name}."""
        if not isinstance(signal, Signal) or signal.kind != "live":
            raise TypeError(f"http.live(): expected a signal.live(...) handle, got {signal!r}")
        return Route("GET", live_path(signal.name), live_signal=signal, firehose=True)

    def metrics(self) -> Route:
        """This process's view in the Prometheus text format at /_oke/metrics (gate it or make it public)."""
        return Route("GET", METRICS_PATH, metrics=True)


http = _Http()


def _bind_route(trigger: Any, bound: Flow | Callable[..., Any] | None) -> Any:
    if not isinstance(trigger, Route):
        return NotImplemented
    if bound is None and trigger.live_signal is None and not trigger.metrics:

        def bind(target: Any) -> Flow:
            flow: Flow = _bind_route(trigger, target)
            return flow

        return bind
    if trigger.metrics and bound is not None:
        raise TypeError("on(http.metrics()): the metrics route serves the engine's figures and takes no flow")
    if bound is not None and not isinstance(bound, Flow):
        if not callable(bound):
            raise TypeError(f"on({trigger.describe()}): expected a flow, got {bound!r}")
        bound = Flow(name=None, do=bound)
    target = bound if bound is not None else Flow(name=None, do=None)
    add_binding(Binding(trigger, target))
    return target if bound is not None else trigger


register_route_binder(_bind_route)


def exposure_match(binding: Binding) -> str:
    """The match part of a live exposure's identity: `custom:<flow>` for a custom flow,
    else the sorted path-param names joined by ", ", or `(firehose)` without params."""
    route: Route = binding.trigger
    if binding.flow.do is not None:
        return f"custom:{binding.flow.name or '(unnamed)'}"
    return ", ".join(sorted(set(route.params))) or "(firehose)"


def _gates_text(route: Route) -> str:
    names = {g.name for g in route.gates} | ({"public"} if route.is_public else set())
    return ", ".join(sorted(names))


def check_routes(bindings: list[Binding]) -> None:
    """Boot checks: every route gated or public, then OKE1041 (a method and path bound twice),
    then OKE1050 (two live exposures of a signal with the same gates and match, on any paths)."""
    for b in bindings:
        route: Route = b.trigger
        if not route.gates and not route.is_public:
            raise ValueError(f"{route.describe()}: every HTTP route needs .gate(...) or .public()")
    seen_paths: set[tuple[str, str]] = set()
    for b in bindings:
        route = b.trigger
        key = (route.method, route.path)
        if key in seen_paths:
            raise OkeError.of(1041, method=route.method, path=route.path, flow=b.flow.name or "(exposure)")
        seen_paths.add(key)
    seen_exposures: set[tuple[Any, ...]] = set()
    for b in bindings:
        route = b.trigger
        if route.live_signal is None:
            continue
        gates, match = _gates_text(route), exposure_match(b)
        # an unnamed custom flow is one flow object, however many paths it is bound on
        flow_identity = b.flow if b.flow.do is not None and b.flow.name is None else None
        ident = (route.live_signal.name, gates, route.is_public, match, flow_identity)
        if ident in seen_exposures:
            raise OkeError.of(1050, signal=route.live_signal.name, gates=gates, match=match)
        seen_exposures.add(ident)
