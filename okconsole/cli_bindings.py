"""`okconsole bindings` and `okconsole unbind`: which flows get a signal's messages, and retiring one.

Registered on the Typer app of `okconsole.cli` (imported at its end). Both go through
`engine.ops` only; `unbind` is a write like `replay` and `purge`: refused with --read-only,
asks before acting unless --yes (refusing without a TTY), audited with the actor and reason.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable, Optional, TypeVar

import typer
from rich.markup import escape

from engine import ops
from engine.store import Store

from . import output
from .cli import DB_OPTION, State, _actor, _confirm, _interactive, _writes, app, fail, run, state_of

T = TypeVar("T")


def _run(state: State, fn: Callable[[Store], Awaitable[T]]) -> T:
    """`run`, with an unknown flow as bad usage (exit 2) like an unknown signal."""
    try:
        return run(state, fn)
    except ops.UnknownFlow as err:
        fail(2, str(err))


@app.command()
def bindings(ctx: typer.Context, db: Optional[str] = DB_OPTION,
             as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Every recorded binding: signal, kind, flow, when a process last ran with it, and whether it is
    active (seen within its binding_ttl and not unbound: only active flows get broadcast copies)."""
    state = state_of(ctx, db)
    rows = _run(state, ops.bindings)
    if as_json:
        output.print_json(rows)
        return
    output.render_bindings(output.console(), rows, state.db)


@app.command()
def unbind(
    ctx: typer.Context,
    db: Optional[str] = DB_OPTION,
    signal: str = typer.Argument(..., metavar="SIGNAL", help="The signal's name."),
    flow: str = typer.Argument(..., metavar="FLOW", help="The bound flow's name (see okconsole bindings)."),
    reason: Optional[str] = typer.Option(None, "--reason", metavar="TEXT", help="Why, for the audit log."),
    actor: Optional[str] = typer.Option(None, "--actor", metavar="NAME", help="Who is acting (default: the OS user)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Retire one binding at once: FLOW gets no new copies of SIGNAL, and its pending copies end dead
    with failure code Unbound (audited; replayable). A process that boots binding FLOW again makes
    it active again."""
    state = state_of(ctx, db)
    _writes(state, "unbind")
    if not yes:
        found = _run(state, lambda store: ops.binding(store, signal, flow))  # names checked first
        if not _interactive():
            fail(2, "unbind changes the store and stdin is not a terminal: pass --yes to confirm")
        effect = ("it gets no new copies and its pending copies end dead" if found.kind == "broadcast"
                  else "it is no longer listed as bound (the signal's messages stay queued)")
        _confirm(f'Unbind flow "{flow}" from {signal}? {effect[0].upper()}{effect[1:]}.', "unbind")
    result = _run(state, lambda store: ops.unbind(store, signal, flow, actor=_actor(state, actor), reason=reason))
    if as_json:
        output.print_json(result)
        return
    _render_unbound(output.console(), result)


def _render_unbound(out: Any, result: ops.Unbound) -> None:
    out.print(f'Unbound flow "{escape(result.flow)}" from {escape(result.signal)}: '
              f"{result.dead} pending cop{'y' if result.dead == 1 else 'ies'} ended dead (code Unbound).")
    for msg_id in result.ids[:20]:
        out.print(f"  {msg_id}")
    if len(result.ids) > 20:
        out.print(f"  … and {len(result.ids) - 20} more")
    if result.ids:
        out.print(f"Replay them with: okconsole replay {escape(result.signal)} ID… (or --all --code Unbound)")
