"""The operator controls: `pause` / `resume` a signal, `limit` its flow, `cancel`, `delete`
and `retry` named messages.

Each is a write like `replay`: refused under --read-only, asks before acting unless --yes (refusing
without a terminal, exit 2), audited with the actor and the reason, one transaction. Named
messages in the wrong state are skipped and reported (JSON `skipped: [{id, status}]`); an id the
signal does not have is bad usage (exit 2, nothing changed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

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
from .session import check_sqlite_file, run

SHOWN = 20  # ids listed in a table's report
# Why `retry` left a message, by its status.
RETRY_HINT = {
    "pending": "already due: nothing to retry",
    "dead": "a dead letter is requeued with: okconsole replay",
    "inflight": "a worker holds it",
    "delivered": "it is done",
}


def _ask_first(
    state: State, command: str, yes: bool, reason: str | None, question: Callable[[], str | None]
) -> str | None:
    """Refuse under --read-only; unless --yes, ask `question()` (None: nothing to ask about) and
    then the reason, when --reason gave none. Returns the reason for the audit log."""
    require_writes(state, command)
    if yes:
        return reason
    check_sqlite_file(state.db)
    require_terminal_to_confirm(command)
    text = question()
    return reason if text is None else confirm(text, command, reason)


def _report(result: Any, as_json: bool, lines: Callable[[], list[str]]) -> None:
    if as_json:
        output.print_json(result)
        return
    out = output.console()
    for line in lines():
        out.print(line)


def _done_lines(verb: str, noun: str, signal: str, ids: list[str], skipped: list[ops.Skipped]) -> list[str]:
    """ "<Verb> N <noun>(s) of SIGNAL." with the ids, then every skipped id with its status."""
    lines = [f"{verb} {len(ids)} {noun}(s) of {rich_markup(signal)}."]
    lines += [f"  {rich_markup(msg_id)}" for msg_id in ids[:SHOWN]]
    if len(ids) > SHOWN:
        lines.append(f"  … and {len(ids) - SHOWN} more")
    for s in skipped:
        hint = RETRY_HINT.get(s.status) if verb == "Retried" else None
        lines.append(f"Skipped {rich_markup(s.id)}: it is {rich_markup(s.status)}" + (f" ({hint})" if hint else ""))
    return lines


# -- pause / resume -------------------------------------------------------------------------------
def pause(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    signal: str = SIGNAL_ARGUMENT,
    reason: str | None = REASON_OPTION,
    actor: str | None = ACTOR_OPTION,
    yes: bool = YES_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Pause a once or broadcast signal: within 1 s no process sharing the store claims its messages
    (emits are still stored, running handlers finish) until `okconsole resume`. Survives restarts.
    Prints {"signal", "paused": true, "changed"} with --json."""
    state = state_of(ctx, db)
    reason = _ask_first(
        state, "pause", yes, reason, lambda: f"Pause {signal}? No worker will take its messages until resumed."
    )
    result = run(state, lambda store: ops.pause(store, signal, actor=actor_of(state, actor), reason=reason))
    _report(result, as_json, lambda: [_pause_line(result)])


def resume(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    signal: str = SIGNAL_ARGUMENT,
    reason: str | None = REASON_OPTION,
    actor: str | None = ACTOR_OPTION,
    yes: bool = YES_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Resume a paused signal: workers take its messages again. Prints {"signal", "paused": false,
    "changed"} with --json."""
    state = state_of(ctx, db)
    reason = _ask_first(state, "resume", yes, reason, lambda: f"Resume {signal}? Workers take its messages again.")
    result = run(state, lambda store: ops.resume(store, signal, actor=actor_of(state, actor), reason=reason))
    _report(result, as_json, lambda: [_pause_line(result)])


def _pause_line(result: ops.PauseState) -> str:
    name = rich_markup(result.signal)
    if result.paused:
        return f"Paused {name}: its messages wait until resumed." if result.changed else f"{name} was paused already."
    return f"Resumed {name}." if result.changed else f"{name} was not paused."


# -- limit ----------------------------------------------------------------------------------------
def limit(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    signal: str = SIGNAL_ARGUMENT,
    concurrency: str | None = typer.Option(
        None, "--concurrency", metavar="N|none", help="At most N running at once across every process; none lifts it."
    ),
    rate: str | None = typer.Option(
        None, "--rate", metavar="N/D|none", help="At most N handler starts per window D (100/1m, 5/s); none lifts it."
    ),
    reset: bool = typer.Option(False, "--reset", help="Drop the override: the declared limits hold again."),
    reason: str | None = REASON_OPTION,
    actor: str | None = ACTOR_OPTION,
    yes: bool = YES_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Override SIGNAL's flow limits cluster-wide (every process follows within 1 s) until --reset.
    Audited. Prints {"signal", "concurrency", "rate", "overridden", "changed"} with --json."""
    state = state_of(ctx, db)
    require_writes(state, "limit")
    try:  # a bad value changes nothing: refused before anything is asked or opened
        ops.check_limit(concurrency, rate, reset=reset)
    except ValueError as err:
        fail(2, f"limit: {err}")
    setting = (
        "the declared limits"
        if reset
        else ", ".join(
            f"{name} {value}" for name, value in (("concurrency", concurrency), ("rate", rate)) if value is not None
        )
    )
    reason = _ask_first(state, "limit", yes, reason, lambda: f"Set {signal} to {setting} in every process?")
    who = actor_of(state, actor)
    result = run(
        state,
        lambda store: ops.limit(
            store, signal, concurrency=concurrency, rate=rate, reset=reset, actor=who, reason=reason
        ),
    )
    _report(result, as_json, lambda: [_limit_line(result)])


def _limit_line(result: ops.LimitState) -> str:
    name = rich_markup(result.signal)
    now = f"concurrency {result.concurrency or 'none'}, rate {rich_markup(result.rate or 'none')}"
    source = "overridden" if result.overridden else "as declared"
    return f"{name}: {now} ({source})." if result.changed else f"{name} had no override: {now} (as declared)."


# -- cancel / delete / retry ----------------------------------------------------------------------
IDS_ARGUMENT: Any = typer.Argument(None, metavar="[ID]...", help="The messages, by id.")


def _named(ids: list[str] | None, what: str) -> list[str]:
    named = list(dict.fromkeys(ids or []))
    if not named:
        fail(2, f"name the messages to {what} (ID...)")
    return named


def cancel(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    signal: str = SIGNAL_ARGUMENT,
    ids: list[str] | None = IDS_ARGUMENT,
    all_: bool = typer.Option(False, "--all", help="Every pending message of SIGNAL (that --key keeps)."),
    key: str | None = typer.Option(None, "--key", metavar="K", help="Only messages with this key."),
    reason: str | None = REASON_OPTION,
    actor: str | None = ACTOR_OPTION,
    yes: bool = YES_OPTION,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be cancelled; change nothing."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Cancel pending messages (due or not yet due): they end dead with failure code Cancelled (the
    reason as its message), kept and replayable. A running one (under a live lease) is asked to stop:
    its worker cancels the handler within about 2 s and ends it the same way (--json: `requested`
    until then); one whose lease expired is cancelled."""
    state = state_of(ctx, db)
    if all_ and ids:
        fail(2, "name message ids or pass --all, not both")
    named = None if all_ else _named(ids, "cancel")

    def call(dry: bool, why: str | None = None) -> Callable[[ops.Store], Awaitable[Any]]:
        who = actor_of(state, actor)
        return lambda store: ops.cancel(store, signal, named, all=all_, key=key, actor=who, reason=why, dry_run=dry)

    if dry_run:
        preview = run(state, call(True))
        _report(preview, as_json, lambda: _preview_lines(signal, preview))
        return
    why = _ask_first(state, "cancel", yes, reason, lambda: _cancel_question(state, signal, call(True)))
    result = run(state, call(False, why))
    _report(result, as_json, lambda: _cancelled_lines(signal, result))


def _cancelled_lines(signal: str, result: ops.Cancelled) -> list[str]:
    lines = _done_lines("Cancelled", "message", signal, result.ids, result.skipped)
    if result.requested:
        lines.append(
            f"Asked the worker of {len(result.requested)} running message(s) to stop its handler "
            "(it ends them dead, code Cancelled, within about 2 s):"
        )
        lines += [f"  {rich_markup(msg_id)}" for msg_id in result.requested[:SHOWN]]
        if len(result.requested) > SHOWN:
            lines.append(f"  … and {len(result.requested) - SHOWN} more")
    return lines


def _cancel_question(state: State, signal: str, preview: Callable[[ops.Store], Awaitable[Any]]) -> str | None:
    found = run(state, preview)
    running = len(found.would_request)
    if not found.would_cancel and not running:
        return None
    text = f"Cancel {found.would_cancel} message(s) of {signal}? They end dead (code Cancelled), replayable."
    if running:
        text += f" {running} running: their handlers are cancelled."
    return text


def _preview_lines(signal: str, preview: ops.CancelPreview) -> list[str]:
    lines = [f"Would cancel {preview.would_cancel} message(s) of {rich_markup(signal)} (dry run: nothing changed)."]
    if preview.ids:
        more = " …" if preview.would_cancel > len(preview.ids) else ""
        lines.append("  " + rich_markup(", ".join(preview.ids)) + more)
    lines += [f"Would skip {s.id}: it is {s.status}" for s in preview.skipped]
    lines += [f"Would ask the worker running {msg_id} to stop its handler" for msg_id in preview.would_request]
    return lines


def delete(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    signal: str = SIGNAL_ARGUMENT,
    ids: list[str] | None = IDS_ARGUMENT,
    reason: str | None = REASON_OPTION,
    actor: str | None = ACTOR_OPTION,
    yes: bool = YES_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Delete finished (delivered or dead) messages by id, with their failure history; others are skipped."""
    state = state_of(ctx, db)
    named = _named(ids, "delete")
    reason = _ask_first(
        state,
        "delete",
        yes,
        reason,
        lambda: f"Delete {len(named)} message(s) of {signal}? Only delivered or dead ones go.",
    )
    who = actor_of(state, actor)
    result = run(state, lambda store: ops.delete(store, signal, named, actor=who, reason=reason))
    _report(result, as_json, lambda: _done_lines("Deleted", "message", signal, result.ids, result.skipped))


def retry(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    signal: str = SIGNAL_ARGUMENT,
    ids: list[str] | None = IDS_ARGUMENT,
    reason: str | None = REASON_OPTION,
    actor: str | None = ACTOR_OPTION,
    yes: bool = YES_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Make pending messages that wait for their run_at (a delay or a back-off) due now; others are
    skipped (a dead letter is requeued with `okconsole replay`)."""
    state = state_of(ctx, db)
    named = _named(ids, "retry")
    reason = _ask_first(state, "retry", yes, reason, lambda: f"Retry {len(named)} waiting message(s) of {signal} now?")
    who = actor_of(state, actor)
    result = run(state, lambda store: ops.retry(store, signal, named, actor=who, reason=reason))
    _report(result, as_json, lambda: _done_lines("Retried", "message", signal, result.ids, result.skipped))


COMMANDS = (pause, resume, limit, cancel, delete, retry)
