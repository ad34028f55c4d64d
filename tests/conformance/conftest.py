"""The store shapes every conformance test runs against, and the app that drives each.

Fixtures
    shape   (function) parametrized ["sqlite-thread", "sqlite-process", "postgres"]: a Shape holding
            a fresh database url and the `sqlite_writer` to open it with. PostgreSQL items get the
            `postgres` marker here (the root conftest marks only `db_url` and `pg_url` users), so
            `-m "not postgres"` deselects them and, through `pg_url`, they never skip when CI=true.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine import oke
from engine.app import OkeApp
from engine.store import Store, make_store

SHAPES = ("sqlite-thread", "sqlite-process", "postgres")


@dataclass(frozen=True)
class Shape:
    """One store shape: the database and how a store of this shape is opened on it."""

    name: str
    url: str
    sqlite_writer: str

    def app(self, name: str = "conformance", **options: Any) -> OkeApp:
        """An app on this shape (entered with `async with`); its workers run only under drain()."""
        return oke(name, database_url=self.url, sqlite_writer=self.sqlite_writer, **options)

    def store(self) -> Store:
        """Another store of this shape on the same database, closed: `await store.open()`. For SQLite
        with the writer process it has a writer process of its own, as a second app would."""
        return make_store(self.url, sqlite_writer=self.sqlite_writer)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("shape") == "postgres" and here in item.path.parents:
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(params=SHAPES)
def shape(request: pytest.FixtureRequest) -> Shape:
    name = request.param
    if name == "postgres":
        return Shape(name, request.getfixturevalue("pg_url"), "process")
    return Shape(name, request.getfixturevalue("sqlite_url"), name.removeprefix("sqlite-"))
