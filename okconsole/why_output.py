"""What `okconsole why` and `okconsole keys` print for a person (Rich, via cli_tables)."""

from __future__ import annotations

from rich.console import Console

from engine.ops import Failure, KeyPage, Why

from .cli_tables import CROP, KEEP, Column, Grid, render
from .output import when
from .safe import rich_markup
from .styles import STATUS_STYLE, VERDICT_STYLE, styled


def render_why(out: Console, why: Why) -> None:
    """`VERDICT  detail` on one line, then the message and since when."""
    out.print(f"{styled(why.verdict, VERDICT_STYLE.get(why.verdict))}  {rich_markup(why.detail)}", soft_wrap=True)
    since = f" · since {when(why.since)}" if why.since is not None else ""
    out.print(f"[dim]{rich_markup(why.id)} · {rich_markup(why.signal)} · {rich_markup(why.status)}{since}[/]")


def failure_cell(failure: Failure | None) -> str:
    if failure is None:
        return "-"
    return rich_markup(f"{failure.code}: {failure.message}" if failure.message else failure.code)


def render_keys(out: Console, signal: str, page: KeyPage, blocked_only: bool) -> None:
    what = "blocked keys (head failed, messages waiting)" if blocked_only else "keys with unfinished messages"
    if not page.items:
        out.print(f"No {what} in {rich_markup(signal)}" + (" among the keys looked at." if page.next_after else "."))
    else:
        broadcast = any(k.flow is not None for k in page.items)
        columns = [Column("Key"), *([Column("Flow")] if broadcast else []), Column("Head"), Column("Status")]
        columns += [Column("Failed", KEEP, True), Column("Waiting", KEEP, True), Column("Last failure", CROP)]
        table = Grid(columns, title=f"{rich_markup(signal)}: {what}")
        for k in page.items:
            table.add(
                rich_markup(k.key),
                *([rich_markup(k.flow or "-")] if broadcast else []),
                rich_markup(k.head_id),
                styled(k.head_status, STATUS_STYLE.get(k.head_status)),
                str(k.head_attempts),
                str(k.waiting),
                failure_cell(k.head_last_failure),
            )
        render(out, table)
    if page.next_after is not None:
        looked = f"looked at {page.scanned:,} keys; " if blocked_only else ""
        out.print(f"… {looked}more keys: pass --after {page.next_after} for the next page", soft_wrap=True)
