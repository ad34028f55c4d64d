"""What every command shares: the global options, one-line failures, argument checks, confirmation.

Nothing here opens a store (that is `session`) or registers a command (that is the package).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, NoReturn

import typer

from engine.display import one_line
from engine.durations import parse_duration_ms

from ..dburl import BadDatabaseUrl, database_url

# --limit N beyond this reads as "all of them": a larger N overflows the stores' 64-bit LIMIT
MAX_LIMIT = 1_000_000_000

DB_OPTION: Any = typer.Option(
    None, "--db", metavar="URL", help="Database url or SQLite file path (also accepted before the command)."
)
JSON_OPTION: Any = typer.Option(False, "--json", help="Print JSON.")
ACTOR_OPTION: Any = typer.Option(None, "--actor", metavar="NAME", help="Who is acting (default: the OS user).")
REASON_OPTION: Any = typer.Option(None, "--reason", metavar="TEXT", help="Why, for the audit log.")
YES_OPTION: Any = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation.")
SIGNAL_ARGUMENT: Any = typer.Argument(..., metavar="SIGNAL", help="The signal's name.")
REASON_PROMPT = "Reason (recorded in the audit log)"


@dataclass
class State:
    """The global options: which store, whether writes are refused, who acts."""

    db: str
    read_only: bool
    actor: str | None


def fail(code: int, message: str) -> NoReturn:
    """One line on stderr, then exit with `code`."""
    typer.echo(f"okconsole: {one_line(message)}", err=True)
    raise typer.Exit(code)


def duration_option(flag: str, text: str) -> int:
    """A duration option (--older-than, --since) in ms; a text that is not a duration is bad usage."""
    ms = parse_duration_ms(text)
    if ms is None:
        fail(
            2,
            f'{flag}: "{text}" is not a duration: use a positive integer and a unit '
            f"(ms, s, m, h, d), e.g. 30s, 24h, 7d",
        )
    return ms


def warn(text: str) -> None:
    """A warning on stderr (stdout stays JSON-only)."""
    typer.echo(f"okconsole: warning: {one_line(text)}", err=True)


def _label(param: Any) -> str:
    if getattr(param, "param_type_name", "") == "option":
        return str(param.opts[0])
    return (param.metavar or str(param.name).upper()).strip("[].") or str(param.name)


def _check_text(label: str, value: str) -> None:
    if "\x00" in value:
        fail(2, f"{label}: contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        fail(2, f"{label}: {ascii(value)[:80]} is not valid UTF-8 text")


def check_arguments(ctx: Any) -> None:
    """Refuse a text argument no store can be asked about: a NUL, or bytes that were not UTF-8
    (Python hands those over as lone surrogates). Exit 2 naming the argument, before any query."""
    while ctx is not None:
        for param in ctx.command.params:
            values = ctx.params.get(param.name or "")
            for value in values if isinstance(values, (list, tuple)) else [values]:
                if isinstance(value, str):
                    _check_text(_label(param), value)
        ctx = ctx.parent


def url_of(given: str | None) -> str:
    """`--db` (or OKE_DATABASE_URL, or the default) as a store URL; a bad one is bad usage (exit 2)."""
    try:
        return database_url(given)
    except BadDatabaseUrl as err:
        fail(2, str(err))


def state_of(ctx: typer.Context, db: str | None = None) -> State:
    """The global options, with a command's own `--db` (given after the command name) winning."""
    check_arguments(ctx)
    obj = ctx.find_root().obj
    if not isinstance(obj, State):  # a command invoked without the root callback (tests)
        obj = State(db=url_of(None), read_only=False, actor=None)
    if db:
        obj = State(db=url_of(db), read_only=obj.read_only, actor=obj.actor)
    return obj


def actor_of(state: State, actor: str | None) -> str | None:
    """A command's own --actor, else the global one (else ops picks the OS user)."""
    return actor or state.actor


# Every command that changes the store: --read-only refuses each, and its help lists them from here.
WRITE_COMMANDS = ("replay", "purge", "unbind", "pause", "resume", "limit", "cancel", "delete", "retry")


def require_writes(state: State, command: str) -> None:
    """Refuse a write under --read-only (`command` is one of WRITE_COMMANDS, which its help lists)."""
    if command not in WRITE_COMMANDS:
        raise AssertionError(f"{command} writes but is not in WRITE_COMMANDS: --read-only's help would omit it")
    if state.read_only:
        fail(2, f"--read-only: {command} writes to the store; drop --read-only to run it")


def interactive() -> bool:
    """Whether stdin is a terminal a person can answer a question on."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def require_terminal_to_confirm(what: str) -> None:
    """A write that asks first cannot ask without a terminal: exit 2, pointing at --yes and --reason."""
    if not interactive():
        fail(2, f"{what} changes the store and stdin is not a terminal: pass --yes (and --reason TEXT, for the audit)")


def confirm(question: str, what: str, reason: str | None) -> str:
    """Ask on the terminal (the prompt goes to stderr), then, unless --reason gave one, ask for the
    reason the audit log records, as the TUI's dialogs do; refuse without a terminal. Returns the reason."""
    require_terminal_to_confirm(what)
    if not typer.confirm(one_line(question), default=False, err=True):
        fail(1, f"{what} cancelled: nothing changed")
    return reason or ask_reason(what)


def ask_reason(what: str) -> str:
    """A non-empty reason typed on the terminal; an empty answer asks again (Ctrl-C or Ctrl-D cancels)."""
    while True:
        try:
            typed = typer.prompt(REASON_PROMPT, default="", show_default=False, err=True)
        except typer.Abort:
            fail(1, f"{what} cancelled: nothing changed")
        text = str(typed).strip()
        if text:
            _check_text("reason", text)
            return text
        typer.echo("a reason is required (Ctrl-C cancels)", err=True)
