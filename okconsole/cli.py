"""`okconsole`: the scripted operator commands (Typer), over `engine.ops` only.

Exit status: 0 success; 1 operational failure (store unreachable or erroring),
with a one-line reason on stderr; 2 bad usage, or an unknown signal / id / run
(the known signals are named on stderr). `--json` writes JSON only to stdout.

The callback opens nothing by itself: each command opens the store, runs one
`engine.ops` call (or a few) and closes it. New commands (`okconsole` with no
command for the TUI, `demo`, `serve`, `tail`) plug in as further `@app.command`s.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, NoReturn, Optional, TypeVar

import typer
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from engine import ops
from engine.durations import parse_duration_ms
from engine.errors import OkeError, SchemaTooNew, StoreUnavailable
from engine.store import Store, make_store

from . import output
from .clihelp import ConsoleGroup
from .dburl import BadDatabaseUrl, database_url

T = TypeVar("T")

app = typer.Typer(
    name="okconsole",
    help="Operator console for okengine: inspect and repair the store.",
    cls=ConsoleGroup,
    invoke_without_command=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@dataclass
class State:
    db: str
    read_only: bool
    actor: str | None


def fail(code: int, message: str) -> NoReturn:
    """One line on stderr, then exit with `code`."""
    line = " ".join(str(message).split())
    typer.echo(f"okconsole: {line}", err=True)
    raise typer.Exit(code)


# -- the store ----------------------------------------------------------------------------------
def _check_sqlite_file(url: str) -> None:
    """Point the console at a SQLite file that does not exist and it says so (no new empty store)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # make_store reports a bad url
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
        fail(1, f"no store at {path}: the SQLite file does not exist "
                f"(pass --db URL or set OKE_DATABASE_URL)")


def check_arguments(ctx: Any) -> None:
    """Refuse a text argument no store can be asked about: a NUL, or bytes that were not UTF-8
    (Python hands those over as lone surrogates). Exit 2 naming the argument, before any query."""
    while ctx is not None:
        for param in ctx.command.params:
            values = ctx.params.get(param.name or "")
            for value in values if isinstance(values, (list, tuple)) else [values]:
                if not isinstance(value, str):
                    continue
                label = (param.opts[0] if getattr(param, "param_type_name", "") == "option"
                         else (param.metavar or str(param.name).upper()).strip("[].") or str(param.name))
                if "\x00" in value:
                    fail(2, f"{label}: contains a NUL character")
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    fail(2, f"{label}: {ascii(value)[:80]} is not valid UTF-8 text")
        ctx = ctx.parent


async def _with_store(url: str, fn: Callable[[Store], Awaitable[T]]) -> T:
    store = make_store(url)
    await store.open()
    try:
        return await fn(store)
    finally:
        await store.close()


def run(state: State, fn: Callable[[Store], Awaitable[T]]) -> T:
    """Open the store, run `fn`, close it; map failures to exit codes and one-line reasons."""
    _check_sqlite_file(state.db)
    try:
        return asyncio.run(_with_store(state.db, fn))
    except (ops.UnknownSignal, ops.UnknownMessage, ops.UnknownRun) as err:
        fail(2, str(err))
    except OkeError as err:
        fail(2, str(err))
    except (StoreUnavailable, SchemaTooNew) as err:
        fail(1, str(err))
    except SQLAlchemyError as err:
        orig = getattr(err, "orig", None)
        fail(1, f"store error ({_target(state.db)}): {type(orig).__name__ if orig else type(err).__name__}: "
                f"{orig or err}")
    except (OSError, sqlite3.Error, asyncio.TimeoutError) as err:
        fail(1, f"store error ({_target(state.db)}): {type(err).__name__}: {err}")
    except ValueError as err:
        fail(2, str(err))
    except OverflowError as err:  # a number no store column can hold
        fail(2, f"a number is out of range: {err}")
    except Exception as err:
        if _is_driver_error(err):
            fail(1, f"store error ({_target(state.db)}): {type(err).__name__}: {err}")
        raise


def _is_driver_error(err: BaseException) -> bool:
    try:
        import asyncpg
    except ImportError:  # pragma: no cover
        return False
    return isinstance(err, (asyncpg.PostgresError, asyncpg.InterfaceError))


def _target(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


DB_OPTION: Any = typer.Option(None, "--db", metavar="URL",
                              help="Database url or SQLite file path (also accepted before the command).")


def state_of(ctx: typer.Context, db: str | None = None) -> State:
    """The global options, with a command's own `--db` (given after the command name) winning."""
    check_arguments(ctx)
    obj = ctx.find_root().obj
    if not isinstance(obj, State):  # a command invoked without the root callback (tests)
        obj = State(db=_database_url(None), read_only=False, actor=None)
    if db:
        obj = State(db=_database_url(db), read_only=obj.read_only, actor=obj.actor)
    return obj


# --limit N beyond this reads as "all of them": a larger N overflows the stores' 64-bit LIMIT
MAX_LIMIT = 1_000_000_000


def _writes(state: State, command: str) -> None:
    if state.read_only:
        fail(2, f"--read-only: {command} writes to the store; drop --read-only to run it")


def _interactive() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def _older_than(text: str | None) -> int | None:
    if text is None:
        return None
    ms = parse_duration_ms(text)
    if ms is None:
        fail(2, f'--older-than: "{text}" is not a duration: use a positive integer and a unit '
                f'(ms, s, m, h, d), e.g. 30s, 24h, 7d')
    return ms


_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(?:/\s*(s|sec|m|min|h))?\s*$")
_PER = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _rate(text: str | None) -> float | None:
    if text is None:
        return None
    match = _RATE.match(text)
    value = float(match.group(1)) / _PER[match.group(2)] if match else 0.0
    if not match or not 0 < value < float("inf"):  # 400 nines parse as inf
        fail(2, f'--rate: "{text}" is not a rate: use messages per second like 50/s (or 600/m)')
    return value


def _actor(state: State, actor: str | None) -> str | None:
    return actor or state.actor


def _database_url(given: str | None) -> str:
    try:
        return database_url(given)
    except BadDatabaseUrl as err:
        fail(2, str(err))


def _print_version(wanted: bool) -> None:
    if wanted:
        from .cli_run import version
        typer.echo(f"okconsole {version()}")
        raise typer.Exit(0)


# -- root ---------------------------------------------------------------------------------------
@app.callback(invoke_without_command=True)
def root(
    ctx: typer.Context,
    db: Optional[str] = typer.Option(
        None, "--db", metavar="URL",
        help="Database url or SQLite file path (default: env OKE_DATABASE_URL, then "
             "sqlite+aiosqlite:///.oke/oke.db; an absolute SQLite url has four slashes)."),
    read_only: bool = typer.Option(False, "--read-only", help="Refuse every write (replay, purge)."),
    actor: Optional[str] = typer.Option(None, "--actor", metavar="NAME", help="Who is acting, for the audit log "
                                                              "(default: the OS user)."),
    _version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                  help="Print the version and exit."),
) -> None:
    ctx.obj = State(db=_database_url(db), read_only=read_only, actor=actor)
    if ctx.invoked_subcommand is None:
        from .cli_run import require_terminal, run_tui
        require_terminal(ctx)
        run_tui(ctx.obj.db, read_only, actor=actor)


# -- reads --------------------------------------------------------------------------------------
@app.command()
def stats(ctx: typer.Context, db: Optional[str] = DB_OPTION,
          as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Per signal: pending, inflight, delivered and dead counts, and the oldest pending age (lag)."""
    state = state_of(ctx, db)
    rows = run(state, ops.stats)
    if as_json:
        output.print_json(rows)
    else:
        output.render_stats(output.console(), rows, state.db)


@app.command()
def messages(
    ctx: typer.Context,
    db: Optional[str] = DB_OPTION,
    signal: str = typer.Argument(..., metavar="SIGNAL", help="The signal's name."),
    status: Optional[str] = typer.Option(None, "--status", metavar="S", help="pending | inflight | delivered | dead"),
    key: Optional[str] = typer.Option(None, "--key", metavar="K", help="Only messages with this key."),
    limit: int = typer.Option(50, "--limit", min=1, metavar="N", help="At most this many (newest first)."),
    search: Optional[str] = typer.Option(None, "--search", metavar="TEXT",
                                         help="Only messages whose payload, key or last failure contains TEXT "
                                              "(case-insensitive), searched by the store over the whole signal."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Messages of SIGNAL, newest first."""
    if status is not None and status not in ops.STATUSES:
        fail(2, f'--status: unknown status "{status}" (one of: {", ".join(ops.STATUSES)})')
    limit = min(limit, MAX_LIMIT)
    rows = run(state_of(ctx, db), lambda store: ops.messages(store, signal, status=status, key=key, limit=limit,
                                                             search=search))
    if as_json:
        output.print_json(rows)
    else:
        output.render_messages(output.console(), signal, rows)


@app.command()
def show(
    ctx: typer.Context,
    db: Optional[str] = DB_OPTION,
    message_id: str = typer.Argument(..., metavar="ID", help="A message id."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """One message: payload, every failure, its lease, what blocks it, its trace."""
    detail = run(state_of(ctx, db), lambda store: ops.show(store, message_id))
    if as_json:
        output.print_json(detail)
    else:
        output.render_show(output.console(), detail)


async def _require_signal(store: Store, name: str) -> None:
    if await ops.signal_info(store, name) is None:
        raise ops.UnknownSignal(name, await ops.known_signals(store))


HUMAN_DLQ_LIMIT = 100


@app.command()
def dlq(
    ctx: typer.Context,
    db: Optional[str] = DB_OPTION,
    signal: str = typer.Argument(..., metavar="SIGNAL", help="The signal's name."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, metavar="N",
                                        help="At most this many, newest first (default: every one with "
                                             f"--json, {HUMAN_DLQ_LIMIT} in the table)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Dead letters of SIGNAL, newest first, with every failure."""
    shown = min(limit, MAX_LIMIT) if limit is not None else None if as_json else HUMAN_DLQ_LIMIT

    async def go(store: Store) -> list[ops.DeadLetter]:
        await _require_signal(store, signal)
        return await ops.dead_letters(store, signal, None if shown is None else shown + 1)

    rows = run(state_of(ctx, db), go)
    more = shown is not None and len(rows) > shown
    rows = rows[:shown] if shown is not None else rows
    if as_json:
        output.print_json(rows)
        return
    out = output.console()
    output.render_dlq(out, signal, rows)
    if more:
        out.print(f"… more dead letters than the {shown} newest shown: pass --limit N, or --json for all.")


@app.command()
def failures(
    ctx: typer.Context,
    db: Optional[str] = DB_OPTION,
    signal: str = typer.Argument(..., metavar="SIGNAL", help="The signal's name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Dead and failing messages of SIGNAL grouped by failure code and message, newest first."""
    rows = run(state_of(ctx, db), lambda store: ops.failures(store, signal))
    if as_json:
        output.print_json(rows)
    else:
        output.render_failures(output.console(), signal, rows)


@app.command()
def audit(
    ctx: typer.Context,
    db: Optional[str] = DB_OPTION,
    limit: int = typer.Option(100, "--limit", min=1, metavar="N", help="At most this many (newest first)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The operator audit log: who replayed or purged what, when and why."""
    rows = run(state_of(ctx, db), lambda store: ops.audit(store, min(limit, MAX_LIMIT)))
    if as_json:
        output.print_json(rows)
    else:
        output.render_audit(output.console(), rows)


@app.command()
def trace(
    ctx: typer.Context,
    db: Optional[str] = DB_OPTION,
    run_id: str = typer.Argument(..., metavar="RUN_ID", help="Any run of the tree."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The run tree RUN_ID belongs to, from its root: each run and the messages it emitted."""
    root_node = run(state_of(ctx, db), lambda store: ops.trace(store, run_id))
    if as_json:
        output.print_json(root_node)
    else:
        output.render_trace(output.console(), root_node, run_id)


# -- writes -------------------------------------------------------------------------------------
def _load_payload(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        fail(2, f"--payload: cannot read {path}: {err}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        fail(2, f"--payload: {path} is not JSON: {err}")


def _warn(text: str) -> None:
    """A warning on stderr (stdout stays JSON-only)."""
    typer.echo(f"okconsole: warning: {text}", err=True)


def _confirm(question: str, what: str) -> None:
    """Ask on the terminal (the prompt goes to stderr); refuse without one."""
    if not _interactive():
        fail(2, f"{what} changes the store and stdin is not a terminal: pass --yes to confirm")
    if not typer.confirm(question, default=False, err=True):
        fail(1, f"{what} cancelled: nothing changed")


class NotDead(ValueError):
    """Named ids that are not dead letters: `replay` refuses them all (exit 2), naming each status."""


async def _refuse_not_dead(store: Store, signal: str, ids: list[str]) -> None:
    unique = list(dict.fromkeys(ids))
    preview = await ops.replay(store, signal, ids=unique, dry_run=True)
    assert isinstance(preview, ops.ReplayPreview)
    if preview.would_replay == len(unique):
        return
    wrong = [(msg_id, detail.status) for msg_id in unique
             if (detail := await ops.show(store, msg_id)).status != "dead"]
    if wrong:
        named = ", ".join(f"{msg_id} is {state}" for msg_id, state in wrong[:5])
        more = f" (and {len(wrong) - 5} more)" if len(wrong) > 5 else ""
        raise NotDead(f"replay: {named}{more}, not dead: only dead letters are replayed; nothing changed")


async def _replay_dead_only(store: Store, signal: str, **options: Any) -> Any:
    """ops.replay, after refusing named ids that are not dead (SPEC §10b)."""
    if options.get("ids"):
        await _refuse_not_dead(store, signal, options["ids"])
    return await ops.replay(store, signal, **options)


@app.command()
def replay(
    ctx: typer.Context,
    db: Optional[str] = DB_OPTION,
    signal: str = typer.Argument(..., metavar="SIGNAL", help="The signal's name."),
    ids: Optional[list[str]] = typer.Argument(None, metavar="[ID]...", help="Dead letters to replay."),
    all_: bool = typer.Option(False, "--all", help="Every dead letter of SIGNAL (that the filters keep)."),
    code: Optional[str] = typer.Option(None, "--code", metavar="C", help="Only those whose last failure has this code."),
    match: Optional[str] = typer.Option(None, "--match", metavar="TEXT",
                                        help="Only those whose last failure message contains TEXT "
                                             "(case-insensitive)."),
    key: Optional[str] = typer.Option(None, "--key", metavar="K", help="Only those with this key."),
    older_than: Optional[str] = typer.Option(None, "--older-than", metavar="D",
                                             help="Only those dead for at least D (e.g. 30m, 7d)."),
    rate: Optional[str] = typer.Option(None, "--rate", metavar="N/s",
                                       help="Replay at most N per second, in chunks; each chunk is atomic "
                                            "but the whole replay is then NOT (an interruption leaves "
                                            "earlier chunks replayed)."),
    reason: Optional[str] = typer.Option(None, "--reason", metavar="TEXT", help="Why, for the audit log."),
    payload: Optional[str] = typer.Option(None, "--payload", metavar="FILE",
                                          help="Replace the payload of the one named message with this "
                                               "JSON file ('-' reads stdin)."),
    actor: Optional[str] = typer.Option(None, "--actor", metavar="NAME", help="Who is acting (default: the OS user)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the count and a sample; change nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Requeue dead letters: dead → pending, same id (per-key order holds), attempts reset to 0,
    failure history kept behind a "replayed" marker, an audit record written. Without --rate
    the replay is one transaction: it commits whole or not at all."""
    state = state_of(ctx, db)
    ids = list(ids or [])
    if all_ and ids:
        fail(2, "name dead-letter ids or pass --all, not both")
    if not all_ and not ids:
        fail(2, "name the dead letters to replay (ID...), or pass --all")
    older_ms = _older_than(older_than)
    per_second = _rate(rate)
    new_payload: Any = ops.UNCHANGED
    if payload is not None:
        if all_ or len(ids) != 1:
            fail(2, "--payload replaces the payload of exactly one message: name one ID")
        new_payload = _load_payload(payload)
    if not dry_run:
        _writes(state, "replay")
    options = dict(ids=None if all_ else ids, all=all_, code=code, match=match, key=key,
                   older_than_ms=older_ms, payload=new_payload)
    who = _actor(state, actor)
    if not dry_run and not yes:
        _check_sqlite_file(state.db)
        if not _interactive():
            fail(2, "replay changes the store and stdin is not a terminal: pass --yes to confirm")
        preview = run(state, lambda store: _replay_dead_only(store, signal, dry_run=True, **options))
        assert isinstance(preview, ops.ReplayPreview)
        if preview.would_replay == 0:
            result: Any = ops.Replayed(replayed=0, ids=[])
            if as_json:
                output.print_json(result)
            else:
                output.render_replay(output.console(), signal, result)
            return
        _confirm(f"Replay {preview.would_replay} dead letter(s) of {signal}?", "replay")

    result = run(state, lambda store: _replay_dead_only(store, signal, dry_run=dry_run, reason=reason, actor=who,
                                                        rate=per_second, warn=_warn, **options))
    if as_json:
        output.print_json(result)
    else:
        output.render_replay(output.console(), signal, result)


@app.command()
def purge(
    ctx: typer.Context,
    db: Optional[str] = DB_OPTION,
    signal: str = typer.Argument(..., metavar="SIGNAL", help="The signal's name."),
    status: str = typer.Option(..., "--status", metavar="delivered|dead", help="Which finished messages."),
    older_than: Optional[str] = typer.Option(None, "--older-than", metavar="D",
                                             help="Only those finished at least D ago (e.g. 7d)."),
    reason: Optional[str] = typer.Option(None, "--reason", metavar="TEXT", help="Why, for the audit log."),
    actor: Optional[str] = typer.Option(None, "--actor", metavar="NAME", help="Who is acting (default: the OS user)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the count; change nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Delete finished messages of SIGNAL (with their failure and step rows), in one transaction."""
    state = state_of(ctx, db)
    if status not in ("delivered", "dead"):
        fail(2, f'--status: purge deletes finished messages: "delivered" or "dead", not "{status}"')
    older_ms = _older_than(older_than)
    if not dry_run:
        _writes(state, "purge")
    if not dry_run and not yes:
        _check_sqlite_file(state.db)
        if not _interactive():
            fail(2, "purge changes the store and stdin is not a terminal: pass --yes to confirm")
        preview = run(state, lambda store: ops.purge(store, signal, status, older_ms, dry_run=True))
        assert isinstance(preview, ops.PurgePreview)
        if preview.would_purge:
            _confirm(f"Delete {preview.would_purge} {status} message(s) of {signal}?", "purge")
    result = run(state, lambda store: ops.purge(store, signal, status, older_ms, actor=_actor(state, actor),
                                                reason=reason, dry_run=dry_run))
    if as_json:
        output.print_json(result)
    else:
        output.render_purge(output.console(), signal, status, result)


# -- the TUI and the long-running commands live in cli_run (registered on import) -------------
from . import cli_bindings, cli_run  # noqa: E402,F401


def main() -> None:
    """Console-script entry point."""
    app(prog_name="okconsole")


if __name__ == "__main__":
    main()
