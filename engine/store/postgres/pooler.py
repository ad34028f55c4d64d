"""Behind a connection pooler (PgBouncer): what the database URL says, and what a pooler refuses.

A pooler in transaction mode (PgBouncer's `pool_mode = transaction`) gives each transaction to
whichever server connection is free, so nothing may outlive a transaction: no named prepared
statement (asyncpg's statement cache names every statement it keeps), no session `SET`, no LISTEN,
no session advisory lock. The URL says a pooler like that is in front with the SQLAlchemy asyncpg
dialect's own knob, `?prepared_statement_cache_size=0`; the store then turns asyncpg's cache off as
well (`statement_cache_size=0`: unnamed statements, parsed again each time), sets its settings
per transaction (`SET LOCAL`), and listens on `oke(..., listen_url=...)`, a direct connection, or
polls.

Nothing here relies on PgBouncer 1.21+'s `max_prepared_statements` (named statements carried across
server connections): Debian 12 and Ubuntu 24.04 ship 1.18 and 1.22, and it is off by default.
Session mode needs none of this: a client keeps its server connection until it disconnects.
"""

from __future__ import annotations

import asyncpg
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from ...errors import StoreUnavailable

KNOB = "prepared_statement_cache_size"  # SQLAlchemy's asyncpg dialect reads it from the URL
FIX = (
    f"add ?{KNOB}=0 to the database URL and pass oke(..., listen_url=...) a direct PostgreSQL URL for LISTEN, "
    "or set PgBouncer's pool_mode = session"
)
STARTUP_REFUSED = "unsupported startup parameter"  # PgBouncer's words for a parameter it does not pass on


class PoolerMisconfigured(StoreUnavailable):
    """A connection pooler in front of PostgreSQL refuses what this URL makes the engine send.
    Not an outage: retrying cannot help, the message names the fix."""


def transaction_pooled(url: str | URL) -> bool:
    """Whether the URL says a transaction-mode pooler is in front (`?prepared_statement_cache_size=0`).
    ValueError for a value that is not a count, or for asyncpg's own name of it, which in a URL
    would reach the server as a setting."""
    parsed = make_url(url)
    if "statement_cache_size" in parsed.query:
        raise ValueError(f"the database URL's statement_cache_size is asyncpg's name for it: use ?{KNOB}=0")
    value = parsed.query.get(KNOB)
    if value is None:
        return False
    if not isinstance(value, str) or not value.isdigit():
        raise ValueError(f"the database URL's {KNOB}: a count of statements (0 behind PgBouncer), got {value!r}")
    return int(value) == 0


def asyncpg_dsn(url: str | URL) -> str:
    """A plain libpq DSN for asyncpg from a SQLAlchemy URL, without SQLAlchemy's own options (asyncpg
    would send them to the server as settings)."""
    parsed = make_url(url).set(drivername="postgresql").difference_update_query([KNOB])
    return parsed.render_as_string(hide_password=False)


def check_listen_url(listen_url: object, database_url: str) -> str:
    """`listen_url` when it is a PostgreSQL URL beside a PostgreSQL database URL, else ValueError
    naming it (the URL itself is not quoted: it may carry a password)."""
    hint = "a direct PostgreSQL URL such as postgresql://user@db-host:5432/dbname"
    if not isinstance(listen_url, str) or not listen_url:
        raise ValueError(f"oke(listen_url=...): {hint}, got {type(listen_url).__name__} {listen_url!r}"[:300])
    try:
        parsed = make_url(listen_url)
    except ArgumentError:
        raise ValueError(f"oke(listen_url=...): {hint}, got a string that is not a URL") from None
    if parsed.drivername not in ("postgresql", "postgresql+asyncpg"):
        raise ValueError(f"oke(listen_url=...): {hint}, got a {parsed.drivername[:40]!r} URL")
    try:
        backend = make_url(database_url).get_backend_name()
    except ArgumentError:
        return listen_url  # make_store says what is wrong with that one
    if backend != "postgresql":
        raise ValueError(f"oke(listen_url=...): only for a PostgreSQL store; the database URL is {backend[:40]!r}")
    return listen_url


def pooler_refusal(err: BaseException) -> str | None:
    """What a pooler refused, when `err` (or an error behind it) is a pooler's refusal: a prepared
    statement another server connection holds or lacks, or a startup parameter; else None."""
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, (asyncpg.InvalidSQLStatementNameError, asyncpg.DuplicatePreparedStatementError)):
            return f"{type(seen).__name__}: {' '.join(str(seen).split())}"[:200]
        if isinstance(seen, asyncpg.PostgresError) and STARTUP_REFUSED in str(seen):
            return " ".join(str(seen).split())[:200]
        seen = getattr(seen, "orig", None) or seen.__cause__ or seen.__context__
    return None


def misconfigured(target: str, refusal: str) -> PoolerMisconfigured:
    """The error for a refusal `pooler_refusal` found, naming PgBouncer and the fix."""
    if STARTUP_REFUSED in refusal:
        return PoolerMisconfigured(
            f"a connection pooler (PgBouncer) at {target} refuses a setting in the database URL ({refusal}): "
            "remove it from the URL, or add it to PgBouncer's ignore_startup_parameters"
        )
    return PoolerMisconfigured(
        f"PostgreSQL at {target} is behind a pooler in transaction mode (PgBouncer): {FIX} (it lost a "
        f"prepared statement: {refusal})"
    )


def shared_session(target: str) -> PoolerMisconfigured:
    """Two of our connections met the same server session: only a transaction-mode pooler does that."""
    return PoolerMisconfigured(
        f"PostgreSQL at {target} is behind a pooler in transaction mode (PgBouncer): {FIX} (two connections "
        "shared one server session)"
    )
