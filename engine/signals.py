"""Signal declarations: `signal.once`, `signal.broadcast`, `signal.live`, and their option checks.

A Signal is a plain, immutable description; it does nothing until an app boots
with flows bound to it. Every option is checked here, at declare time, so a
typo fails on import rather than on the first emit at 3 a.m.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter

from .durations import MAX_RATE_COUNT, parse_duration_ms, parse_rate
from .timing import Backoff, parse_backoff

Kind = Literal["once", "broadcast", "live"]
MAX_NAME_LENGTH = 200
_OPTIONS = {
    "schema", "retries", "dead_letter", "optional", "retention", "description", "backoff", "concurrency", "rate",
}  # fmt: skip


@dataclass(frozen=True)
class Retention:
    """How long a live tape keeps events: by age, by count, or both (None = unbounded)."""

    max_age_ms: int | None = None
    max_count: int | None = None
    max_age: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.max_age is not None:
            out["max_age"] = self.max_age
        if self.max_count is not None:
            out["max_count"] = self.max_count
        return out


@dataclass(frozen=True, eq=False)
class Signal:
    """A declared signal. Handles compare by identity; the registry keys them by name."""

    name: str
    kind: Kind
    schema: Any = None
    retries: int = 3
    dead_letter: bool = True
    optional: bool = False
    retention: dict[str, Any] | None = None
    description: str = ""
    retention_rule: Retention = field(default_factory=Retention)
    backoff: Backoff | None = None  # None: a failed attempt is due again at once
    # Flow limits, across every process sharing the store (engine/store/sql/gates.py): at most
    # `concurrency` inflight at once, at most N handler starts per window of `rate` ("N/duration").
    concurrency: int | None = None
    rate: str | None = None

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.rate is not None

    def __repr__(self) -> str:
        return f"signal.{self.kind}({self.name!r})"


def check_name(name: object, where: str = "signal", what: str = "signal") -> str:
    """A signal (or flow) name is 1–200 characters with no control characters."""
    if not isinstance(name, str):
        raise TypeError(f"{where}: the name must be a string, got {type(name).__name__}")
    if not 1 <= len(name) <= MAX_NAME_LENGTH:
        raise ValueError(
            f"{where}({name[:40]!r}): a {what} name has 1 to {MAX_NAME_LENGTH} characters, this one has {len(name)}"
        )
    bad = [ch for ch in name if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp")]
    if bad:
        raise ValueError(f"{where}({name!r}): a {what} name may not contain control characters (found {bad[0]!r})")
    return name


def _check_schema(label: str, schema: object) -> None:
    if schema is None or isinstance(schema, TypeAdapter):
        return
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return
    if isinstance(schema, type) or not callable(schema):
        raise TypeError(
            f"{label}: schema must be a pydantic model class, a pydantic TypeAdapter "
            f"or a callable f(value) -> value, got {schema!r}"
        )


def _check_retention(label: str, retention: object) -> Retention:
    if retention is None:
        return Retention()
    if not isinstance(retention, dict):
        raise TypeError(f'{label}: retention must be a dict like {{"max_age": "24h", "max_count": 1000}}')
    unknown = set(retention) - {"max_age", "max_count"}
    if unknown:
        raise TypeError(f"{label}: unknown retention option {sorted(unknown)[0]!r} (known: max_age, max_count)")
    max_age = retention.get("max_age")
    max_age_ms = None
    if max_age is not None:
        max_age_ms = parse_duration_ms(max_age)
        if max_age_ms is None:
            raise ValueError(f'{label}: retention.max_age must be a duration like "24h" or "30s"')
    max_count = retention.get("max_count")
    if max_count is not None and (isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1):
        raise ValueError(f"{label}: retention.max_count must be an integer ≥ 1")
    return Retention(max_age_ms=max_age_ms, max_count=max_count, max_age=max_age)


def check_concurrency(label: str, value: object) -> int | None:
    """A concurrency limit: None, or an int ≥ 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{label}: concurrency must be an int ≥ 1 (or None), got {value!r}")
    return value


def check_rate(label: str, value: object) -> str | None:
    """A rate limit: None, or "N/duration" with 1 ≤ N ≤ MAX_RATE_COUNT, such as "100/1m" or "5/s"."""
    if value is None:
        return None
    if parse_rate(value) is None:
        raise ValueError(
            f'{label}: rate must be "N/duration" with N from 1 to {MAX_RATE_COUNT:,} and a duration '
            f'such as "100/1m" or "5/s", got {value!r}'
        )
    assert isinstance(value, str)
    return value


def _check_limits(label: str, kind: Kind, options: dict[str, Any]) -> tuple[int | None, str | None]:
    if kind == "live" and ("concurrency" in options or "rate" in options):
        raise TypeError(f"{label}: concurrency and rate are for once and broadcast signals (a live tape runs nothing)")
    return check_concurrency(label, options.get("concurrency")), check_rate(label, options.get("rate"))


def _declare(kind: Kind, name: object, options: dict[str, Any]) -> Signal:
    label = f"signal.{kind}({name!r})" if not isinstance(name, str) else f'signal.{kind}("{name}")'
    unknown = set(options) - _OPTIONS
    if unknown:
        raise TypeError(f"{label}: unknown option {sorted(unknown)[0]!r} (known: {', '.join(sorted(_OPTIONS))})")
    check_name(name, f"signal.{kind}")
    assert isinstance(name, str)
    retries = options.get("retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise TypeError(f"{label}: retries must be an int ≥ 0, got {retries!r}")
    dead_letter = options.get("dead_letter", True)
    if not isinstance(dead_letter, bool):
        raise TypeError(f"{label}: dead_letter is a flag (True or False), got {dead_letter!r}")
    optional = options.get("optional", False)
    if not isinstance(optional, bool):
        raise TypeError(f"{label}: optional is a flag (True or False), got {optional!r}")
    schema = options.get("schema")
    _check_schema(label, schema)
    if "retention" in options and kind != "live":
        raise TypeError(f"{label}: retention is only valid with signal.live")
    rule = _check_retention(label, options.get("retention"))
    if "backoff" in options and kind == "live":
        raise TypeError(f"{label}: backoff is for once and broadcast signals (a live tape has no attempts)")
    backoff = parse_backoff(label, options.get("backoff"))
    concurrency, rate = _check_limits(label, kind, options)
    description = options.get("description", name)
    if not isinstance(description, str):
        raise TypeError(f"{label}: description must be a string")
    declared = Signal(
        name=name,
        kind=kind,
        schema=schema,
        retries=retries,
        dead_letter=dead_letter,
        optional=optional,
        retention=rule.as_dict() or None,
        description=description or name,
        retention_rule=rule,
        backoff=backoff,
        concurrency=concurrency,
        rate=rate,
    )
    _REGISTRY[name] = declared
    return declared


_REGISTRY: dict[str, Signal] = {}


def declared(name: str) -> Signal | None:
    """The signal declared under `name` in this process, if any."""
    return _REGISTRY.get(name)


def all_declared() -> list[Signal]:
    """Every signal declared in this process, in declaration order."""
    return list(_REGISTRY.values())


def forget_declarations() -> None:
    _REGISTRY.clear()


class _SignalFactory:
    """The `signal` namespace: `signal.once(...)`, `signal.broadcast(...)`, `signal.live(...)`."""

    @staticmethod
    def once(name: str, **options: Any) -> Signal:
        """A competing-consumer work queue: one worker handles each message."""
        return _declare("once", name, options)

    @staticmethod
    def broadcast(name: str, **options: Any) -> Signal:
        """Every bound flow gets its own copy of each message."""
        return _declare("broadcast", name, options)

    @staticmethod
    def live(name: str, **options: Any) -> Signal:
        """A retained event tape served over Server-Sent Events."""
        return _declare("live", name, options)


signal = _SignalFactory()
