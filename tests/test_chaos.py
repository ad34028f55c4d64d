"""The chaos run, short form (bench/chaos.py --short): once delivery under SIGKILLs, lost leases,
failing handlers, a PostgreSQL crash-restart and a live tape, checked end to end (SPEC §5, §7).

Each backend runs bench/chaos.py in a process of its own (PostgreSQL: its own private server, which
it restarts; never the session's shared one). The script prints the figures and one PASS/FAIL line
per invariant and exits 1 when any fails; its whole output is shown on failure. The full size runs
by hand: `python bench/chaos.py --pg` / `--sqlite`.
"""
from __future__ import annotations

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
def test_chaos_sqlite_two_processes():
    _chaos("sqlite")


@pytest.mark.postgres
@pytest.mark.timeout(280)
def test_chaos_postgres_four_processes_and_a_crash_restart():
    if find_bin_dir() is None:
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail("PostgreSQL binaries not found (CI=true: PostgreSQL tests must not be skipped)")
        pytest.skip("PostgreSQL binaries not found")
    _chaos("pg")
