"""`okconsole workers` (who holds the leases, which are orphaned) and `okconsole doctor` (what is
wrong with the store, and the command for each finding). Both are reads through `engine.ops`."""

from __future__ import annotations

import typer

from engine import ops

from .. import health_output, output
from .common import DB_OPTION, JSON_OPTION, state_of
from .session import run


def workers(ctx: typer.Context, db: str | None = DB_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Workers seen in the last hour: host, pid, concurrency, leases held, and orphaned leases
    (held by a worker not seen for 30 s: stuck until the lease expires, not slow)."""
    state = state_of(ctx, db)
    rows = run(state, ops.workers)
    if as_json:
        output.print_json(rows)
    else:
        health_output.render_workers(output.console(), rows, state.db)


def doctor(ctx: typer.Context, db: str | None = DB_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Check the store: schema version, orphaned leases, once signals bound to two flows, inactive
    bindings holding pending copies, paused signals, due messages older than 5 minutes, dead letters
    added in the last 15 minutes, a failure rate of 20 % or more, keys blocked by a failing head.
    Exit 1 when a check fails, else 0."""
    checks = run(state_of(ctx, db), ops.doctor, schema_too_new=ops.doctor_schema_too_new)
    if as_json:
        output.print_json(checks)
    else:
        health_output.render_doctor(output.console(), checks)
    if any(c.status == "fail" for c in checks):
        raise typer.Exit(1)


COMMANDS = (workers, doctor)
