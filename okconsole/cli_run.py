"""The long-running commands: the TUI, `demo`, `serve MODULE:ATTR` and `tail SIGNAL`.

Registered on the Typer app of `okconsole.cli` (imported at its end).
"""
from __future__ import annotations

import asyncio
import errno
import importlib
import math
import os
import socket
import sys
from typing import Optional

import typer

from engine.app import OkeApp
from engine.errors import OkeError, SchemaTooNew, StoreUnavailable

from .cli import DB_OPTION, app, fail, state_of
from .clihelp import INTERRUPTED
from .demo import DEMO_PORT


def version() -> str:
    """The installed distribution's version (pyproject.toml), or a marker when run from a bare tree."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version("okengine")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _on_terminal() -> bool:
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def require_terminal(ctx: typer.Context) -> None:
    """The TUI needs a terminal on stdin and stdout: without one, the help on stderr and exit 2
    (drawing escape codes into a pipe would hang or garble it; SPEC §10b)."""
    if _on_terminal():
        return
    typer.echo(ctx.get_help(), err=True)
    typer.echo("\nokconsole: the TUI needs a terminal (stdin and stdout are not both one): "
               "name a command, e.g. okconsole stats", err=True)
    raise typer.Exit(2)


def port_free(host: str, port: int) -> bool:
    return _bind_error(host, port) is None


def _bind_error(host: str, port: int) -> BaseException | None:
    """Why binding host:port fails now, or None."""
    try:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except (OSError, ValueError, TypeError, UnicodeError) as err:  # NUL or non-IDNA host: not OSError
        return err
    return None


def _check_port(host: str, port: int) -> None:
    if not 0 < port < 65536:
        fail(2, f"--port: {port} is not a TCP port (1-65535)")
    err = _bind_error(host, port)
    if err is None:
        return
    if isinstance(err, OSError) and err.errno in (errno.EADDRINUSE, errno.EACCES):
        reason = "the port is in use" if err.errno == errno.EADDRINUSE else "permission denied"
        fail(1, f"cannot listen on {host}:{port}: {reason} (pass --port)")
    fail(2, f"--host: cannot listen on {host!r}:{port}: {getattr(err, 'strerror', None) or err}")


def run_tui(database_url: str, read_only: bool, tail_url: str | None = None, tail_token: str | None = None,
            actor: str | None = None) -> None:
    from .app import ConsoleApp
    from .cli import _check_sqlite_file

    _check_sqlite_file(database_url)
    ConsoleApp(database_url, read_only=read_only, tail_url=tail_url, tail_token=tail_token, actor=actor).run()


@app.command()
def demo(
    ctx: typer.Context,
    db: Optional[str] = DB_OPTION,
    headless: bool = typer.Option(False, "--headless", help="Run the demo without the TUI."),
    seconds: Optional[float] = typer.Option(None, "--seconds", metavar="N", help="Stop after N seconds."),
    port: int = typer.Option(DEMO_PORT, "--port", help="HTTP port on 127.0.0.1."),
) -> None:
    """The bundled demo shop running embedded (workers + HTTP on 127.0.0.1:6530), with the TUI on top."""
    from .demo import DemoRunner, run_headless

    state = state_of(ctx, db)
    if seconds is not None and (not math.isfinite(seconds) or seconds <= 0):
        fail(2, f"--seconds: {seconds} is not a positive number of seconds")
    _check_port("127.0.0.1", port)
    try:
        if headless:
            def announce() -> None:
                typer.echo(f"okconsole demo: store {state.db}, HTTP on http://127.0.0.1:{port} "
                           f"(token demo-token){'' if seconds is None else f', for {seconds:g}s'}", err=True)
            asyncio.run(run_headless(state.db, seconds, port, announce))
            return
        from .app import ConsoleApp

        runner_box: dict[str, DemoRunner] = {}

        async def start() -> None:
            runner_box["demo"] = DemoRunner(state.db, port)
            await runner_box["demo"].start()

        async def stop() -> None:
            if "demo" in runner_box:
                await runner_box["demo"].stop()

        ConsoleApp(state.db, read_only=state.read_only, tail_url=f"http://127.0.0.1:{port}",
                   tail_token="demo-token", embedded=(start, stop), exit_after_s=seconds, actor=state.actor).run()
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None
    except (StoreUnavailable, SchemaTooNew) as err:
        fail(1, str(err))


def load_app(target: str) -> OkeApp:
    """The OkeApp named by MODULE:ATTR (the working directory is importable)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        fail(2, f'serve: expected MODULE:ATTR (e.g. "shop.app:app"), got "{target}"')
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        fail(2, f'serve: cannot import "{module_name}": {err}')
    except Exception as err:  # the user's module raised at import
        fail(2, f'serve: importing "{module_name}" raised {type(err).__name__}: {err}')
    found = module
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


@app.command()
def serve(
    ctx: typer.Context,
    target: str = typer.Argument(..., metavar="MODULE:ATTR", help="The app, e.g. shop.app:app."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    port: int = typer.Option(6530, "--port", help="TCP port."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, metavar="N", help="Concurrent handlers."),
) -> None:
    """Run a user app's engine: its workers and its HTTP/SSE routes, until Ctrl-C."""
    oke_app = load_app(target)
    _check_port(host, port)
    typer.echo(f"okconsole serve: {oke_app.name} on http://{host}:{port} (store {oke_app.database_url}, "
               f"{concurrency} handlers)", err=True)
    try:
        asyncio.run(oke_app.serve(host=host, port=port, concurrency=concurrency))
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None
    except (StoreUnavailable, SchemaTooNew) as err:
        fail(1, str(err))
    except (OkeError, TypeError, ValueError) as err:  # boot checks of the user's manifest
        fail(2, str(err))


def _check_url(url: str) -> None:
    import httpx

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as err:
        fail(2, f"--url: {url!r} is not a URL ({err})")
    if parsed.scheme not in ("http", "https") or not parsed.host:
        fail(2, f"--url: {url!r} is not an http:// or https:// URL")


def _header_safe(text: str) -> bool:
    return text.isascii() and text.isprintable()


@app.command()
def tail(
    ctx: typer.Context,
    signal: str = typer.Argument(..., metavar="SIGNAL", help="The live signal to follow."),
    db: Optional[str] = DB_OPTION,
    url: Optional[str] = typer.Option(None, "--url", envvar="OKE_URL", metavar="URL",
                                      help="Follow over SSE from this server (else read the store)."),
    token: Optional[str] = typer.Option(None, "--token", envvar="OKE_TOKEN", help="Bearer token for --url."),
    after: Optional[str] = typer.Option(None, "--after", metavar="ID", help="Start after this event id."),
    from_start: bool = typer.Option(False, "--from-start", help="Start at the oldest retained event."),
    from_end: bool = typer.Option(False, "--from-end", help="Only events emitted from now on."),
    count: Optional[int] = typer.Option(None, "--count", min=1, metavar="N", help="Exit after N events."),
    as_json: bool = typer.Option(False, "--json", help="Print NDJSON {\"id\", \"data\"}."),
) -> None:
    """Follow a live tape like `tail -f`: the last 10 retained events, then new ones."""
    from .data import StoreDown
    from .tailing import Printer, TailFailed, TailOptions, UnknownTape, tail_sse, tail_store

    if sum(map(bool, (after, from_start, from_end))) > 1:
        fail(2, "tail: choose one of --after ID, --from-start, --from-end")
    state = state_of(ctx, db)  # checks every text argument
    if url:
        _check_url(url)
    if token is not None and not _header_safe(token):
        fail(2, "--token: a bearer token is printable ASCII (it travels in an HTTP header)")
    opts = TailOptions(signal, after, from_start, from_end, count, as_json)
    printer = Printer(opts)
    try:
        if url:
            asyncio.run(tail_sse(url, token, opts, printer))
        else:
            from .cli import _check_sqlite_file
            _check_sqlite_file(state.db)
            asyncio.run(tail_store(state.db, opts, printer))
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None
    except UnknownTape as err:
        fail(2, str(err))
    except (TailFailed, StoreDown) as err:
        fail(1, str(err))
    except (StoreUnavailable, SchemaTooNew) as err:
        fail(1, str(err))
    except BrokenPipeError:  # `okconsole tail x | head`
        sys.stderr.close()
