"""Payload checks at emit and re-validation before a handler runs.

A payload is stored as JSON text. It is checked against the signal's schema,
then encoded; any failure is OKE1250 and nothing is stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from .errors import OkeError
from .signals import Signal

DEFAULT_MAX_PAYLOAD_BYTES = 1_048_576
# Containers nested deeper than this are refused at emit: every reader of the stored JSON (the
# worker, the SSE hub, the console's renderers, other languages' parsers such as serde_json's
# default 128) recurses per level, and a payload must not be storable yet unreadable.
MAX_DEPTH = 128
# json.dumps expands a value that holds one big string or list many times; past this many times
# the limit (a lower bound of the encoded size) the payload is refused without encoding it.
_EXPANSION_GUARD = 8
# Compact JSON, refusing NaN and infinities. One encoder for every emit: json.dumps with options
# builds a new one per call, which an emit after an idle spell pays cold (docs/design/idle-path.md).
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _schema_failure(signal: Signal, detail: str) -> OkeError:
    return OkeError.of(1250, resource=signal.name, detail=detail)


def _describe_validation(err: ValidationError) -> str:
    parts = []
    for item in err.errors()[:5]:
        where = ".".join(str(p) for p in item.get("loc", ())) or "payload"
        parts.append(f"{where}: {item.get('msg')}")
    return "; ".join(parts)


def validate(signal: Signal, value: Any) -> Any:
    """The JSON-ready value after the signal's schema accepted it (raises OKE1250)."""
    schema = signal.schema
    # Dump by alias: the stored JSON must be what the schema accepts again when the handler's
    # payload is re-validated (a field `user_id` with alias "userId" validates only as "userId").
    try:
        if schema is None:
            return value.model_dump(mode="json", by_alias=True) if isinstance(value, BaseModel) else value
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            if isinstance(value, BaseModel) and not isinstance(value, schema):
                value = value.model_dump(mode="json", by_alias=True)
            return schema.model_validate(value).model_dump(mode="json", by_alias=True)
        if isinstance(schema, TypeAdapter):
            return schema.dump_python(schema.validate_python(value), mode="json", by_alias=True)
        return schema(value)
    except ValidationError as err:
        raise _schema_failure(signal, _describe_validation(err)) from err
    except OkeError:
        raise
    except Exception as err:  # a callable schema may raise anything
        raise _schema_failure(signal, f"{type(err).__name__}: {err}") from err


def encode(signal: Signal, value: Any, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Validate and encode a payload as JSON text, refusing what JSON cannot carry."""
    checked = validate(signal, value)
    try:
        _check_tree(checked, max_bytes)
    except _Shape as err:
        steps = [f"[{step!r}]" for step in reversed(err.path)]
        where = "payload" + "".join(steps if len(steps) <= 8 else steps[:6] + ["…"] + steps[-1:])
        raise _schema_failure(signal, err.detail.replace("{where}", where)) from None
    try:
        text = _ENCODER.encode(checked)
    except (TypeError, ValueError, RecursionError) as err:
        raise _schema_failure(signal, f"payload is not JSON-serializable ({type(err).__name__}: {err})") from err
    ascii_only = text.isascii()
    size = len(text) if ascii_only else len(text.encode("utf-8", errors="surrogatepass"))
    if size > max_bytes:
        raise _schema_failure(signal, f"payload is {size} bytes; the limit is {max_bytes} bytes")
    if not ascii_only:  # it may hold a lone surrogate, which UTF-8 cannot carry
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise _schema_failure(signal, f"payload holds a lone surrogate character ({err.reason})") from err
    return text


class _Shape(Exception):
    """What `_check_tree` found; `path` collects the keys and indexes on the way out."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.path: list[Any] = []


_CONTAINERS = (dict, list, tuple)


def _check_tree(value: Any, max_bytes: int) -> None:
    """Refuse, before encoding, what JSON text would not carry faithfully or the limits refuse.

    - object keys must be strings: json.dumps turns 1 into "1" (and {1: a, "1": b} into a
      duplicate key, of which the handler would get one);
    - at most MAX_DEPTH nested containers, and no container inside itself;
    - a lower bound of the encoded size: a value sharing one large string or list many times would
      expand without bound in json.dumps, so past _EXPANSION_GUARD times the limit it stops here.
    Anything else (numbers, NaN, sets, objects) is left to json.dumps and its own messages.
    """
    if type(value) is dict:  # the common payload: an object of scalars whose text fits the limit
        text = 0  # one string under many keys expands in json.dumps: the walk below counts that
        for key, item in value.items():
            if type(key) is not str or isinstance(item, _CONTAINERS):
                break
            if isinstance(item, str):
                text += len(item)
                if text > max_bytes:
                    break
        else:
            return
    if isinstance(value, _CONTAINERS):
        _TreeWalk(max_bytes).walk(value, 0)


class _TreeWalk:
    """One walk of a payload's containers, counting a lower bound of its encoded size as it goes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.cap = max_bytes * _EXPANSION_GUARD
        self.size = 0
        self.on_path: set[int] = set()
        self.done: dict[int, tuple[int, int]] = {}  # container id -> (size, height), for values shared many times

    def _too_big(self) -> _Shape:
        return _Shape(f"payload is more than {self.cap} bytes; the limit is {self.max_bytes} bytes")

    def child(self, item: Any, depth: int) -> int:
        """Count a container met at `depth`; its height (levels of containers, itself included)."""
        seen = self.done.get(id(item))
        if seen is not None and depth + seen[1] <= MAX_DEPTH:
            self.size += seen[0]
            if self.size > self.cap:
                raise self._too_big()
            return seen[1]
        start = self.size
        height = self.walk(item, depth)
        self.done[id(item)] = (self.size - start, height)
        return height

    def walk(self, item: Any, depth: int) -> int:
        """Walk a container (scalars are counted by its entries); its height."""
        if depth >= MAX_DEPTH:
            raise _Shape(f"{{where}} nests deeper than {MAX_DEPTH} levels")
        ident = id(item)
        if ident in self.on_path:
            raise _Shape("{where} contains itself (a circular reference)")
        self.on_path.add(ident)
        self.size += 2
        below = self._object(item, depth) if isinstance(item, dict) else self._array(item, depth)
        self.on_path.discard(ident)
        if self.size > self.cap:
            raise self._too_big()
        return below + 1

    def _object(self, item: dict[Any, Any], depth: int) -> int:
        below = 0
        for key, value in item.items():
            if not isinstance(key, str):
                raise _Shape(
                    f"{{where}} has a key that is not a string ({type(key).__name__} "
                    f"{_short(key)}); JSON object keys are strings"
                )
            self.size += len(key) + 4
            below = max(below, self._entry(key, value, depth, 1))
        return below

    def _array(self, item: list[Any] | tuple[Any, ...], depth: int) -> int:
        below = 0
        for index, value in enumerate(item):
            below = max(below, self._entry(index, value, depth, 2))
        return below

    def _entry(self, step: str | int, value: Any, depth: int, scalar_bytes: int) -> int:
        """Count one entry's value (a scalar adds `scalar_bytes`, a string also its quotes and text);
        the height of the containers below it, 0 for a scalar."""
        if isinstance(value, str):
            self.size += len(value) + scalar_bytes + 1
            return 0
        if isinstance(value, _CONTAINERS):
            try:
                return self.child(value, depth + 1)
            except _Shape as err:
                err.path.append(step)
                raise
        self.size += scalar_bytes
        return 0


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = object.__repr__(value)
    return text if len(text) <= 60 else text[:57] + "..."


def decode(signal: Signal, text: str) -> Any:
    """The value a handler receives: a model instance for a pydantic model, else decoded JSON."""
    schema = signal.schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        # JSON mode: a strict model accepts its own JSON (a date as "2026-01-31") only from JSON
        return schema.model_validate_json(text)
    return loads_stored(text)


# json.loads's own C scanner (typeshed does not declare JSONDecoder.scan_once)
_scan_value: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def loads_stored(text: str) -> Any:
    """`json.loads(text)` for a stored payload, faster for the compact JSON emits store (no
    whitespace around the value): the C scanner is called directly, without json.loads's two
    whitespace matches and its Python frames, a few times cheaper for a small object. Anything
    else, an error included, goes to json.loads, which gives the same value or the same error."""
    try:
        value, end = _scan_value(text, 0)
    except (StopIteration, ValueError, TypeError):
        return json.loads(text)
    return value if end == len(text) else json.loads(text)
