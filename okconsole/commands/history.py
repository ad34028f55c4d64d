"""`okconsole history SIGNAL [--since 1h] [--json]`: a signal's counts per minute, oldest first."""

from __future__ import annotations

import typer

from engine import ops
from engine.ids import now_ms

from .. import output
from .common import DB_OPTION, JSON_OPTION, SIGNAL_ARGUMENT, duration_option, state_of
from .session import run


def history(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    signal: str = SIGNAL_ARGUMENT,
    since: str = typer.Option("1h", "--since", metavar="D", help="How far back (e.g. 15m, 24h, 7d)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Per minute: emitted, delivered, failed (and retried), dead and pruned messages of SIGNAL."""
    since_ms = now_ms() - duration_option("--since", since)
    rows = run(state_of(ctx, db), lambda store: ops.history(store, signal, since_ms))
    if as_json:
        output.print_json(rows)
    else:
        output.render_history(output.console(), signal, rows)


COMMANDS = (history,)
