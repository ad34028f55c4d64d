"""`okconsole web`: the same TUI in a browser, served by textual-serve, for its operator only.

textual-serve runs a command line per browser session (the app under Textual's web driver, its
screen relayed over a websocket to a terminal emulator in the page), so the command it runs must
carry everything this one was given: the store (`--db`), `--read-only` and `--actor`. Who may open
a session (the token, the Host and Origin checks, the session cap) is `okconsole.web_gate`; the
textual-serve server it guards is `okconsole.web_server`.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any
from urllib.parse import quote

import typer

from .common import ACTOR_OPTION, DB_OPTION, State, fail, state_of, warn
from .conventions import INTERRUPTED
from .serve import check_port
from .session import check_sqlite_file

WEB_DRIVER = "textual.drivers.web_driver:WebDriver"  # what textual-serve sets TEXTUAL_DRIVER to
TOKEN_ENV = "OKE_WEB_TOKEN"
SOURCE_ENV = "OKE_WEB_SOURCE"  # set by `okconsole web` for each session: the browser's address
LOOPBACK = ("127.0.0.1", "localhost", "::1")
TOKEN_OPTION: Any = typer.Option(
    None, "--token", metavar="TEXT", help=f"The token a browser must present (default: env {TOKEN_ENV}, else random)."
)
ALLOWED_HOST_OPTION: Any = typer.Option(
    None,
    "--allowed-host",
    metavar="NAME[:PORT]",
    help="Another Host the browser may use (repeatable; always: the bound host, localhost, 127.0.0.1).",
)


def served_command(state: State) -> str:
    """The shell command textual-serve starts for each browser session: this console, same options."""
    argv = [sys.executable, "-m", "okconsole", "--db", state.db]
    if state.read_only:
        argv.append("--read-only")
    if state.actor:
        argv += ["--actor", state.actor]
    return shlex.join(argv)


def web_source() -> str | None:
    """Inside a browser session of `okconsole web`: where its writes come from, for the audit log."""
    if os.environ.get("TEXTUAL_DRIVER") != WEB_DRIVER:
        return None
    return os.environ.get(SOURCE_ENV) or None


def _token(given: str | None) -> tuple[str, bool]:
    """The token (from --token, else OKE_WEB_TOKEN, else a new random one) and whether it was made here."""
    from ..web_gate import check_token, new_token

    label = "--token"
    if given is None and TOKEN_ENV in os.environ:
        given, label = os.environ[TOKEN_ENV], TOKEN_ENV
    if given is None:
        return new_token(), True
    try:
        return check_token(given), False
    except ValueError as err:
        fail(2, f"{label}: {err}")


def _gate(host: str, port: int, token: str, allowed: list[str], max_sessions: int) -> Any:
    from ..web_gate import AllowedHosts, SessionSlots, TokenCheck, WebGate

    try:
        slots = SessionSlots(max_sessions)
    except ValueError as err:
        fail(2, f"--max-sessions: {err}")
    try:
        hosts = AllowedHosts(host, port)
    except ValueError as err:
        fail(2, f"--host: {err}")
    for entry in allowed:
        try:
            hosts.add(entry)
        except ValueError as err:
            fail(2, f"--allowed-host: {err}")
    return WebGate(TokenCheck(token, port), hosts, slots)


def _announce(state: State, host: str, port: int, token: str, made: bool) -> None:
    """The URL to open, printed once: with the token when it was made here (the only place it shows)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else (f"[{host}]" if ":" in host else host)
    url = f"http://{shown}:{port}/"
    mode = " (read-only)" if state.read_only else ""
    if made:
        typer.echo(f"okconsole web: open {url}?token={quote(token, safe='')} over {state.db}{mode}", err=True)
    else:
        typer.echo(f"okconsole web: open {url}?token=<your token> over {state.db}{mode}", err=True)
    typer.echo("okconsole web: Ctrl-C stops", err=True)
    if host not in LOOPBACK:
        warn(f"listening on {host}: the token and the console cross the network unencrypted; put TLS in front")


def web(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    port: int = typer.Option(8000, "--port", help="TCP port for the browser."),
    read_only: bool = typer.Option(False, "--read-only", help="Refuse every write (also accepted before the command)."),
    token: str | None = TOKEN_OPTION,
    allowed_host: list[str] | None = ALLOWED_HOST_OPTION,
    max_sessions: int = typer.Option(4, "--max-sessions", metavar="N", help="At most N browser sessions at once."),
    actor: str | None = ACTOR_OPTION,
    db: str | None = DB_OPTION,
) -> None:
    """Serve the TUI in a browser (textual-serve) to whoever has the token, over the same store."""
    state = state_of(ctx, db)
    state = State(db=state.db, read_only=state.read_only or read_only, actor=actor or state.actor)
    secret, made = _token(token)
    gate = _gate(host, port, secret, allowed_host or [], max_sessions)
    check_port(host, port)
    check_sqlite_file(state.db)
    try:
        from ..web_server import GatedServer
    except ImportError:  # pragma: no cover - a dependency of okengine; only a broken install lacks it
        fail(1, "okconsole web needs textual-serve (pip install textual-serve)")
    _announce(state, host, port, secret, made)
    server = GatedServer(served_command(state), gate, host=host, port=port)
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
