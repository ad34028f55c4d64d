"""Unique for a window (`dedupe_for`) across processes, on SQLite and PostgreSQL: emitters in four
processes race on one key while a worker delivers each message as soon as it is stored. Without
the window the key would be free after each delivery and later rounds would store more."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import flow, oke, on, signal
from workers.db import fetch

REPO = Path(__file__).resolve().parents[1]
EMITTER = Path(__file__).resolve().parent / "workers" / "dedupe_emitter.py"


async def _until(check, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _emitters(db_url: str, tmp_path: Path, n: int) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = ["--url", db_url, "--dir", str(tmp_path), "--emits", "5", "--rounds", "15", "--dedupe-for", "1h"]
    return [
        subprocess.Popen([sys.executable, str(EMITTER), *argv, "--id", str(i)], env=env, cwd=str(REPO))
        for i in range(n)
    ]


@pytest.mark.timeout(180)
async def test_a_windowed_key_stores_one_message_across_processes_while_it_is_delivered(db_url, tmp_path):
    reports = signal.once("reports", optional=True)
    delivered: list[str] = []

    @on(reports)
    @flow("reports.w")
    async def handle(payload, fx):
        delivered.append(fx.message_id)

    async with oke("consumer", database_url=db_url) as app:
        running = asyncio.create_task(app.run())
        procs = _emitters(db_url, tmp_path, 4)
        try:
            await _until(lambda: all((tmp_path / f"ready-{i}").exists() for i in range(4)), "boot", 90)
            (tmp_path / "go").touch()
            for proc in procs:
                assert await asyncio.to_thread(proc.wait, 90) == 0
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            await _until(lambda: bool(delivered), "the delivery", 30)
            await app.stop()
            await asyncio.wait_for(running, 30)
    ids = {line for i in range(4) for line in (tmp_path / f"ids-{i}").read_text().split()}
    rows = await fetch(db_url, "SELECT id, status FROM oke_messages WHERE dedupe = 'report:1'")
    assert len(rows) == 1, rows
    assert ids == {rows[0][0]} and rows[0][1] == "delivered" and delivered == [rows[0][0]]
