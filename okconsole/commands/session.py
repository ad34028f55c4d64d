"""One command's visit to the store: open it through `engine.ops`, run one call, close it, and map
every way that can fail to an exit status and a one-line reason."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from engine import ops
from engine.errors import OkeError, SchemaTooNew, StoreUnavailable

from .common import State, fail

T = TypeVar("T")


def check_sqlite_file(url: str) -> None:
    """Point the console at a SQLite file that does not exist and it says so (no new empty store)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # opening the store reports a bad url
    except ValueError as err:  # e.g. a port that is not a number: make_url raises int()'s error
        fail(1, f"not a database url: {url!r} ({err})")
    if parsed.get_backend_name() != "sqlite":
        return
    path = parsed.database or ""
    if path in ("", ":memory:") or path.startswith("file:"):
        return
    try:
        exists = Path(path).expanduser().exists()
    except (OSError, ValueError) as err:  # a name too long for the file system, a NUL
        fail(1, f"cannot open SQLite store {path}: {getattr(err, 'strerror', None) or err}")
    if not exists:
        fail(1, f"no store at {path}: the SQLite file does not exist (pass --db URL or set OKE_DATABASE_URL)")


def _quiet_lost_connections(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """A connection attempt given up on when the database went away mid-call can fail after nobody
    awaits it any more; asyncio would print its traceback at exit, beside the one-line reason this
    command prints. Every other unhandled error goes to asyncio's default handler."""
    err = context.get("exception")
    if isinstance(err, OSError) or (isinstance(err, BaseException) and _is_driver_error(err)):
        return
    loop.default_exception_handler(context)


async def _with_store(url: str, fn: Callable[[ops.Store], Awaitable[T]]) -> T:
    asyncio.get_running_loop().set_exception_handler(_quiet_lost_connections)
    store = await ops.open_store(url)
    try:
        return await fn(store)
    finally:
        await store.close()


def run(
    state: State,
    fn: Callable[[ops.Store], Awaitable[T]],
    *,
    schema_too_new: Callable[[SchemaTooNew], T] | None = None,
) -> T:
    """Open the store, run `fn`, close it; map failures to exit codes and one-line reasons
    (a store whose schema is newer than this okengine's goes to `schema_too_new` when given)."""
    check_sqlite_file(state.db)
    try:
        return asyncio.run(_with_store(state.db, fn))
    except (ops.UnknownSignal, ops.UnknownMessage, ops.UnknownRun, OkeError) as err:
        fail(2, str(err))
    except SchemaTooNew as err:
        if schema_too_new is None:
            fail(1, str(err))
        return schema_too_new(err)
    except StoreUnavailable as err:
        fail(1, str(err))
    except SQLAlchemyError as err:
        orig = getattr(err, "orig", None)
        fail(1, f"store error ({shown_url(state.db)}): {type(orig or err).__name__}: {orig or err}")
    except (OSError, sqlite3.Error, TimeoutError) as err:
        fail(1, f"store error ({shown_url(state.db)}): {type(err).__name__}: {err}")
    except ValueError as err:
        fail(2, str(err))
    except OverflowError as err:  # a number no store column can hold
        fail(2, f"a number is out of range: {err}")
    except Exception as err:
        if _is_driver_error(err):
            fail(1, f"store error ({shown_url(state.db)}): {type(err).__name__}: {err}")
        raise


def _is_driver_error(err: BaseException) -> bool:
    try:
        import asyncpg
    except ImportError:  # pragma: no cover
        return False
    return isinstance(err, (asyncpg.PostgresError, asyncpg.InterfaceError))


def shown_url(url: str) -> str:
    """A store URL as it may be shown: its password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url
