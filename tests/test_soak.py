"""The soak, short form (bench/soak.py --seconds 60): a served app under steady emit + claim + SSE
fan-out + connection churn, with purge and tape retention; resources must stay flat.

bench/soak.py runs in a process of its own against this session's PostgreSQL (a fresh database):
a server process (`app.serve()`), persistent SSE clients, churned connections (live, resume,
replay, pruned cursor, socket reset, never-reading client) and a periodic purge. It asserts, from
the first sample after warm-up to the last: server RSS growth < 30 MB or < 30 %, fds and
connections equal ± a few, throughput of the last interval >= 70 % of the first, backlog and
store rows bounded, every persistent client got every event in order, no unexpected error. The
30-minute form runs by hand: `python bench/soak.py`.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOAK = REPO / "bench" / "soak.py"


@pytest.mark.timeout(200)
@pytest.mark.long
def test_soak_sixty_seconds_stays_flat(pg_url):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(SOAK), "--url", pg_url, "--seconds", "60", "--every", "5",
                           "--max-count", "500"],
                          cwd=str(REPO), env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=180)
    print(proc.stdout[proc.stdout.find("== soak"):] if "== soak" in proc.stdout else proc.stdout)
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout, \
        f"soak failed (exit {proc.returncode})\n{proc.stdout[-10000:]}\n{proc.stderr[-4000:]}"
