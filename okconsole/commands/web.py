"""`okconsole web`: the same TUI in a browser, served by textual-serve.

textual-serve runs a command line per browser session (the app under Textual's web driver, its
screen relayed over a websocket to a terminal emulator in the page), so the command it runs must
carry everything this one was given: the store (`--db`), `--read-only` and `--actor`.
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

import typer

from .common import DB_OPTION, State, fail, state_of
from .conventions import INTERRUPTED
from .serve import check_port
from .session import check_sqlite_file

WEB_DRIVER = "textual.drivers.web_driver:WebDriver"  # what textual-serve sets TEXTUAL_DRIVER to


def served_command(state: State) -> str:
    """The shell command textual-serve starts for each browser session: this console, same options."""
    argv = [sys.executable, "-m", "okconsole", "--db", state.db]
    if state.read_only:
        argv.append("--read-only")
    if state.actor:
        argv += ["--actor", state.actor]
    return shlex.join(argv)


def web(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    port: int = typer.Option(8000, "--port", help="TCP port for the browser."),
    read_only: bool = typer.Option(False, "--read-only", help="Refuse every write (also accepted before the command)."),
    db: str | None = DB_OPTION,
) -> None:
    """Serve the TUI in a browser (textual-serve) over the same store, with the same --db and --read-only."""
    state = state_of(ctx, db)
    if read_only:
        state = State(db=state.db, read_only=True, actor=state.actor)
    check_port(host, port)
    check_sqlite_file(state.db)
    try:
        from textual_serve.server import Server
    except ImportError:  # pragma: no cover - a dependency of okengine; only a broken install lacks it
        fail(1, "okconsole web needs textual-serve (pip install textual-serve)")
    mode = " (read-only)" if state.read_only else ""
    typer.echo(f"okconsole web: http://{host}:{port} over {state.db}{mode}; Ctrl-C stops", err=True)

    class Stoppable(Server):  # type: ignore[misc]
        stopped = False

        def request_exit(self) -> None:  # textual-serve's own SIGINT / SIGTERM handler
            self.stopped = True
            super().request_exit()

    server: Any = Stoppable(served_command(state), host=host, port=port, title="okconsole")
    sys.unraisablehook = _quiet_closed_loop(sys.unraisablehook)
    server.serve()
    if server.stopped:
        raise typer.Exit(INTERRUPTED)


def _quiet_closed_loop(previous: Any) -> Any:
    """Drop one known shutdown message: a browser session's subprocess transport is collected after
    textual-serve closed its loop ("Event loop is closed" from its __del__), a traceback on every
    Ctrl-C that says nothing is wrong. Every other unraisable error is reported as before."""

    def hook(unraisable: Any) -> None:
        value = unraisable.exc_value
        if isinstance(value, RuntimeError) and str(value) == "Event loop is closed":
            return
        previous(unraisable)

    return hook


COMMANDS = (web,)
