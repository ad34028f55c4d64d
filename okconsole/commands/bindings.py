"""`okconsole bindings`, `okconsole clocks` and `okconsole unbind`: which flows get a signal's
messages (and which clocks emit them), and retiring one.

Both go through `engine.ops` only; `unbind` is a write like `replay` and `purge`: refused with --read-only,
asks before acting unless --yes (refusing without a TTY), audited with the actor and reason.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer

from engine import ops

from .. import output
from ..safe import rich_markup
from .common import (
    ACTOR_OPTION,
    DB_OPTION,
    JSON_OPTION,
    REASON_OPTION,
    SIGNAL_ARGUMENT,
    YES_OPTION,
    State,
    actor_of,
    confirm,
    fail,
    require_terminal_to_confirm,
    require_writes,
    state_of,
)
from .session import run

T = TypeVar("T")


def _run(state: State, fn: Callable[[ops.Store], Awaitable[T]]) -> T:
    """`run`, with an unknown flow as bad usage (exit 2) like an unknown signal."""
    try:
        return run(state, fn)
    except ops.UnknownFlow as err:
        fail(2, str(err))


def bindings(ctx: typer.Context, db: str | None = DB_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Every recorded binding: signal, kind, flow, when a process last ran with it, and whether it is
    active (seen within its binding_ttl and not unbound: only active flows get broadcast copies)."""
    state = state_of(ctx, db)
    rows = _run(state, ops.bindings)
    if as_json:
        output.print_json(rows)
        return
    output.render_bindings(output.console(), rows, state.db)


def clocks(ctx: typer.Context, db: str | None = DB_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Every clock trigger apps declared: its flow, schedule and time zone, the next tick, the last
    tick's time, message and status, and whether it is paused (pause and resume take its signal,
    clock.FLOW)."""
    state = state_of(ctx, db)
    rows = _run(state, ops.clocks)
    if as_json:
        output.print_json(rows)
        return
    output.render_clocks(output.console(), rows, state.db)


def unbind(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    signal: str = SIGNAL_ARGUMENT,
    flow: str = typer.Argument(..., metavar="FLOW", help="The bound flow's name (see okconsole bindings)."),
    reason: str | None = REASON_OPTION,
    actor: str | None = ACTOR_OPTION,
    yes: bool = YES_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Retire one binding at once: FLOW gets no new copies of SIGNAL, and its pending copies end dead
    with failure code Unbound (audited; replayable). A process that boots binding FLOW again makes
    it active again."""
    state = state_of(ctx, db)
    require_writes(state, "unbind")
    if not yes:
        found = _run(state, lambda store: ops.binding(store, signal, flow))  # names checked first
        require_terminal_to_confirm("unbind")
        effect = (
            "it gets no new copies and its pending copies end dead"
            if found.kind == "broadcast"
            else "it is no longer listed as bound (the signal's messages stay queued)"
        )
        reason = confirm(f'Unbind flow "{flow}" from {signal}? {effect[0].upper()}{effect[1:]}.', "unbind", reason)
    result = _run(state, lambda store: ops.unbind(store, signal, flow, actor=actor_of(state, actor), reason=reason))
    if as_json:
        output.print_json(result)
        return
    _render_unbound(output.console(), result)


def _render_unbound(out: Any, result: ops.Unbound) -> None:
    out.print(
        f'Unbound flow "{rich_markup(result.flow)}" from {rich_markup(result.signal)}: '
        f"{result.dead} pending cop{'y' if result.dead == 1 else 'ies'} ended dead (code Unbound)."
    )
    for msg_id in result.ids[:20]:
        out.print(f"  {msg_id}")
    if len(result.ids) > 20:
        out.print(f"  … and {len(result.ids) - 20} more")
    if result.ids:
        out.print(f"Replay them with: okconsole replay {rich_markup(result.signal)} ID… (or --all --code Unbound)")


COMMANDS = (bindings, clocks, unbind)
