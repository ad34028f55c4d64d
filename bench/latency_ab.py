"""Emit → handler start of two or more engine revisions and the raw LISTEN/NOTIFY loop, one
message at a time in turn, on one PostgreSQL.

    python bench/latency_ab.py before=HEAD after=. [--messages 300]

Each side (`NAME=REV` as in bench/ab.py, plus the raw peer) is a producer and an idle worker
process of its own (bench/latency_side.py), on its own database. Every round emits one message
on every side, in a shuffled order, each after a random 0–100 ms pause, so a slow minute of the
disk's fsync lands on every side alike; latency.py runs its sides one after the other, which is
fine for a report but too coarse for a 0.1 ms change. Prints per side the p50, p90 and the emit
call's p50, and the p50's ratio to the raw loop. Two copies of one revision differ by about
0.1 ms p50 at 300 messages.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

from ab import BENCH, export_engine  # also puts tests/ (pgcluster) on sys.path
from common import pct
from pgcluster import PgCluster

WARMUP = 5


async def _start_side(root: Path, url: str, kind: str) -> asyncio.subprocess.Process:
    side = await asyncio.create_subprocess_exec(
        sys.executable, str(BENCH / "latency_side.py"), str(root), url, kind,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    if (await asyncio.wait_for(side.stdout.readline(), 120)).strip() != b"READY":
        raise RuntimeError(f"latency side {root} ({kind}) did not start")
    return side


async def _one(side: asyncio.subprocess.Process, n: int) -> tuple[float, float]:
    side.stdin.write(f"E {n}\n".encode())
    await side.stdin.drain()
    line = (await asyncio.wait_for(side.stdout.readline(), 60)).decode().split()
    if len(line) != 4 or line[0] != "L" or int(line[1]) != n:
        raise RuntimeError(f"unexpected side line {line!r} for message {n}")
    return float(line[2]), float(line[3])


async def run(sides: dict[str, tuple[Path, str]], cluster: PgCluster, messages: int, seed: int) -> dict:
    procs: dict[str, asyncio.subprocess.Process] = {}
    results: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in sides}
    try:
        for name, (root, kind) in sides.items():
            db = f"bench_lab_{uuid.uuid4().hex[:10]}"
            url = cluster.create_database(db)
            procs[name] = await _start_side(root, cluster.dsn(db) if kind == "raw" else url, kind)
        rnd = random.Random(seed)
        names = list(sides)
        for n in range(-WARMUP, messages):
            rnd.shuffle(names)
            for name in names:
                await asyncio.sleep(rnd.uniform(0.0, 0.100))
                latency, call = await _one(procs[name], n)
                if n >= 0:
                    results[name][0].append(latency)
                    results[name][1].append(call)
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.stdin.close()
                await proc.wait()
    return results


def report(results: dict[str, tuple[list[float], list[float]]]) -> str:
    raw = statistics.median(results["raw"][0])
    lines = ["side          p50 ms   p90 ms   emit call p50   p50 / raw"]
    for name, (lat, call) in results.items():
        p50 = statistics.median(lat)
        lines.append(f"{name:12} {p50:7.3f}  {pct(lat, 0.9):7.3f}  {statistics.median(call):14.3f}  {p50 / raw:9.3f}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sides", nargs="+", help="NAME=REV (git revision, . for the working tree, or a dir with engine/)")
    p.add_argument("--messages", type=int, default=300)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()
    pairs = [tuple(s.split("=", 1)) for s in a.sides]
    if any(len(s) != 2 for s in pairs) or "raw" in dict(pairs):
        p.error("each side is NAME=REV, and 'raw' is the peer's name")
    scratch = Path(tempfile.mkdtemp(prefix="oke-latab-"))
    roots = {name: export_engine(rev, scratch / name) for name, rev in pairs}
    sides = {"raw": (next(iter(roots.values())), "raw"), **{name: (root, "engine") for name, root in roots.items()}}
    cluster = PgCluster(use_env=False)
    cluster.start()
    try:
        results = asyncio.run(run(sides, cluster, a.messages, a.seed))
    finally:
        cluster.stop()
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
