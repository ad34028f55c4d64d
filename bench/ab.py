"""Before/after: the once throughput of two or more engine revisions, alternating, on this machine.

    python bench/ab.py before=5d728f4 after=HEAD [--stores pg:8,sqlite:32] [--reps 3] [--messages 20000]
                       [--locale en_US.UTF-8] [--options 'NAME={"concurrency": 1000}']

Each side is `NAME=REV` (any git revision, `NAME=.` for the working tree's engine/, or a directory
that holds an `engine/` package, e.g. a variant being measured); `--options NAME=JSON` declares
that side's bench signal with those options (the cost of a limit, say: the same revision twice,
one side with `{"concurrency": 1000, "rate": "1000000/1s"}`). Each
revision's `engine/` is exported with `git archive` into a scratch directory and imported by a
fresh process per run (bench/ab_one.py), so sides never share a process, a warm cache or an
import. Runs alternate ABBA (rep 0: A B, rep 1: B A, …) and each waits for the machine to be quiet
first, so a slow minute lands on both sides. One PostgreSQL cluster serves every run (a fresh
database each). The summary gives, per store and side, the median msgs/s, the min–max spread (the
run-to-run noise of that side) and the median's ratio to the first side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "tests"))

from common import wait_quiet  # noqa: E402
from pgcluster import PgCluster  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sides", nargs="+", help="NAME=REV (git revision, or . for the working tree)")
    p.add_argument("--stores", default="pg:8,sqlite:32", help="store:handlers, comma separated")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--locale", help="the cluster's locale (initdb --locale), e.g. en_US.UTF-8; default C")
    p.add_argument("--options", action="append", default=[], metavar="NAME=JSON",
                   help="signal.once options for that side's bench signal (repeatable)")
    p.add_argument("--out", default=str(BENCH / "results" / f"ab-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"))
    a = p.parse_args()
    a.sides = [tuple(s.split("=", 1)) for s in a.sides]
    if any(len(s) != 2 for s in a.sides):
        p.error("each side is NAME=REV")
    a.stores = [(s, int(c)) for s, c in (x.split(":") for x in a.stores.split(","))]
    a.options = dict(o.split("=", 1) for o in a.options)
    for name, options in a.options.items():
        if name not in dict(a.sides) or not isinstance(json.loads(options), dict):
            p.error(f"--options {name}=…: name a side and give a JSON object")
    return a


def export_engine(rev: str, into: Path) -> Path:
    """A copy of `engine/` at `rev` (or the working tree's for '.'), importable from `into`."""
    if rev != "." and (Path(rev) / "engine" / "__init__.py").is_file():
        return Path(rev).resolve()
    into.mkdir(parents=True)
    if rev == ".":
        subprocess.run(["cp", "-r", str(ROOT / "engine"), str(into)], check=True)
    else:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "engine"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def one_run(root: Path, store: str, handlers: int, n: int, cluster: PgCluster, options: str = "") -> dict | None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OKE_BENCH_SIGNAL_OPTIONS")}
    if options:
        env["OKE_BENCH_SIGNAL_OPTIONS"] = options
    args = [sys.executable, str(BENCH / "ab_one.py"), str(root), store, str(n), str(handlers)]
    if store == "pg":
        args += [cluster.admin_dsn or "", cluster.data_dir]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    rows = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if not rows:
        print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(rows[0])


def summary(records: list[dict], sides: list[str]) -> str:
    lines = ["store handlers side      median msgs/s   min–max (noise)   vs first   client µs/msg"]
    for store, handlers in dict.fromkeys((r["store"], r["handlers"]) for r in records):
        base = None
        for side in sides:
            rates = [r["msgs_per_s"] for r in records if (r["store"], r["handlers"], r["side"]) == (store, handlers, side)]
            if not rates:
                continue
            cpu = statistics.median(
                r["client_us_per_msg"] for r in records if (r["store"], r["handlers"], r["side"]) == (store, handlers, side)
            )
            med = statistics.median(rates)
            base = base or med
            spread = f"{min(rates):,.0f}–{max(rates):,.0f} (±{(max(rates) - min(rates)) / 2 / med:.0%})"
            lines.append(f"{store:6} {handlers:8} {side:9} {med:13,.0f}   {spread:17}   {med / base:7.2f}   {cpu:10.1f}")
    return "\n".join(lines)


def main() -> int:
    a = parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="oke-ab-"))
    roots = {name: export_engine(rev, scratch / name) for name, rev in a.sides}
    names = [name for name, _ in a.sides]
    cluster = PgCluster(use_env=False, locale=a.locale)
    cluster.start()
    records: list[dict] = []
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(a.out, "a") as out:
            for rep in range(a.reps):
                order = names if rep % 2 == 0 else names[::-1]
                for store, handlers in a.stores:
                    for side in order:
                        busy = wait_quiet(20)
                        row = one_run(roots[side], store, handlers, a.messages, cluster, a.options.get(side, ""))
                        if row is None:
                            continue
                        rec = {"side": side, "rev": dict(a.sides)[side], "store": store, "handlers": handlers,
                               "rep": rep, "busy_before": busy, "msgs_per_s": row["msgs_per_s"],
                               "client_us_per_msg": round(row["client_cpu_s"] / a.messages * 1e6, 1),
                               "verified": row["verified"]}
                        records.append(rec)
                        out.write(json.dumps(rec) + "\n")
                        out.flush()
                        print(json.dumps(rec), flush=True)
    finally:
        cluster.stop()
    print(summary(records, names))
    return 0 if records and all(r["verified"] for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
