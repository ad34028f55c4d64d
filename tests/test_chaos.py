"""The chaos run, short form (bench/chaos.py --short): once delivery under SIGKILLs, lost leases,
failing handlers, a PostgreSQL crash-restart and a live tape, checked end to end,
and every handler starting with at least 90 % of its lease left.

Each backend runs bench/chaos.py in a process of its own (PostgreSQL: its own private server, which
it restarts; never the session's shared one). The script prints the figures and one PASS/FAIL line
per invariant and exits 1 when any fails; its whole output is shown on failure. The full size runs
by hand: `python bench/chaos.py --pg` / `--sqlite`.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgcluster import find_bin_dir

REPO = Path(__file__).resolve().parents[1]
CHAOS = REPO / "bench" / "chaos.py"


def _chaos(backend: str) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(CHAOS), f"--{backend}", "--short"], cwd=str(REPO), env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
    report = proc.stdout[proc.stdout.find("== chaos"):] if "== chaos" in proc.stdout else proc.stdout
    print(report)
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout, \
        f"chaos run failed (exit {proc.returncode})\n{proc.stdout[-12000:]}\n{proc.stderr[-4000:]}"


@pytest.mark.timeout(280)
@pytest.mark.long
def test_chaos_sqlite_two_processes():
    _chaos("sqlite")


@pytest.mark.postgres
@pytest.mark.timeout(280)
@pytest.mark.long
def test_chaos_postgres_four_processes_and_a_crash_restart():
    if find_bin_dir() is None:
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail("PostgreSQL binaries not found (CI=true: PostgreSQL tests must not be skipped)")
        pytest.skip("PostgreSQL binaries not found")
    _chaos("pg")


# --------------------------------------------------------------------------- found by the chaos run

async def test_one_settle_batch_holding_two_attempts_of_one_message(db_url):
    """A worker that outlived its lease and then reclaimed the message itself settles the late
    attempt and the new one in the same group commit: only the new one is held, and the late one's
    run says lease_lost (PostgreSQL once judged "held" by message, recording both as succeeded)."""
    from engine import flow, oke, on, signal
    from engine.ids import now_ms
    from engine.store import Outcome
    from workers.db import fetch

    jobs = signal.once("jobs", retries=3)
    on(jobs, flow("w", do=lambda p, fx: None))
    async with oke("t", database_url=db_url) as app:
        store = app.store
        ok_id = await app.emit(jobs, {"a": 1})
        fail_id = await app.emit(jobs, {"a": 2})
        first = await store.claim(["jobs"], "same", 30, 10)
        await asyncio.sleep(0.1)
        second = await store.claim(["jobs"], "same", 30_000, 10)
        assert sorted(c.attempts for c in second) == [2, 2]
        t = now_ms()
        by_id = {c.id: c for c in first}, {c.id: c for c in second}
        outcomes = [Outcome(by_id[0][ok_id], "late_ok", "w", True, t, t),
                    Outcome(by_id[1][ok_id], "new_ok", "w", True, t, t),
                    Outcome(by_id[0][fail_id], "late_fail", "w", False, t, t, "X", "late"),
                    Outcome(by_id[1][fail_id], "new_fail", "w", False, t, t, "X", "new")]
        assert await store.settle("same", outcomes) == [False, True, False, True]
    runs = dict(await fetch(db_url, "SELECT run_id, status FROM oke_runs"))
    assert runs == {"late_ok": "lease_lost", "new_ok": "succeeded", "late_fail": "lease_lost", "new_fail": "failed"}
    assert await fetch(db_url, "SELECT message_id, attempt FROM oke_failures") == [(fail_id, 2)]
