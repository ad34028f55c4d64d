"""Flows, `on()` bindings, and the manifest checks made at boot (OKE10xx).

`flow()` wraps a handler; `on(trigger, flow)` binds it. Bindings collect in a
process registry that `oke()` adopts, so declaring them is import-time code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .clocks import Clock, Schedule, signal_name
from .durations import option_seconds
from .errors import OkeError
from .signals import MAX_NAME_LENGTH, Signal, check_name, declared, signal

Handler = Callable[..., Any]


@dataclass(frozen=True, eq=False)
class Flow:
    """A named unit of work. `reads` lists the resources (`signal:<name>`) it may read."""

    name: str | None
    do: Handler | None
    durable: bool = False
    reads: frozenset[str] = frozenset()
    timeout_s: float | None = None  # an attempt running longer is cancelled and fails with code Timeout

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.do is None:
            raise TypeError(f'flow "{self.name}" has no handler')
        return self.do(*args, **kwargs)

    def __repr__(self) -> str:
        return f"flow({self.name!r})"


def _check_effects(effects: object) -> frozenset[str]:
    if effects is None:
        return frozenset()
    if not isinstance(effects, dict):
        raise TypeError('flow(effects=...): effects must be a dict like {"reads": ["signal:tasks.email"]}')
    unknown = set(effects) - {"reads"}
    if unknown:
        raise TypeError(f"flow(effects=...): unknown effect {sorted(unknown)[0]!r} (known: reads)")
    reads = effects.get("reads", [])
    if isinstance(reads, str) or not all(isinstance(r, str) for r in reads):
        raise TypeError('flow(effects=...): "reads" must be a list of strings like "signal:tasks.email"')
    return frozenset(reads)


def flow(
    name: str | None = None,
    *,
    do: Handler | None = None,
    durable: bool = False,
    effects: dict[str, Any] | None = None,
    timeout: str | float | timedelta | None = None,
) -> Any:
    """A Flow when `do` is given, else a decorator that turns a function into one."""
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise TypeError(f"flow(name): the name must be a non-empty string, got {name!r}")
    if name is not None:
        # the store keeps flow names beside signal names (200 characters): same rules
        check_name(name, "flow", what="flow")
    if not isinstance(durable, bool):
        raise TypeError(f"flow(durable=...): durable is a flag (True or False), got {durable!r}")
    reads = _check_effects(effects)
    timeout_s = None if timeout is None else option_seconds(timeout, f"flow({name!r}, timeout=...)")
    if do is not None:
        if not callable(do):
            raise TypeError(f"flow(do=...): do must be callable, got {do!r}")
        return Flow(name=name, do=do, durable=durable, reads=reads, timeout_s=timeout_s)

    def decorate(handler: Handler) -> Flow:
        if not callable(handler):
            raise TypeError(f"@flow: expected a function, got {handler!r}")
        return Flow(name=name, do=handler, durable=durable, reads=reads, timeout_s=timeout_s)

    return decorate


@dataclass(frozen=True, eq=False)
class Binding:
    """One `on(trigger, flow)`: a signal (or an HTTP route) and the flow it runs. A clock's binding
    is its implicit signal's, with the clock's schedule beside it."""

    trigger: Any
    flow: Flow
    clock: Schedule | None = None


_BINDINGS: list[Binding] = []
# `on(route, ...)` is handed to these (the HTTP layer registers one); NotImplemented means "not mine".
RouteBinder = Callable[[Any, Flow | Handler | None], Any]
_ROUTE_BINDER: list[RouteBinder] = []


@dataclass(frozen=True)
class SignalName:
    """`on("name", ...)` for a name not declared yet: declarations and bindings may come in any
    order (modules import in whatever order they do), so the name is looked up again at boot."""

    name: str

    def resolve(self) -> Signal:
        found = declared(self.name)
        if found is None:
            raise LookupError(
                f'on("{self.name}"): no signal of that name is declared in this process '
                "(looked up at boot: declare it with signal.once/broadcast/live before the app starts)"
            )
        return found


def _resolve_trigger(trigger: object) -> Any:
    if isinstance(trigger, str):
        check_name(trigger, "on")  # a name no signal could have fails now, not at boot
        return declared(trigger) or SignalName(trigger)
    return trigger


def is_signal_binding(binding: Binding) -> bool:
    """A binding to a signal (declared, or named and resolved at boot) rather than to an HTTP route."""
    return isinstance(binding.trigger, (Signal, SignalName))


def on(trigger: Any, bound: Flow | Handler | None = None) -> Any:
    """Bind a flow to a signal (or an HTTP route): `on(sig, flow)` or `@on(sig)` over a flow."""
    trigger = _resolve_trigger(trigger)
    if isinstance(trigger, Clock):
        return _on_clock(trigger, bound)
    if not isinstance(trigger, (Signal, SignalName)):
        for binder in _ROUTE_BINDER:
            result = binder(trigger, bound)
            if result is not NotImplemented:
                return result
        raise TypeError(f"on(): expected a signal, a signal name or an HTTP route, got {trigger!r}")

    def bind(target: Flow | Handler) -> Flow:
        if not isinstance(target, Flow):
            if not callable(target):
                raise TypeError(f"on({trigger.name!r}): expected a flow, got {target!r}")
            target = Flow(name=None, do=target)
        _BINDINGS.append(Binding(trigger, target))
        return target

    return bind if bound is None else bind(bound)


def _on_clock(trigger: Clock, bound: Flow | Handler | None) -> Any:
    """`on(clock.every(...) / clock.cron(...), flow)`: the flow consumes the implicit once signal
    `clock.<flow name>`, and the app emits one message of it per tick (engine/clock_runner.py)."""

    def bind(target: Flow | Handler) -> Flow:
        if not isinstance(target, Flow) or target.name is None:
            raise TypeError(f"on({trigger!r}): expected a named flow (its name names the clock), got {target!r}")
        name = signal_name(target.name)
        if len(name) > MAX_NAME_LENGTH:
            limit = MAX_NAME_LENGTH - len(signal_name(""))
            raise ValueError(
                f'on({trigger!r}, flow "{target.name[:40]}…"): a clock\'s flow name has at most {limit} characters'
            )
        schedule = trigger.checked(target.name)
        ticks = signal.once(name, description=f"ticks of {schedule.spec} ({schedule.tz}) for {target.name}")
        _BINDINGS.append(Binding(ticks, target, clock=schedule))
        return target

    return bind if bound is None else bind(bound)


def register_route_binder(binder: RouteBinder) -> None:
    """Let the HTTP layer handle `on(route, ...)` without this module importing it."""
    if binder not in _ROUTE_BINDER:
        _ROUTE_BINDER.append(binder)


def add_binding(binding: Binding) -> None:
    _BINDINGS.append(binding)


def current_bindings() -> list[Binding]:
    return list(_BINDINGS)


def forget_bindings() -> None:
    _BINDINGS.clear()


@dataclass
class Manifest:
    """The checked set of signal bindings an app runs."""

    signal_flows: dict[str, list[Flow]] = field(default_factory=dict)
    signals: dict[str, Signal] = field(default_factory=dict)
    routes: list[Binding] = field(default_factory=list)
    clocks: dict[str, Schedule] = field(default_factory=dict)  # implicit signal -> its schedule


def build_manifest(bindings: list[Binding]) -> Manifest:
    """Check the bindings (OKE1071, OKE1072, live-as-worker) and index them by signal."""
    manifest = Manifest()
    for binding in bindings:
        trigger = binding.trigger
        if isinstance(trigger, SignalName):
            trigger = trigger.resolve()
        if not isinstance(trigger, Signal):
            manifest.routes.append(binding)
            continue
        if binding.flow.name is None:
            raise OkeError.of(1072, trigger=trigger.name)
        if trigger.kind == "live":
            raise TypeError(
                f'on(signal.live("{trigger.name}"), flow "{binding.flow.name}"): a live signal '
                f"is a tape, not a queue; expose it with on(http.live(signal)) instead"
            )
        manifest.signals[trigger.name] = trigger
        if binding.clock is not None:
            manifest.clocks[trigger.name] = binding.clock
        flows = manifest.signal_flows.setdefault(trigger.name, [])
        namesake = next((f for f in flows if f.name == binding.flow.name), None)
        if namesake is not None and _same_work(namesake, binding.flow):
            continue  # one flow bound twice: still one consumer
        flows.append(binding.flow)
        if namesake is not None and trigger.kind != "once":
            raise ValueError(
                f'on(signal.broadcast("{trigger.name}")): flow "{namesake.name}" is bound twice '
                f"with different handlers ({_handler_name(namesake)} and "
                f"{_handler_name(binding.flow)}); a broadcast copy goes to each flow by name, "
                f"so give each handler its own flow name"
            )
    for name, flows in manifest.signal_flows.items():  # after all bindings: OKE1071 names every flow
        if manifest.signals[name].kind == "once" and len(flows) > 1:
            raise OkeError.of(1071, signal=name, flows=", ".join(f'"{f.name}"' for f in flows))
    return manifest


def _same_work(a: Flow, b: Flow) -> bool:
    """One Flow object bound twice, or two Flow objects of one handler with the same options."""
    return a is b or (a.do is b.do and a.durable == b.durable and a.reads == b.reads)


def _handler_name(f: Flow) -> str:
    return getattr(f.do, "__qualname__", None) or repr(f.do)
