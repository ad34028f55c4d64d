"""Shared helpers: paths, stats, JSON-lines output, CPU accounting, PostgreSQL table prep."""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
PAYLOAD_BODY = "hello world"          # payload of message i: {"n": i, "body": "hello world"}

if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

from prockit import children, tree_cpu_s  # noqa: E402


ENGINE_ENV = "OKE_BENCH_ENGINE_DIR"


def pin_engine() -> str:
    """Run this process (and, through the environment, its worker processes) on one copy of engine/.

    The first call copies REPO/engine to a temp dir and puts that first on sys.path, so a checkout
    that changes while the benchmark runs cannot mix two engine versions within one report. Worker
    processes find the copy through env OKE_BENCH_ENGINE_DIR. Returns a short sha256 of the copy.
    """
    root = os.environ.get(ENGINE_ENV)
    if not root:
        root = tempfile.mkdtemp(prefix="oke-bench-engine-")
        shutil.copytree(REPO / "engine", Path(root) / "engine", ignore=shutil.ignore_patterns("__pycache__"))
        os.environ[ENGINE_ENV] = root
        atexit.register(shutil.rmtree, root, True)
    if "engine" in sys.modules and not sys.modules["engine"].__file__.startswith(root):
        raise RuntimeError("pin_engine() must run before engine is imported")
    if root not in sys.path:
        sys.path.insert(0, root)
    digest = hashlib.sha256()
    for path in sorted((Path(root) / "engine").rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def payload(i: int) -> dict:
    return {"n": i, "body": PAYLOAD_BODY}


def median(values):
    return statistics.median(values) if values else float("nan")


def pct(values, q: float) -> float:
    """Linear-interpolated percentile, q in [0, 1] (the formula every peer's figures use)."""
    v = sorted(values)
    k = (len(v) - 1) * q
    f = int(k)
    c = min(f + 1, len(v) - 1)
    return v[f] + (v[c] - v[f]) * (k - f)


class Recorder:
    """Appends every raw result as one JSON line and keeps it in memory for the report."""

    def __init__(self, path: Path, meta: dict) -> None:
        self.path = path
        self.rows: list[dict] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self._write({"kind": "meta", **meta})

    def _write(self, row: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")

    def add(self, row: dict) -> dict:
        row = {"at": round(time.time(), 3), **row}
        self.rows.append(row)
        self._write(row)
        ok = row.get("verified", True)
        rate = row.get("msgs_per_s")
        what = row.get("label") or row.get("bench")
        extra = f"{rate:10.0f} msgs/s" if rate is not None else \
            f"p50 {row.get('p50_ms', 0):6.2f} ms  p99 {row.get('p99_ms', 0):6.2f} ms"
        print(f"  {what:44} rep {row.get('rep', 0)}  {extra}  {'ok' if ok else 'VERIFY FAILED'}",
              flush=True)
        return row

    def select(self, **match) -> list[dict]:
        return [r for r in self.rows if all(r.get(k) == v for k, v in match.items())]


# ---------------------------------------------------------------- CPU accounting (Linux /proc)
_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int, reaped_children: bool = False) -> float:
    """utime + stime of `pid`, plus (reaped_children) the CPU of its children that have exited."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        used = int(parts[11]) + int(parts[12])   # utime + stime
        if reaped_children:
            used += int(parts[13]) + int(parts[14])   # cutime + cstime
        return used / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


class ServerCpu:
    """CPU seconds used by a postmaster and its backends. A process that exits mid-window (an
    autovacuum worker, a closed connection) counts once the postmaster has reaped it: its CPU moves
    to the postmaster's cutime/cstime. Without that, autovacuum after a drain read as other load."""

    def __init__(self, data_dir: str | None) -> None:
        self.postmaster = None
        if data_dir:
            try:
                with open(os.path.join(data_dir, "postmaster.pid")) as f:
                    self.postmaster = int(f.readline())
            except (OSError, ValueError):
                pass

    def snapshot(self) -> dict[int, float]:
        if self.postmaster is None:
            return {}
        out = {self.postmaster: _proc_cpu(self.postmaster, reaped_children=True)}
        for name in os.listdir("/proc"):
            if name.isdigit() and _ppid(int(name)) == self.postmaster:
                out[int(name)] = _proc_cpu(int(name))
        return out

    @staticmethod
    def delta(before: dict[int, float], after: dict[int, float]) -> float:
        # Totals, not per pid: an exited backend's whole CPU reappears in the postmaster's cutime.
        return round(sum(after.values()) - sum(before.values()), 3)


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Machine CPU use over a window, as cores busy (2.0 = both cores of a 2-core box)."""
    busy, total = after[0] - before[0], after[1] - before[1]
    return round(os.cpu_count() * busy / total, 2) if total else 0.0


PROBE_ROUNDS = 3
PROBE_ITEMS = 2_000


def speed_probe_ms() -> float:
    """Milliseconds a fixed pure-Python workload (encode, decode and sort 2,000 small dicts) takes
    now, the best of 3. On a shared VM the same drain's client CPU moved by 1.6x between two
    minutes with nothing else running (bench/README.md); timed before and after each run, this tells
    a run on a slow CPU from a slow revision."""
    best = float("inf")
    for _ in range(PROBE_ROUNDS):
        t0 = time.perf_counter()
        rows = [json.loads(json.dumps({"n": i, "body": PAYLOAD_BODY, "k": str(i)})) for i in range(PROBE_ITEMS)]
        rows.sort(key=lambda r: r["k"])
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


class Window:
    """The timed window of one run: wall, this process's CPU (with its children's), the PostgreSQL server's CPU, and
    how busy the whole machine was — `foreign_cores` is CPU used by anything else (other
    programs on a shared box), in cores; near 0 means the numbers are clean. `speed_probe_ms` is
    `speed_probe_ms()` just before and just after the window, averaged (outside the timing)."""

    def __init__(self, data_dir: str | None = None) -> None:
        self.server = ServerCpu(data_dir) if data_dir else None

    def start(self) -> "Window":
        self.probe0 = speed_probe_ms()
        self.s0 = self.server.snapshot() if self.server else {}
        self.m0 = machine_busy()
        self.cpu0, self.t0 = tree_cpu_s(), time.perf_counter()
        return self

    def stop(self, probe: bool = True) -> "Window":
        """End the timing; `probe=False` leaves the closing probe to `probe_end()`, for a caller
        whose worker processes still exit right after the window (they would slow the probe)."""
        self.wall = time.perf_counter() - self.t0
        self.cpu = tree_cpu_s() - self.cpu0
        self.cores = busy_share(self.m0, machine_busy())
        self.server_cpu = ServerCpu.delta(self.s0, self.server.snapshot()) if self.server else None
        if probe:
            self.probe_end()
        return self

    def probe_end(self) -> None:
        self.probe = (self.probe0 + speed_probe_ms()) / 2

    def fields(self, n: int, wall: float | None = None, client_cpu: float | None = None) -> dict:
        wall = self.wall if wall is None else wall
        cpu = self.cpu if client_cpu is None else client_cpu
        ours = cpu + (self.server_cpu or 0.0)
        out = {"wall_s": round(wall, 4), "msgs_per_s": round(n / wall, 1), "client_cpu_s": round(cpu, 3),
               "cores_busy": self.cores, "foreign_cores": round(max(0.0, self.cores - ours / wall), 2),
               "speed_probe_ms": round(self.probe, 3)}
        if self.server_cpu is not None:
            out["server_cpu_s"] = self.server_cpu
        return out


def wait_quiet(max_wait_s: float, threshold: float = 0.3, window_s: float = 1.0) -> float:
    """Wait (up to max_wait_s) until the machine is nearly idle; returns the last busy reading (cores)."""
    deadline = time.monotonic() + max_wait_s
    while True:
        m0 = machine_busy()
        time.sleep(window_s)
        busy = busy_share(m0, machine_busy())
        if busy < threshold or time.monotonic() >= deadline:
            return busy


async def pg_wal(dsn: str) -> dict:
    """The server's pg_stat_wal counters (PostgreSQL ≥ 14), to report WAL bytes and fsyncs per message."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow("SELECT wal_records, wal_bytes, wal_sync FROM pg_stat_wal")
    finally:
        await conn.close()
    return {k: int(v) for k, v in row.items()}


def wal_fields(before: dict, after: dict, n: int) -> dict:
    return {"wal_bytes_per_msg": round((after["wal_bytes"] - before["wal_bytes"]) / n),
            "wal_records_per_msg": round((after["wal_records"] - before["wal_records"]) / n, 2),
            "wal_syncs_per_msg": round((after["wal_sync"] - before["wal_sync"]) / n, 3)}


def proc_io_written() -> int:
    """Bytes this process and its live children (the SQLite writer process) handed to write() so
    far (/proc/PID/io wchar): SQLite's WAL traffic."""
    total = 0
    for pid in ["self", *map(str, children())]:
        try:
            with open(f"/proc/{pid}/io") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("wchar"))
        except OSError:
            continue  # ended meanwhile
    return total


async def pg_prepare_table(dsn: str, table: str) -> None:
    """What every PostgreSQL contender gets after its fill and before the clock: the same reset for all."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"VACUUM ANALYZE {table}")
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()
