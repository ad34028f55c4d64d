"""A signal's payload schema as JSON Schema: recorded at boot, checked where the code is absent.

A console that did not import the user's code cannot run a pydantic model, yet an operator's
edited payload must still meet it (a payload that fails goes dead again on its first attempt).
So boot records the model's JSON Schema in the store, and a replacement payload is validated
against it with `jsonschema`. A plain callable schema has no JSON Schema: None.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, TypeAdapter

from .errors import OkeError
from .signals import Signal

ANYTHING = "{}"  # no schema declared: every JSON value is accepted
MAX_DETAILS = 5


def describe(signal: Signal) -> str | None:
    """The JSON Schema text of `signal`'s payloads; None when it cannot be stated (a callable)."""
    schema = signal.schema
    try:
        if schema is None:
            return ANYTHING
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            return json.dumps(schema.model_json_schema(), sort_keys=True)
        if isinstance(schema, TypeAdapter):
            return json.dumps(schema.json_schema(), sort_keys=True)
    except Exception:  # a type pydantic cannot express in JSON Schema: treated like a callable
        return None
    return None


def check(signal: str, schema_text: str, value: Any) -> None:
    """Raise OKE1250 (naming up to five failures) unless `value` meets the recorded JSON Schema."""
    import jsonschema

    schema = json.loads(schema_text)
    validator_cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
    if not errors:
        return
    details = [f"{'.'.join(str(p) for p in e.absolute_path) or 'payload'}: {e.message}" for e in errors[:MAX_DETAILS]]
    raise OkeError.of(1250, resource=signal, detail="; ".join(details))
