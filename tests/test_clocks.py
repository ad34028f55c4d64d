"""Clock triggers with real processes on SQLite and PostgreSQL: several app processes share one
clock, one of them is SIGKILLed and another starts meanwhile, and every tick is one message,
handled once (tests/workers/clock_app.py). Schedules and DST are unit tests (tests/unit/test_clocks.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal as signals
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.db import fetch

REPO = Path(__file__).resolve().parents[1]
APP = Path(__file__).resolve().parent / "workers" / "clock_app.py"


def _start(db_url: str, out: Path, name: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [sys.executable, str(APP), "--url", db_url, "--dir", str(out), "--id", name, "--every", "1s"]
    return subprocess.Popen(argv, env=env, cwd=str(REPO))


async def _ready(out: Path, name: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not (out / f"ready-{name}").exists():
        assert time.monotonic() < deadline, f"{name} did not boot"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(240)
@pytest.mark.long
async def test_processes_sharing_a_clock_store_one_message_per_tick_through_a_sigkill(db_url, tmp_path):
    procs = {name: _start(db_url, tmp_path, name) for name in ("a", "b", "c")}
    try:
        for name in procs:
            await _ready(tmp_path, name)
        await asyncio.sleep(4)
        procs["a"].send_signal(signals.SIGKILL)  # mid-run: b and c go on ticking
        await asyncio.sleep(2)
        procs["d"] = _start(db_url, tmp_path, "d")  # one starts while the others tick
        await _ready(tmp_path, "d")
        await asyncio.sleep(4)
        (tmp_path / "stop").touch()
        for name, proc in procs.items():
            if name != "a":
                assert await asyncio.to_thread(proc.wait, 60) == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    rows = await fetch(db_url, "SELECT payload, dedupe, status FROM oke_messages WHERE signal = 'clock.ticks.rec'")
    ats = sorted(json.loads(payload)["at"] for payload, _, _ in rows)
    assert len(ats) >= 8, ats
    assert len(set(ats)) == len(ats), "a tick was stored twice"
    assert ats == list(range(ats[0], ats[-1] + 1, 1000)), "a tick was skipped while processes ran"
    assert all(dedupe == str(json.loads(payload)["at"]) for payload, dedupe, _ in rows)
    handled = [line.split() for line in (tmp_path / "handled").read_text().splitlines()]
    handled_ats = sorted(int(at) for at, _, _ in handled)
    # a tick whose handler ran in the SIGKILLed process may run again after its lease: at least once
    assert set(handled_ats) <= set(ats) and {s for _, _, s in rows} <= {"delivered", "pending", "inflight"}
    assert len(handled_ats) - len(set(handled_ats)) <= 1
