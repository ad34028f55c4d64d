"""Tell a passing outage (database away, connection lost, lock timeout) from a real error.

Workers back off and retry on an outage; emit turns one into a clear StoreUnavailable;
the console shows the store as unreachable and keeps trying.
"""
from __future__ import annotations

import asyncio
import sqlite3

import asyncpg
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from ..errors import StoreUnavailable

_OUTAGES: tuple[type[BaseException], ...] = (
    StoreUnavailable, OSError, ConnectionError, asyncio.TimeoutError, sqlite3.OperationalError,
    OperationalError, InterfaceError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
    asyncpg.exceptions.CannotConnectNowError, asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    # A pooled connection whose server sent FATAL (shutdown) while it sat idle fails its next BEGIN
    # with "cannot switch to state 15; another operation (2) is in progress": nothing was sent.
    asyncpg.exceptions.InternalClientError,
)


def is_outage(err: BaseException) -> bool:
    if isinstance(err, DBAPIError):
        if err.connection_invalidated:
            return True
        # SQLAlchemy's asyncpg adapter turns PostgreSQL's refusals while it restarts ("the database
        # system is starting up", "… not yet accepting connections": 57P03) into its generic Error,
        # a plain DBAPIError: judge by the driver's exception behind it.
        orig = err.orig
        if isinstance(orig, _OUTAGES) or isinstance(getattr(orig, "__cause__", None), _OUTAGES):
            return True
    return isinstance(err, _OUTAGES)


def describe(err: BaseException) -> str:
    """One line: the driver's own reason without the SQL and parameters."""
    orig = getattr(err, "orig", None) or err
    text = " ".join(str(orig).split()) or type(orig).__name__
    return f"{type(orig).__name__}: {text}"[:300]
