"""The records `engine.ops` returns: frozen dataclasses whose attributes are the JSON fields."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Failure:
    code: str
    message: str
    at: int
    attempt: int


@dataclass(frozen=True)
class DeadLetter:
    id: str
    signal: str
    key: str | None
    payload: Any
    attempts: int
    failures: list[Failure]
    created_at: int
    parent_run_id: str | None
    status: str = "dead"


def to_json(record: Any) -> Any:
    """A record (or list of records) as plain JSON-ready data."""
    if isinstance(record, list):
        return [to_json(r) for r in record]
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return dataclasses.asdict(record)
    return record
