"""The read-only commands: stats, messages, show, dlq, failures, audit, trace (one `engine.ops` read each)."""

from __future__ import annotations

import typer

from engine import ops

from .. import output
from .common import DB_OPTION, JSON_OPTION, MAX_LIMIT, SIGNAL_ARGUMENT, fail, state_of
from .session import run

HUMAN_DLQ_LIMIT = 100


def stats(ctx: typer.Context, db: str | None = DB_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Per signal: pending, inflight, delivered and dead counts, and the oldest pending age (lag)."""
    state = state_of(ctx, db)
    rows = run(state, ops.stats)
    if as_json:
        output.print_json(rows)
    else:
        output.render_stats(output.console(), rows, state.db)


def messages(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    signal: str = SIGNAL_ARGUMENT,
    status: str | None = typer.Option(None, "--status", metavar="S", help="pending | inflight | delivered | dead"),
    key: str | None = typer.Option(None, "--key", metavar="K", help="Only messages with this key."),
    limit: int = typer.Option(50, "--limit", min=1, metavar="N", help="At most this many (newest first)."),
    search: str | None = typer.Option(
        None,
        "--search",
        metavar="TEXT",
        help="Only messages whose payload, key or last failure contains TEXT "
        "(case-insensitive), searched by the store over the whole signal.",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Messages of SIGNAL, newest first."""
    if status is not None and status not in ops.STATUSES:
        fail(2, f'--status: unknown status "{status}" (one of: {", ".join(ops.STATUSES)})')
    limit = min(limit, MAX_LIMIT)
    rows = run(
        state_of(ctx, db),
        lambda store: ops.messages(store, signal, status=status, key=key, limit=limit, search=search),
    )
    if as_json:
        output.print_json(rows)
    else:
        output.render_messages(output.console(), signal, rows)


def show(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    message_id: str = typer.Argument(..., metavar="ID", help="A message id."),
    as_json: bool = JSON_OPTION,
    full: bool = typer.Option(
        False,
        "--full",
        help="Print the whole payload and failure texts (else each is cut at 64 KiB) and every "
        "attempt's traceback (else the last one's).",
    ),
) -> None:
    """One message: payload, every failure, its lease, what blocks it, its trace."""
    detail = run(state_of(ctx, db), lambda store: ops.show(store, message_id))
    if as_json:
        output.print_json(detail)
    else:
        output.render_show(output.console(), detail, full=full)


async def _require_signal(store: ops.Store, name: str) -> None:
    if await ops.signal_info(store, name) is None:
        raise ops.UnknownSignal(name, await ops.known_signals(store))


def dlq(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    signal: str = SIGNAL_ARGUMENT,
    limit: int | None = typer.Option(
        None,
        "--limit",
        min=1,
        metavar="N",
        help=f"At most this many, newest first (default: every one with --json, {HUMAN_DLQ_LIMIT} in the table).",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Dead letters of SIGNAL, newest first, with every failure."""
    shown = min(limit, MAX_LIMIT) if limit is not None else None if as_json else HUMAN_DLQ_LIMIT

    async def go(store: ops.Store) -> list[ops.DeadLetter]:
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


def failures(
    ctx: typer.Context, db: str | None = DB_OPTION, signal: str = SIGNAL_ARGUMENT, as_json: bool = JSON_OPTION
) -> None:
    """Dead and failing messages of SIGNAL grouped by failure code and message, newest first."""
    rows = run(state_of(ctx, db), lambda store: ops.failures(store, signal))
    if as_json:
        output.print_json(rows)
    else:
        output.render_failures(output.console(), signal, rows)


def audit(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    limit: int = typer.Option(100, "--limit", min=1, metavar="N", help="At most this many (newest first)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """The operator audit log: who replayed or purged what, when and why."""
    rows = run(state_of(ctx, db), lambda store: ops.audit(store, min(limit, MAX_LIMIT)))
    if as_json:
        output.print_json(rows)
    else:
        output.render_audit(output.console(), rows)


def trace(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    run_id: str = typer.Argument(..., metavar="RUN_ID", help="Any run of the tree."),
    as_json: bool = JSON_OPTION,
) -> None:
    """The run tree RUN_ID belongs to, from its root: each run and the messages it emitted."""
    root_node = run(state_of(ctx, db), lambda store: ops.trace(store, run_id))
    if as_json:
        output.print_json(root_node)
    else:
        output.render_trace(output.console(), root_node, run_id)


COMMANDS = (stats, messages, show, dlq, failures, audit, trace)
