"""The caller's transaction (`emit(..., conn=...)`): is that connection on this store, and waking
this process's workers once it commits.

A message written in the caller's SQLAlchemy transaction exists if and only if the caller commits.
PostgreSQL delivers the enqueue's own NOTIFY at commit; SQLite has no such statement, so the
in-process wake is hooked to the connection's commit (other processes see the WAL change).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from sqlalchemy import Connection, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection

from .wake import wake_local

_LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "::1"}
_THEN = "oke_after_commit"  # sync.info key: callbacks to run once the commit has happened
_WAKES = "oke_wake_after_commit"  # key in Connection.info: the store urls to wake after this commit
_RUNNING: set[asyncio.Task[None]] = set()
COMMIT_WAIT_S = 0.001  # how often a pending wake looks whether the caller's commit has ended


def check_caller_connection(conn: object, store_url: str, what: str) -> AsyncConnection:
    """The caller's connection, if it is an AsyncConnection in a transaction on this store; else
    TypeError / ValueError naming `what` (the call), before anything is written."""
    if not isinstance(conn, AsyncConnection):
        raise TypeError(
            f"{what}: conn must be an SQLAlchemy AsyncConnection (async with engine.begin() as conn; "
            f"from an AsyncSession, await session.connection()), got {type(conn).__name__}"
        )
    if conn.sync_connection is None or conn.closed or not conn.in_transaction():
        raise ValueError(
            f"{what}: conn is not in a transaction: open one with `async with engine.begin() as conn:` "
            "so the message commits or rolls back with your own writes"
        )
    theirs, ours = conn.engine.url, make_url(store_url)
    if database_identity(theirs) != database_identity(ours):
        raise ValueError(
            f"{what}: conn is on {theirs.render_as_string(hide_password=True)}, not on the app's database "
            f"({ours.render_as_string(hide_password=True)}): the message must be written where workers read"
        )
    return conn


def database_identity(url: URL) -> tuple[str, ...]:
    """What makes two urls one database: the file for SQLite, host, port and name for PostgreSQL."""
    backend = url.get_backend_name()
    if backend == "sqlite":
        return (backend, os.path.realpath(os.path.expanduser(url.database or "")))
    host = (url.host or "").lower()
    return (backend, "localhost" if host in _LOCAL_HOSTS else host, str(url.port or 5432), url.database or "")


def wake_after_commit(conn: AsyncConnection, store_url: str, then: Callable[[], None] | None = None) -> None:
    """Wake this process's workers of `store_url` once the caller's transaction has committed
    (never at a rollback), and run `then` (what the emit counts in history) at the same time.
    One wake per transaction, however many emits it holds."""
    sync = conn.sync_connection
    assert sync is not None
    if not event.contains(sync, "commit", _on_commit):  # listeners stay for the connection's life
        event.listen(sync, "commit", _on_commit)
        event.listen(sync, "rollback", _on_rollback)
    sync.info.setdefault(_WAKES, set()).add(store_url)
    if then is not None:
        sync.info.setdefault(_THEN, []).append(then)


def _on_commit(sync: Connection) -> None:
    """SQLAlchemy announces the commit before the driver makes it: the wake waits for its end."""
    urls: set[str] = sync.info.pop(_WAKES, set())
    then: list[Callable[[], None]] = sync.info.pop(_THEN, [])
    if not urls and not then:
        return
    task = asyncio.get_running_loop().create_task(_wake_when_ended(sync, sync.get_transaction(), urls, then))
    _RUNNING.add(task)  # the loop keeps only a weak reference to a task
    task.add_done_callback(_RUNNING.discard)


def _on_rollback(sync: Connection) -> None:
    sync.info.pop(_WAKES, None)
    sync.info.pop(_THEN, None)


async def _wake_when_ended(
    sync: Connection, transaction: object, urls: set[str], then: list[Callable[[], None]]
) -> None:
    while sync.get_transaction() is transaction and transaction is not None:
        await asyncio.sleep(COMMIT_WAIT_S)
    for url in urls:
        wake_local(url)
    for fn in then:
        fn()
