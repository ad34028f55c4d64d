"""Tell a passing outage (database away, connection lost, lock timeout) from a real error.

Workers back off and retry on an outage; emit turns one into a clear StoreUnavailable;
the console shows the store as unreachable and keeps trying. A pooler that refuses what the URL
makes us send (postgres.pooler.PoolerMisconfigured) is no outage: retrying cannot fix it, so it is raised.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3

import asyncpg
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from ..errors import StoreUnavailable
from .postgres.pooler import PoolerMisconfigured

_OUTAGES: tuple[type[BaseException], ...] = (
    StoreUnavailable,
    OSError,
    ConnectionError,
    asyncio.TimeoutError,
    sqlite3.OperationalError,
    OperationalError,
    InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    # A pooled connection whose server sent FATAL (shutdown) while it sat idle fails its next BEGIN
    # with "cannot switch to state 15; another operation (2) is in progress": nothing was sent.
    asyncpg.exceptions.InternalClientError,
)


def is_outage(err: BaseException) -> bool:
    if isinstance(err, PoolerMisconfigured):
        return False
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
    """One line: the driver's own reason without the SQL and parameters, led by what the operator
    must do when the disk is full or read-only (the driver says "database or disk is full")."""
    orig = getattr(err, "orig", None) or err
    text = " ".join(str(orig).split()) or type(orig).__name__
    condition = disk_condition(err)
    lead = f"{condition}: " if condition else ""
    return f"{lead}{type(orig).__name__}: {text}"[:300]


# SQLite's primary result codes (the low byte of the extended code sqlite3 errors carry)
_SQLITE_READONLY, _SQLITE_FULL = 8, 13
DISK_FULL = "the disk is full (free space: the store resumes by itself)"
READ_ONLY = "the filesystem is read-only (remount it read-write: the store resumes by itself)"


def disk_condition(err: BaseException) -> str | None:
    """ "the disk is full" (SQLITE_FULL, ENOSPC) or "the filesystem is read-only" (SQLITE_READONLY,
    EROFS) when `err` or an error behind it says so; else None."""
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            break
        code = getattr(seen, "sqlite_errorcode", None)
        no = getattr(seen, "errno", None)
        if code is not None and code & 0xFF == _SQLITE_FULL or no in (errno.ENOSPC, errno.EDQUOT):
            return DISK_FULL
        if code is not None and code & 0xFF == _SQLITE_READONLY or no == errno.EROFS:
            return READ_ONLY
        seen = getattr(seen, "orig", None) or seen.__cause__ or seen.__context__
    return None


def read_only_dir(path: str) -> bool:
    """Whether the filesystem holding `path` (or its nearest existing parent) is mounted read-only."""
    probe = os.path.abspath(path)
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        return bool(os.statvfs(probe or "/").f_flag & os.ST_RDONLY)
    except OSError:
        return False
