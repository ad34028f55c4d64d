"""The long-running commands for real: `okconsole demo --headless`, `serve MODULE:ATTR`, `tail`."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import oke, signal
from livekit import free_port
from consolekit import wait_port

TESTS = Path(__file__).resolve().parent


def okconsole(*args: str, env: dict[str, str] | None = None, timeout: float = 60, cwd: str | None = None
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "okconsole", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd, stdin=subprocess.DEVNULL)


def test_demo_headless_produces_traffic_with_failures_and_a_tape(tmp_path: Path):
    port = free_port()
    done = okconsole("demo", "--headless", "--seconds", "6", "--port", str(port), cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    stats = json.loads(okconsole("stats", "--json", cwd=str(tmp_path)).stdout)
    by_name = {s["signal"]: s for s in stats}
    assert by_name["orders.placed"]["delivered"] >= 5
    assert by_name["tasks.email"]["delivered"] + by_name["tasks.email"]["dead"] >= 3
    tail = okconsole("tail", "order-status", "--from-start", "--count", "3", "--json", cwd=str(tmp_path))
    assert tail.returncode == 0, tail.stderr
    lines = [json.loads(line) for line in tail.stdout.splitlines()]
    assert len(lines) == 3 and all(set(e) == {"id", "data"} for e in lines)
    assert [int(e["id"].split(".")[1]) for e in lines] == [1, 2, 3]


def test_demo_refuses_a_busy_port(tmp_path: Path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = okconsole("demo", "--headless", "--seconds", "2", "--port", str(port), cwd=str(tmp_path))
    assert done.returncode == 1
    assert "in use" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_serve_runs_a_user_app_and_tail_follows_it_over_sse(sqlite_url: str):
    port = free_port()
    env = {"OKE_DATABASE_URL": sqlite_url, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    server = subprocess.Popen([sys.executable, "-m", "okconsole", "serve", "cli_apps.served:app",
                               "--port", str(port), "--concurrency", "2"], env={**os.environ, **env},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_port(port)

        async def emit_jobs() -> None:
            import engine
            engine.reset()
            jobs = signal.once("jobs.run")
            signal.live("order-status")
            # jobs.run is bound only in the server process: the producer finds the recorded binding
            async with oke("producer", database_url=sqlite_url, bindings=[]) as producer:
                for n in range(5):
                    await producer.emit(jobs, {"n": n})

        asyncio.run(emit_jobs())
        tail = okconsole("tail", "order-status", "--url", f"http://127.0.0.1:{port}", "--from-start",
                         "--count", "5", "--json", timeout=60)
        assert tail.returncode == 0, tail.stderr
        jobs_done = sorted(json.loads(line)["data"]["job"] for line in tail.stdout.splitlines())
        assert jobs_done == [0, 1, 2, 3, 4]
        # a cursor the tape cannot honour: warned on stderr, restarted from the oldest event
        gap = okconsole("tail", "order-status", "--url", f"http://127.0.0.1:{port}", "--after", "zz.1",
                        "--count", "2", timeout=60)
        assert gap.returncode == 0
        assert "cannot be resumed" in gap.stderr and "(reset)" in gap.stderr
        assert len(gap.stdout.splitlines()) == 2
    finally:
        server.terminate()
        out, err = server.communicate(timeout=30)
    assert server.returncode in (0, -15), err


def test_serve_runs_the_app_on_the_store_db_names(tmp_path: Path):
    """`okconsole --db X serve` serves on X (the app takes its store from the environment), not on
    the default .oke/oke.db of the working directory; the same with --db after the command."""
    for where in ("before", "after"):
        store = tmp_path / f"{where}.db"
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k != "OKE_DATABASE_URL"}
        env["PYTHONPATH"] = f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        args = ["serve", "cli_apps.plain:app", "--port", str(port)]
        args = ["--db", str(store), *args] if where == "before" else [*args, "--db", str(store)]
        server = subprocess.Popen([sys.executable, "-m", "okconsole", *args], env=env, cwd=str(tmp_path),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  stdin=subprocess.DEVNULL)
        try:
            wait_port(port)
            stats = okconsole("--db", str(store), "stats", "--json", cwd=str(tmp_path))
            assert stats.returncode == 0, stats.stderr
            assert "plain.jobs" in {s["signal"] for s in json.loads(stats.stdout)}
        finally:
            server.terminate()
            _out, err = server.communicate(timeout=30)
        assert f"(store sqlite+aiosqlite:///{store}," in err, err
        assert not (tmp_path / ".oke").exists()


def test_serve_refuses_a_db_the_app_cannot_take_and_says_why(tmp_path: Path):
    """The app names its own store in code: --db cannot be applied, so serve exits 2 naming both
    stores, before it serves anything on either."""
    pinned, other = tmp_path / "pinned.db", tmp_path / "other.db"
    env = {"PINNED_DB": f"sqlite+aiosqlite:///{pinned}", "PYTHONPATH": str(TESTS)}
    done = okconsole("--db", str(other), "serve", "cli_apps.pinned:app", "--port", str(free_port()), env=env,
                     cwd=str(tmp_path), timeout=30)
    assert done.returncode == 2, done.stderr
    assert f"--db sqlite+aiosqlite:///{other} cannot be applied" in done.stderr
    assert f"database_url=sqlite+aiosqlite:///{pinned}" in done.stderr
    assert not pinned.exists() and not other.exists()
    same = okconsole("--db", str(pinned), "serve", "cli_apps.pinned:app", "--port", "0", env=env, cwd=str(tmp_path))
    assert same.returncode == 2 and "--port: 0 is not a TCP port" in same.stderr  # the same store is accepted


@pytest.mark.parametrize("target, message", [
    ("nocolon", "expected MODULE:ATTR"),
    ("no_such_module_x:app", "cannot import"),
    ("cli_apps.served:missing", "has no attribute"),
    ("cli_apps.served:status", "not an app"),
])
def test_serve_bad_targets_exit_2(target: str, message: str, sqlite_url: str):
    env = {"OKE_DATABASE_URL": sqlite_url, "PYTHONPATH": str(TESTS)}
    done = okconsole("serve", target, "--port", str(free_port()), env=env)
    assert done.returncode == 2
    assert message in done.stderr


def test_tail_from_store_last_ten_then_new_and_gap(sqlite_url: str):
    import engine

    engine.reset()
    tape = signal.live("ticks", optional=True, retention={"max_count": 20})

    async def emit(values: range) -> list[str]:
        async with oke("ticker", database_url=sqlite_url, bindings=[]) as app:
            return [await app.emit(tape, {"n": n}) for n in values]

    ids = asyncio.run(emit(range(30)))
    proc = subprocess.Popen([sys.executable, "-m", "okconsole", "--db", sqlite_url, "tail", "ticks",
                             "--count", "13", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    backlog = [proc.stdout.readline() for _ in range(10)]  # the tail is following once these are out
    asyncio.run(emit(range(30, 33)))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    got = [json.loads(line)["data"]["n"] for line in backlog + out.splitlines()]
    assert got == list(range(20, 33))  # the last 10 retained, then the 3 new ones
    pruned = okconsole("--db", sqlite_url, "tail", "ticks", "--after", ids[2], "--count", "1")
    assert pruned.returncode == 0
    assert "(pruned" in pruned.stderr and "restarting from the oldest retained event" in pruned.stderr
    assert json.loads(pruned.stdout.split("  ", 1)[1]) == {"n": 13}
    unknown = okconsole("--db", sqlite_url, "tail", "nope", "--count", "1")
    assert unknown.returncode == 2 and "ticks" in unknown.stderr
    both = okconsole("--db", sqlite_url, "tail", "ticks", "--from-start", "--from-end")
    assert both.returncode == 2
