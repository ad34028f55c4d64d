"""Health marks: the overview, `okconsole stats` and `stats --json` say which signal needs a look,
in a word per reason (worst first) and a colour, on SQLite and PostgreSQL, read from the rendered
screen and the real CLI; the statements behind them use their indexes on both stores."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text

from consolekit import run_okconsole, wait_for, with_store
import engine
from engine import flow, oke, ops, signal
from engine.flows import Binding
from engine.ops import health, signal_checks
from engine.store import make_store
from okconsole.app import ConsoleApp
from okconsole.screens.overview import OverviewScreen
from screenkit import screen_lines
from workers.db import execute

EXPECTED = {
    "mail": ["dead+5", "fail 62%"],  # 5 of 8 attempts died in the last minutes
    "jobs": ["orphaned 1", "lag 7m", "paused"],  # a ghost holds one, the other waits 7 min, paused
    "calm": [],
    "feed": [],  # a live signal: no attempts, no leases
}


class Bounced(Exception):
    code = "BOUNCED"


async def _bounce(payload: Any, fx: Any) -> None:
    if payload["n"] < 5:
        raise Bounced(f"mailbox {payload['n']} full")


async def _noop(payload: Any, fx: Any) -> None:
    return None


async def unhealthy_store(url: str) -> None:
    """mail: dead letters and failures; jobs: an orphaned lease, a 7-minute lag, paused; calm: fine."""
    engine.reset()  # only these signals
    mail = signal.once("mail", retries=0)
    calm = signal.once("calm")
    jobs = signal.once("jobs", optional=True)
    signal.live("feed")
    bindings = [Binding(mail, flow("mail.send", do=_bounce)), Binding(calm, flow("calm.work", do=_noop))]
    async with oke("shop", database_url=url, bindings=bindings) as app:
        for n in range(8):
            await app.emit(mail, {"n": n})
            await app.emit(calm, {"n": n})
        await app.emit(jobs, {"n": 0})
        waiting = await app.emit(jobs, {"n": 1})
        await app.drain()
        await app.store.claim(["jobs"], "ghost-3", 600_000, 1)  # a holder that never recorded itself
    await execute(url, "UPDATE oke_messages SET created_at = created_at - 420000 WHERE id = $1", waiting)
    await with_store(url, lambda store: ops.pause(store, "jobs", actor="ana", reason="smtp down"))


async def test_stats_carry_each_signals_marks_worst_first_and_the_cli_shows_them(db_url):
    await unhealthy_store(db_url)
    rows = await with_store(db_url, ops.stats)
    assert {r.signal: r.health for r in rows} == EXPECTED

    done = run_okconsole("--db", db_url, "stats", "--json")
    assert done.returncode == 0, done.stderr
    assert {r["signal"]: r["health"] for r in json.loads(done.stdout)} == EXPECTED

    table = run_okconsole("--db", db_url, "stats", env={"COLUMNS": "200"}).stdout.splitlines()
    assert table[0].split()[:2] == ["Signal", "Health"]
    lines = {line.split()[0]: line for line in table[1:] if line.strip()}
    assert lines["mail"].split()[1:4] == ["dead+5,", "fail", "62%"]
    assert lines["jobs"].split()[1:6] == ["orphaned", "1,", "lag", "7m,", "paused"]
    assert lines["calm"].split()[1] == "ok"
    assert lines["feed"].split()[1] == "—"


async def test_doctor_and_the_marks_read_the_same_windows(db_url):
    """One implementation: doctor's dead_letters / failure_rate warn on the signal the marks name."""
    await unhealthy_store(db_url)
    checks = {c.check: c for c in await with_store(db_url, ops.doctor)}
    assert checks["dead_letters"].detail.startswith("mail: 5 new in 15 min")
    assert checks["failure_rate"].detail.startswith("mail: 62% of 8 attempts failed")


def row_of(app: Any, signal_name: str) -> str:
    return next((line for line in screen_lines(app) if line.strip().startswith(signal_name + " ")), "")


async def test_the_overview_marks_each_signal_in_words_and_colour_wide_and_at_80x24(db_url):
    await unhealthy_store(db_url)
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen) and "paused" in row_of(app, "jobs"))
        assert "dead+5, fail 62%" in row_of(app, "mail")
        assert "orphaned 1, lag 7m, paused" in row_of(app, "jobs")
        assert row_of(app, "calm").split()[1] == "ok"
        table = app.screen.query_one("#signals")
        mail = table.get_cell("mail", "health")
        assert {str(span.style) for span in mail.spans} == {"bold red"}
        jobs = table.get_cell("jobs", "health")
        styles = {jobs.plain[span.start : span.end]: str(span.style) for span in jobs.spans}
        assert styles == {"orphaned 1": "bold red", "lag 7m": "yellow", "paused": "bold yellow"}
        assert str(table.get_cell("calm", "health").spans[0].style) == "green"

        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: "dead+5 …" in row_of(app, "mail"))
        header = next(line for line in screen_lines(app) if line.strip().startswith("Signal"))
        assert header.split()[:2] == ["Signal", "Health"]
        assert "orphaned 1 …" in row_of(app, "jobs")
        assert row_of(app, "calm").split()[1] == "ok"

        await pilot.press("slash", *"dead+", "enter")  # the filter reads the marks too
        await wait_for(pilot, lambda: row_of(app, "calm") == "" and "dead+5" in row_of(app, "mail"))


def _plan(conn: Any, statement: Any) -> str:
    pg = conn.dialect.name == "postgresql"
    if pg:
        conn.execute(text("SET LOCAL enable_seqscan = off"))
    sql = str(statement.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    explain = "EXPLAIN " if pg else "EXPLAIN QUERY PLAN "
    return " ".join(str(c) for row in conn.execute(text(explain + sql)) for c in row)


async def test_the_marks_statements_read_their_indexes_on_both_stores(db_url):
    """The overview asks every second: the history by its (signal, minute) key, the leases by the
    (signal, status, seq) index, never a scan of the messages."""
    await unhealthy_store(db_url)
    store = make_store(db_url)
    await store.open()
    try:
        sums, leases = await store.read(
            lambda conn: (
                _plan(conn, signal_checks.sums_statement(["mail", "jobs"], 0)),
                _plan(conn, health.leases_statement(["mail", "jobs"])),
            )
        )
    finally:
        await store.close()
    if db_url.startswith("postgresql"):
        assert "oke_history_pkey" in sums and "Seq Scan" not in sums, sums
        # by (signal, status, seq), or on a table this small the partial index of ready rows
        assert "oke_messages_signal_status" in leases or "oke_messages_ready" in leases, leases
        assert "Seq Scan" not in leases, leases
    else:
        assert "USING PRIMARY KEY" in sums or "sqlite_autoindex_oke_history" in sums, sums
        assert "USING INDEX oke_messages_signal_status" in leases, leases
        assert "SCAN oke_messages " not in leases + " ", leases
