"""Worker subprocesses on one store (tests/workers/once_worker.py): start, wait until booted, stop,
kill, and read the lines their handlers record; `until` polls an async predicate."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "workers" / "once_worker.py"


def children(pid: int | str = "self") -> list[int]:
    """The live child processes of `pid` (this process by default; the SQLite store's writer
    process among them); none when `pid` has ended."""
    pids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return pids
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                pids += [int(child) for child in f.read().split()]
        except OSError:
            continue
    return pids


def tree_cpu_s() -> float:
    """CPU seconds of this process and its live children: a drain's or a wait's CPU wherever the
    engine spends it (the SQLite writer runs in a process of its own)."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for pid in children():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


async def until(check, what: str, timeout: float = 60.0, every: float = 0.05):
    """Poll the async predicate `check` until it is truthy (a hang guard, not a speed check)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(every)


class WorkerProcs:
    """Worker subprocesses sharing one directory for their records, readiness and stop files."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "records"
        self.dir.mkdir()
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, mode: str, worker_id: str, url: str, lease_ms: int = 30_000,
              concurrency: int = 8, hold: bool = False, clock_skew_ms: int = 0,
              heartbeat_s: float | None = None, sqlite_writer: str = "process") -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        log = open(self.dir / f"log-{worker_id}", "wb")
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), mode, "--url", url, "--dir", str(self.dir), "--worker-id", worker_id,
             "--lease-ms", str(lease_ms), "--concurrency", str(concurrency),
             "--clock-skew-ms", str(clock_skew_ms), "--sqlite-writer", sqlite_writer] + (["--hold"] if hold else [])
            + ([] if heartbeat_s is None else ["--heartbeat-s", str(heartbeat_s)]),
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
        log.close()
        self.procs[worker_id] = proc
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.dir.glob("log-*")))

    async def ready(self, *worker_ids: str, timeout: float = 60.0) -> None:
        async def check():
            for wid in worker_ids:
                proc = self.procs[wid]
                if proc.poll() is not None:
                    raise AssertionError(f"worker {wid} exited with {proc.returncode}\n{self.logs()}")
            return all((self.dir / f"ready-{wid}").exists() for wid in worker_ids)

        await until(check, f"workers {worker_ids} to boot", timeout)

    def go(self) -> None:
        """Release workers started with hold=True, all at once."""
        (self.dir / "go").touch()

    async def stop(self, timeout: float = 30.0) -> None:
        """Ask every live worker to stop and check that each exits cleanly."""
        (self.dir / "stop").touch()
        deadline = time.monotonic() + timeout
        for wid, proc in self.procs.items():
            if proc.returncode is not None and proc.returncode < 0:
                continue  # killed by the test on purpose
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert proc.poll() == 0, f"worker {wid} did not stop cleanly ({proc.returncode})\n{self.logs()}"

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def lines(self, pattern: str) -> list[list[str]]:
        out = []
        for path in sorted(self.dir.glob(pattern)):
            out.extend(line.split(" ") for line in path.read_text().splitlines())
        return out


def worker_procs(tmp_path: Path):
    """The body of a `procs` fixture: a WorkerProcs whose processes are killed at the end."""
    group = WorkerProcs(tmp_path)
    try:
        yield group
    finally:
        group.kill_all()
