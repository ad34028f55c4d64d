"""What `--db` accepts: a SQLAlchemy URL of a store okengine speaks to, or a plain SQLite file path.

`--db ./shop.db` and `--db /srv/shop.db` mean `sqlite+aiosqlite:////abs/path/shop.db` (an absolute
SQLite URL has four slashes: three for the scheme, one for the root). A URL no store can use is bad
usage (exit 2), caught here before anything is opened; an unreachable one is not (exit 1).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from engine.ops import resolve_url

FORMS = (
    "sqlite+aiosqlite:///relative.db, sqlite+aiosqlite:////abs/path.db, a file path, "
    "or postgresql+asyncpg://user@host/db"
)


class BadDatabaseUrl(ValueError):
    """The --db value (or OKE_DATABASE_URL) is not a store okengine can open."""


def database_url(given: str | None) -> str:
    """`given`, else env OKE_DATABASE_URL, else the default, as a URL the stores accept."""
    text = resolve_url(given)
    if "://" not in text:
        return f"sqlite+aiosqlite:///{_absolute(text)}"
    check(text)
    return text


def _absolute(path_text: str) -> Path:
    path = Path(path_text)
    try:
        path = path.expanduser()
    except RuntimeError:  # "~nobody": no such user, so the name is taken as it is
        pass
    return path.absolute()


def check(url: str) -> None:
    """Raise BadDatabaseUrl unless `url` names a SQLite file or a PostgreSQL database via asyncpg."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as err:  # ValueError: a port that is not a number
        raise BadDatabaseUrl(f"--db: {url!r} is not a database URL ({err}); use {FORMS}") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if (parsed.database or "") in ("", ":memory:"):
            raise BadDatabaseUrl(
                "--db: okengine needs a SQLite file (several processes share it), "
                f"not {parsed.database or 'an empty path'!r}"
            )
        return
    if backend == "postgresql":
        if parsed.drivername not in ("postgresql", "postgresql+asyncpg"):
            raise BadDatabaseUrl(
                f"--db: okengine speaks to PostgreSQL through asyncpg: use "
                f"postgresql+asyncpg://… (got {parsed.drivername})"
            )
        return
    raise BadDatabaseUrl(f"--db: unsupported database {parsed.drivername!r}: use {FORMS}")


def sqlite_file(url: str) -> str | None:
    """The file behind a SQLite URL (relative to the working directory), or None for another store,
    an in-memory database or a URL that does not parse."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return None
    if not parsed.drivername.startswith("sqlite") or (parsed.database or "") in ("", ":memory:"):
        return None
    return parsed.database
