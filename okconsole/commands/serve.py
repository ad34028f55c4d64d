"""The long-running commands that host an engine: `demo` (the bundled shop, TUI on top) and
`serve MODULE:ATTR` (a user's app: its workers and HTTP/SSE routes).

`serve` with `--db` (before or after the command) runs the app on that store: it sets
OKE_DATABASE_URL before importing the app, which an app made by `oke(...)` without a
`database_url` uses. An app that names its own store in code is not overridden behind its back:
serve refuses (exit 2) and says which store the app named, rather than serve another one than
the command line asked for."""

from __future__ import annotations

import asyncio
import errno
import importlib
import math
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

import typer

from engine.errors import OkeError, SchemaTooNew, StoreUnavailable

from ..dburl import BadDatabaseUrl, database_url
from .common import DB_OPTION, State, fail, state_of, url_of
from .conventions import INTERRUPTED
from .session import shown_url

if TYPE_CHECKING:
    from engine import OkeApp

DEMO_PORT = 6530  # the demo shop's HTTP port on 127.0.0.1


def _bind_error(host: str, port: int) -> BaseException | None:
    """Why binding host:port fails now, or None."""
    try:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except (OSError, ValueError, TypeError, UnicodeError) as err:  # NUL or non-IDNA host: not OSError
        return err
    return None


def check_port(host: str, port: int) -> None:
    """Refuse a port that is not one, or that cannot be listened on now (in use: exit 1)."""
    if not 0 < port < 65536:
        fail(2, f"--port: {port} is not a TCP port (1-65535)")
    err = _bind_error(host, port)
    if err is None:
        return
    if isinstance(err, OSError) and err.errno in (errno.EADDRINUSE, errno.EACCES):
        reason = "the port is in use" if err.errno == errno.EADDRINUSE else "permission denied"
        fail(1, f"cannot listen on {host}:{port}: {reason} (pass --port)")
    fail(2, f"--host: cannot listen on {host!r}:{port}: {getattr(err, 'strerror', None) or err}")


def _demo_headless(state: State, seconds: float | None, port: int) -> None:
    from ..demo import run_headless

    def announce() -> None:
        typer.echo(
            f"okconsole demo: store {state.db}, HTTP on http://127.0.0.1:{port} "
            f"(token demo-token){'' if seconds is None else f', for {seconds:g}s'}",
            err=True,
        )

    asyncio.run(run_headless(state.db, seconds, port, announce))


def _demo_tui(state: State, seconds: float | None, port: int) -> None:
    from ..app import ConsoleApp
    from ..demo import DemoRunner

    runner_box: dict[str, DemoRunner] = {}

    async def start() -> None:
        runner_box["demo"] = DemoRunner(state.db, port)
        await runner_box["demo"].start()

    async def stop() -> None:
        if "demo" in runner_box:
            await runner_box["demo"].stop()

    ConsoleApp(
        state.db,
        read_only=state.read_only,
        tail_url=f"http://127.0.0.1:{port}",
        tail_token="demo-token",
        embedded=(start, stop),
        exit_after_s=seconds,
        actor=state.actor,
    ).run()


def demo(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    headless: bool = typer.Option(False, "--headless", help="Run the demo without the TUI."),
    seconds: float | None = typer.Option(None, "--seconds", metavar="N", help="Stop after N seconds."),
    port: int = typer.Option(DEMO_PORT, "--port", help="HTTP port on 127.0.0.1."),
) -> None:
    """The bundled demo shop running embedded (workers + HTTP on 127.0.0.1:6530), with the TUI on top."""
    state = state_of(ctx, db)
    if seconds is not None and (not math.isfinite(seconds) or seconds <= 0):
        fail(2, f"--seconds: {seconds} is not a positive number of seconds")
    check_port("127.0.0.1", port)
    try:
        (_demo_headless if headless else _demo_tui)(state, seconds, port)
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None
    except (StoreUnavailable, SchemaTooNew) as err:
        fail(1, str(err))


def _import_module(module_name: str) -> Any:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ImportError as err:
        fail(2, f'serve: cannot import "{module_name}": {err}')
    except Exception as err:  # the user's module raised at import
        fail(2, f'serve: importing "{module_name}" raised {type(err).__name__}: {err}')


def load_app(target: str) -> OkeApp:
    """The OkeApp named by MODULE:ATTR (the working directory is importable)."""
    from engine import OkeApp

    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        fail(2, f'serve: expected MODULE:ATTR (e.g. "shop.app:app"), got "{target}"')
    found = _import_module(module_name)
    for part in attr.split("."):
        if not hasattr(found, part):
            fail(2, f'serve: "{module_name}" has no attribute "{attr}"')
        found = getattr(found, part)
    if callable(found) and not isinstance(found, OkeApp):
        try:
            found = found()
        except Exception as err:  # a factory that raises, or a callable that is not a factory
            fail(2, f'serve: calling "{target}" raised {type(err).__name__}: {err}')
    if not isinstance(found, OkeApp):
        fail(2, f'serve: "{target}" is a {type(found).__name__}, not an app made by engine.oke(...)')
    return found


def _given_db(ctx: typer.Context, db: str | None) -> str | None:
    """The store --db names (the command's own, else the global one) as a URL; None when not given."""
    given = db or ctx.find_root().params.get("db")
    return url_of(given) if given else None


def _same_store(a: str, b: str) -> bool:
    try:
        return database_url(a) == database_url(b)
    except BadDatabaseUrl:
        return a == b


def serve(
    ctx: typer.Context,
    target: str = typer.Argument(..., metavar="MODULE:ATTR", help="The app, e.g. shop.app:app."),
    db: str | None = DB_OPTION,
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    port: int = typer.Option(6530, "--port", help="TCP port."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, metavar="N", help="Concurrent handlers."),
) -> None:
    """Run a user app's engine: its workers and its HTTP/SSE routes, until Ctrl-C. --db runs it on
    that store (as OKE_DATABASE_URL); an app that names another store in code is refused (exit 2)."""
    wanted = _given_db(ctx, db)
    if wanted is not None:
        os.environ["OKE_DATABASE_URL"] = wanted  # what oke(...) without a database_url uses
    oke_app = load_app(target)
    if wanted is not None and not _same_store(oke_app.database_url, wanted):
        fail(
            2,
            f"serve: --db {shown_url(wanted)} cannot be applied: {target} names its own store in code "
            f"(database_url={shown_url(oke_app.database_url)}). Drop --db to serve that store, or let the app "
            "take its store from OKE_DATABASE_URL (oke(...) without database_url), which --db sets.",
        )
    check_port(host, port)
    typer.echo(
        f"okconsole serve: {oke_app.name} on http://{host}:{port} (store {shown_url(oke_app.database_url)}, "
        f"{concurrency} handlers)",
        err=True,
    )
    try:
        asyncio.run(oke_app.serve(host=host, port=port, concurrency=concurrency))
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None
    except (StoreUnavailable, SchemaTooNew) as err:
        fail(1, str(err))
    except (OkeError, TypeError, ValueError) as err:  # boot checks of the user's manifest
        fail(2, str(err))


COMMANDS = (demo, serve)
