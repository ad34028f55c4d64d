"""The repairing writes: `replay` (dead letters back to pending) and `purge` (finished messages deleted).

Both are refused under --read-only, ask before acting unless --yes (refusing without a terminal),
and are audited with the actor and the reason.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import typer

from engine import ops

from .. import output
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
    duration_option,
    fail,
    require_terminal_to_confirm,
    require_writes,
    state_of,
    warn,
)
from .session import check_sqlite_file, run

IDS_ARGUMENT: Any = typer.Argument(None, metavar="[ID]...", help="Dead letters to replay.")
RATE_OPTION: Any = typer.Option(
    None,
    "--rate",
    metavar="N/s",
    help="Replay at most N per second, in chunks; each chunk is atomic but the whole replay is then NOT "
    "(an interruption leaves earlier chunks replayed).",
)
PAYLOAD_OPTION: Any = typer.Option(
    None,
    "--payload",
    metavar="FILE",
    help="Replace the payload of the one named message with this JSON file ('-' reads stdin).",
)
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(?:/\s*(s|sec|m|min|h))?\s*$")
_PER = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def older_than_ms(text: str | None) -> int | None:
    """--older-than D in ms; a text that is not a duration is bad usage."""
    return None if text is None else duration_option("--older-than", text)


def per_second(text: str | None) -> float | None:
    """--rate N/s (or N/m, N/h) in messages per second; anything else is bad usage."""
    if text is None:
        return None
    match = _RATE.match(text)
    value = float(match.group(1)) / _PER[match.group(2)] if match else 0.0
    if not match or not 0 < value < float("inf"):  # 400 nines parse as inf
        fail(2, f'--rate: "{text}" is not a rate: use messages per second like 50/s (or 600/m)')
    return value


def _load_payload(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        fail(2, f"--payload: cannot read {path}: {err}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        fail(2, f"--payload: {path} is not JSON: {err}")


class NotDead(ValueError):
    """Named ids that are not dead letters: `replay` refuses them all (exit 2), naming each status."""


async def _refuse_not_dead(store: ops.Store, signal: str, ids: list[str]) -> None:
    unique = list(dict.fromkeys(ids))
    preview = await ops.replay(store, signal, ids=unique, dry_run=True)
    assert isinstance(preview, ops.ReplayPreview)
    if preview.would_replay == len(unique):
        return
    wrong = [(msg_id, detail.status) for msg_id in unique if (detail := await ops.show(store, msg_id)).status != "dead"]
    if wrong:
        named = ", ".join(f"{msg_id} is {state}" for msg_id, state in wrong[:5])
        more = f" (and {len(wrong) - 5} more)" if len(wrong) > 5 else ""
        raise NotDead(f"replay: {named}{more}, not dead: only dead letters are replayed; nothing changed")


async def _replay_dead_only(store: ops.Store, signal: str, **options: Any) -> Any:
    """ops.replay, after refusing named ids that are not dead."""
    if options.get("ids"):
        await _refuse_not_dead(store, signal, options["ids"])
    return await ops.replay(store, signal, **options)


def _check_named(ids: list[str], all_: bool) -> None:
    if all_ and ids:
        fail(2, "name dead-letter ids or pass --all, not both")
    if not all_ and not ids:
        fail(2, "name the dead letters to replay (ID...), or pass --all")


def _new_payload(ids: list[str], all_: bool, payload: str | None) -> Any:
    """The replacement payload read from --payload FILE, or ops.UNCHANGED."""
    if payload is None:
        return ops.UNCHANGED
    if all_ or len(ids) != 1:
        fail(2, "--payload replaces the payload of exactly one message: name one ID")
    return _load_payload(payload)


def _print_replay(signal: str, result: ops.Replayed | ops.ReplayPreview, as_json: bool) -> None:
    if as_json:
        output.print_json(result)
    else:
        output.render_replay(output.console(), signal, result)


def _replay_question(state: State, signal: str, options: dict[str, Any]) -> str | None:
    """What to ask before replaying, with the count a dry run finds; None when nothing matches."""
    check_sqlite_file(state.db)
    require_terminal_to_confirm("replay")
    preview = run(state, lambda store: _replay_dead_only(store, signal, dry_run=True, **options))
    assert isinstance(preview, ops.ReplayPreview)
    return f"Replay {preview.would_replay} dead letter(s) of {signal}?" if preview.would_replay else None


def replay(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    signal: str = SIGNAL_ARGUMENT,
    ids: list[str] | None = IDS_ARGUMENT,
    all_: bool = typer.Option(False, "--all", help="Every dead letter of SIGNAL (that the filters keep)."),
    code: str | None = typer.Option(None, "--code", metavar="C", help="Only those whose last failure has this code."),
    match: str | None = typer.Option(
        None, "--match", metavar="TEXT", help="Only those whose last failure message contains TEXT (case-insensitive)."
    ),
    key: str | None = typer.Option(None, "--key", metavar="K", help="Only those with this key."),
    older_than: str | None = typer.Option(
        None, "--older-than", metavar="D", help="Only those dead for at least D (e.g. 30m, 7d)."
    ),
    rate: str | None = RATE_OPTION,
    reason: str | None = REASON_OPTION,
    payload: str | None = PAYLOAD_OPTION,
    actor: str | None = ACTOR_OPTION,
    yes: bool = YES_OPTION,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the count and a sample; change nothing."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Requeue dead letters: dead → pending, same id (per-key order holds), attempts reset to 0,
    failure history kept behind a "replayed" marker, an audit record written. Without --rate
    the replay is one transaction: it commits whole or not at all."""
    state = state_of(ctx, db)
    ids = list(ids or [])
    _check_named(ids, all_)
    older_ms = older_than_ms(older_than)
    chunked = per_second(rate)
    new_payload = _new_payload(ids, all_, payload)
    options = {
        "ids": None if all_ else ids,
        "all": all_,
        "code": code,
        "match": match,
        "key": key,
        "older_than_ms": older_ms,
        "payload": new_payload,
    }
    if not dry_run:
        require_writes(state, "replay")
    if not dry_run and not yes:
        question = _replay_question(state, signal, options)
        if question is None:
            _print_replay(signal, ops.Replayed(replayed=0, ids=[]), as_json)
            return
        reason = confirm(question, "replay", reason)
    who = actor_of(state, actor)
    result = run(
        state,
        lambda store: _replay_dead_only(
            store, signal, dry_run=dry_run, reason=reason, actor=who, rate=chunked, warn=warn, **options
        ),
    )
    _print_replay(signal, result, as_json)


def purge(
    ctx: typer.Context,
    db: str | None = DB_OPTION,
    signal: str = SIGNAL_ARGUMENT,
    status: str = typer.Option(..., "--status", metavar="delivered|dead", help="Which finished messages."),
    older_than: str | None = typer.Option(
        None, "--older-than", metavar="D", help="Only those finished at least D ago (e.g. 7d)."
    ),
    reason: str | None = REASON_OPTION,
    actor: str | None = ACTOR_OPTION,
    yes: bool = YES_OPTION,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the count; change nothing."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Delete finished messages of SIGNAL (with their failure and step rows), in one transaction."""
    state = state_of(ctx, db)
    if status not in ("delivered", "dead"):
        fail(2, f'--status: purge deletes finished messages: "delivered" or "dead", not "{status}"')
    older_ms = older_than_ms(older_than)
    if not dry_run:
        require_writes(state, "purge")
    if not dry_run and not yes:
        check_sqlite_file(state.db)
        require_terminal_to_confirm("purge")
        preview = run(state, lambda store: ops.purge(store, signal, status, older_ms, dry_run=True))
        assert isinstance(preview, ops.PurgePreview)
        if preview.would_purge:
            reason = confirm(f"Delete {preview.would_purge} {status} message(s) of {signal}?", "purge", reason)
    result = run(
        state,
        lambda store: ops.purge(
            store, signal, status, older_ms, actor=actor_of(state, actor), reason=reason, dry_run=dry_run
        ),
    )
    if as_json:
        output.print_json(result)
    else:
        output.render_purge(output.console(), signal, status, result)


COMMANDS = (replay, purge)
