"""`okconsole why` (one verdict on why a message is, or is not, running) and `okconsole keys` (the
heads of a signal's keys, and the blocked ones): reads through `engine.ops`."""

from __future__ import annotations

import typer

from engine import ops

from .. import output, why_output
from .common import DB_OPTION, JSON_OPTION, SIGNAL_ARGUMENT, state_of
from .session import run

KEYS_LIMIT = 100


def why(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    message_id: str = typer.Argument(..., metavar="ID", help="A message id (msg_…)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Why message ID is (not) running. One verdict (delivered, dead, running, orphaned, paused,
    no_worker, blocked_by_key, not_due, concurrency_limited, rate_limited, due) and one line to act on. Exit 0 for every
    verdict of a message found; 2 for an unknown or malformed id."""
    verdict = run(state_of(ctx, db), lambda store: ops.why(store, message_id))
    if as_json:
        output.print_json(verdict)
    else:
        why_output.render_why(output.console(), verdict)


def keys(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    signal: str = SIGNAL_ARGUMENT,
    blocked: bool = typer.Option(
        False, "--blocked", help="Only keys whose head failed at least once with messages waiting behind it."
    ),
    limit: int = typer.Option(
        KEYS_LIMIT, "--limit", min=1, max=10_000, metavar="N", help="At most this many keys (1 to 10000)."
    ),
    after: str | None = typer.Option(None, "--after", metavar="CURSOR", help="The next page: the cursor printed."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Keys of SIGNAL and what blocks them. Keys with unfinished messages, in key order: each key's head (its oldest
    unfinished message), the head's status, failed attempts and last failure, and how many
    messages wait behind it. Says when there are more (--after CURSOR for the next page)."""
    page = run(state_of(ctx, db), lambda store: ops.keys(store, signal, blocked, limit=limit, after=after))
    if as_json:
        output.print_json(page)
    else:
        why_output.render_keys(output.console(), signal, page, blocked)


COMMANDS = (why, keys)
