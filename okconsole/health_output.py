"""The tables of `okconsole workers` and `okconsole doctor` (Rich, via cli_tables: ids never split)."""

from __future__ import annotations

from rich.console import Console

from engine.ops import DoctorCheck, WorkerInfo

from .cli_tables import KEEP, WRAP, Column, Grid, render
from .output import duration, when
from .safe import rich_markup

# what tells stuck from slow first; a narrow terminal drops App, Started and Pid
WORKER_COLUMNS = (
    "Worker",
    "State",
    "Leased now",
    "Orphaned",
    "Last seen",
    "Held at last beat",
    "Concurrency",
    "App",
    "Host",
    "Pid",
    "Started",
)
NUMERIC = {"Pid", "Concurrency", "Held at last beat", "Leased now"}
STATE_STYLE = {"running": "green", "stopped": "dim", "lost": "bold red", "unknown": "bold red"}
STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def orphaned_cell(n: int) -> str:
    """How many of a worker's leases are orphaned, marked so a person sees it."""
    return f"[bold red]⚠ {n} orphaned[/]" if n else "0"


def render_workers(out: Console, rows: list[WorkerInfo], db: str) -> None:
    if not rows:
        out.print(f"No worker seen in the last hour in {rich_markup(db)}.")
        return
    table = Grid([Column(n, KEEP, n in NUMERIC) for n in WORKER_COLUMNS], drop=("App", "Started", "Pid"))
    for w in rows:
        seen = "never recorded" if w.seen_ago_ms is None else f"{duration(w.seen_ago_ms)} ago"
        table.add(
            rich_markup(w.worker_id),
            f"[{STATE_STYLE.get(w.state, '')}]{w.state}[/]",
            str(w.leases),
            orphaned_cell(w.orphaned),
            seen,
            str(w.held),
            "-" if w.concurrency is None else str(w.concurrency),
            rich_markup(w.app or "-"),
            rich_markup(w.host or "-"),
            "-" if w.pid is None else str(w.pid),
            when(w.started_at),
        )
    render(out, table)


def render_doctor(out: Console, checks: list[DoctorCheck]) -> None:
    table = Grid([Column("Check"), Column("Status"), Column("Detail", WRAP)])
    for c in checks:
        table.add(rich_markup(c.check), f"[{STATUS_STYLE.get(c.status, '')}]{c.status}[/]", rich_markup(c.detail))
    render(out, table)
