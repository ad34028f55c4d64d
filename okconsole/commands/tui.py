"""`okconsole` with no command: the global options, `--version`, and the TUI (which needs a terminal)."""

from __future__ import annotations

import os
import sys

import typer

from .common import WRITE_COMMANDS, State, url_of
from .session import check_sqlite_file
from .web import WEB_DRIVER, web_source

READ_ONLY_HELP = f"Refuse every write: {', '.join(WRITE_COMMANDS)}; the TUI hides its write keys."


def version() -> str:
    """The installed distribution's version (pyproject.toml), or a marker when run from a bare tree."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("okengine")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"okconsole {version()}")
        raise typer.Exit(0)


def _on_terminal() -> bool:
    if os.environ.get("TEXTUAL_DRIVER") == WEB_DRIVER:
        return True  # a browser session of `okconsole web`: textual-serve relays the screen
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def require_terminal(ctx: typer.Context) -> None:
    """The TUI needs a terminal on stdin and stdout: without one, the help on stderr and exit 2
    (drawing escape codes into a pipe would hang or garble it)."""
    if _on_terminal():
        return
    typer.echo(ctx.get_help(), err=True)
    typer.echo(
        "\nokconsole: the TUI needs a terminal (stdin and stdout are not both one): "
        "name a command, e.g. okconsole stats",
        err=True,
    )
    raise typer.Exit(2)


def run_tui(
    database_url: str,
    read_only: bool,
    tail_url: str | None = None,
    tail_token: str | None = None,
    actor: str | None = None,
    source: str | None = None,
) -> None:
    """The Textual console over `database_url` (a missing SQLite file is refused first); `source` is
    where its writes come from for the audit log (a browser session of `okconsole web`)."""
    from ..app import ConsoleApp

    check_sqlite_file(database_url)
    app = ConsoleApp(
        database_url, read_only=read_only, tail_url=tail_url, tail_token=tail_token, actor=actor, source=source
    )
    app.run()


def root(
    ctx: typer.Context,
    db: str | None = typer.Option(
        None,
        "--db",
        metavar="URL",
        help="Database url or SQLite file path (default: env OKE_DATABASE_URL, then "
        "sqlite+aiosqlite:///.oke/oke.db; an absolute SQLite url has four slashes).",
    ),
    read_only: bool = typer.Option(False, "--read-only", help=READ_ONLY_HELP),
    actor: str | None = typer.Option(
        None, "--actor", metavar="NAME", help="Who is acting, for the audit log (default: the OS user)."
    ),
    _version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
) -> None:
    ctx.obj = State(db=url_of(db), read_only=read_only, actor=actor)
    if ctx.invoked_subcommand is None:
        require_terminal(ctx)
        run_tui(ctx.obj.db, read_only, actor=actor, source=web_source())
