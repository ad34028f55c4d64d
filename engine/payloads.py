"""Payload checks at emit and re-validation before a handler runs.

A payload is stored as JSON text. It is checked against the signal's schema,
then encoded; any failure is OKE1250 and nothing is stored.
"""
from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from .errors import OkeError
from .signals import Signal

DEFAULT_MAX_PAYLOAD_BYTES = 1_048_576


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
        text = json.dumps(checked, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as err:
        raise _schema_failure(signal, f"payload is not JSON-serializable ({type(err).__name__}: {err})") from err
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > max_bytes:
        raise _schema_failure(signal, f"payload is {size} bytes; the limit is {max_bytes} bytes")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise _schema_failure(signal, f"payload holds a lone surrogate character ({err.reason})") from err
    return text


def decode(signal: Signal, text: str) -> Any:
    """The value a handler receives: a model instance for a pydantic model, else decoded JSON."""
    schema = signal.schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        # JSON mode: a strict model accepts its own JSON (a date as "2026-01-31") only from JSON
        return schema.model_validate_json(text)
    return json.loads(text)

