#!/usr/bin/env python3
"""okengine `once` benchmark against its peers, in one run, on one private PostgreSQL.

    pip install -e '.[bench]'
    python bench/once_bench.py                 # everything: about 25 minutes on 2 cores
    python bench/once_bench.py --quick         # 2,000 messages, 1 repetition: a smoke run
    python bench/once_bench.py --only pg --reps 5

Starts a throw-away PostgreSQL (tests/pgcluster.py) and stops it at the end, also on Ctrl-C.
Raw results go to bench/results/once-<stamp>.jsonl, the printed report to
bench/results/once-<stamp>.txt. See bench/README.md for what exactly is measured.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import platform
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

import common  # noqa: F401  (puts tests/ on sys.path)
from common import REPO, RESULTS_DIR, Recorder, pin_engine, wait_quiet

from pgcluster import PgCluster  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2,000 messages, 1 repetition, 100 latency samples")
    ap.add_argument("--reps", type=int, default=None, help="repetitions per cell (default 3; the median is shown)")
    ap.add_argument("--messages", type=int, default=None, help="messages per throughput run (default 20,000)")
    ap.add_argument("--latency-samples", type=int, default=None, help="emits per latency run (default 500)")
    ap.add_argument("--wait-quiet", type=float, default=60.0, metavar="S",
                    help="before each run, wait up to S seconds for the machine to be idle (default 60; 0: no wait)")
    ap.add_argument("--enqueue-messages", type=int, default=None,
                    help="messages per emit_many in the enqueue section (default 100,000)")
    ap.add_argument("--only", default="pg,sqlite,latency,enqueue",
                    help="comma list of sections: pg, sqlite, latency, enqueue (default: all)")
    a = ap.parse_args()
    a.reps = a.reps or (1 if a.quick else 3)
    a.messages = a.messages or (2_000 if a.quick else 20_000)
    a.latency_samples = a.latency_samples or (100 if a.quick else 500)
    a.enqueue_messages = a.enqueue_messages or (2_000 if a.quick else 100_000)
    a.only = {s.strip() for s in a.only.split(",") if s.strip()}
    unknown = a.only - {"pg", "sqlite", "latency", "enqueue"}
    if unknown:
        ap.error(f"--only: unknown section(s) {', '.join(sorted(unknown))} (known: pg, sqlite, latency, enqueue)")
    # every report names the peers' versions: say so before a run, not after it
    missing = [m for m in ("procrastinate", "pgqueuer") if importlib.util.find_spec(m) is None]
    if missing:
        ap.error(f"the peers are not installed ({', '.join(missing)}): pip install -e '.[bench]'")
    return a


def meta(cluster, engine_sha: str) -> dict:
    import asyncpg
    import engine
    import procrastinate
    from peers.pgqueuer_peer import VERSION as pgqueuer_version

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()
        except OSError:
            return None

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    pg = cluster.fetch("SELECT version()")[0][0] if cluster else None
    return {"engine_sha256": engine_sha, "python": platform.python_version(), "cpu": cpu, "cores": __import__("os").cpu_count(),
            "kernel": platform.release(), "postgres": pg, "sqlite": sqlite3.sqlite_version,
            "asyncpg": asyncpg.__version__, "procrastinate": procrastinate.__version__,
            "pgqueuer": pgqueuer_version,
            "engine_copied_from": str(REPO / "engine"), "engine_file": engine.__file__, "git_head": git("rev-parse", "--short", "HEAD"),
            "git_dirty": bool(git("status", "--porcelain", "engine"))}


async def measure(rec, a, label: str, rep: int, make):
    """Wait for a quiet machine, run one measurement (`make()` returns a coroutine or a dict), record it."""
    quiet = wait_quiet(a.wait_quiet) if a.wait_quiet > 0 else None
    row = make()
    if asyncio.iscoroutine(row):
        row = await row
    return rec.add({**row, "rep": rep, "label": label, "busy_before": quiet})


BARE_LABEL = ", no history or heartbeats"


def side_by_side(rep: int, runs: list) -> list:
    """A floor's runs one right after the other, in alternating order (ABBA over the repetitions),
    so the CPU's drift from minute to minute lands on both sides of its ratio."""
    return runs if rep % 2 == 0 else runs[::-1]


def with_bare(c: int) -> list[bool]:
    """At 8 and 32 handlers the engine also runs without history and heartbeats (issue 15's floor)."""
    return [False] if c == 1 else [False, True]


# PgQueuer consumers x batch: its own benchmark's 5 x 10, and as many jobs in flight as 8 and 32 handlers
PGQUEUER_GRID = [(5, 10), (1, 8), (4, 8)]


async def pg_throughput(rec, cluster, a):
    from engine_runs import pg_multi, pg_single
    from peers import pgqueuer_peer, procrastinate_peer, raw_pg

    n = a.messages
    cluster.create_database("bench_raw")
    cluster.create_database("bench_proc")
    cluster.create_database("bench_pgq")
    raw_dsn, proc_dsn, pgq_dsn = cluster.dsn("bench_raw"), cluster.dsn("bench_proc"), cluster.dsn("bench_pgq")
    await procrastinate_peer.apply_schema(proc_dsn)
    await pgqueuer_peer.install(pgq_dsn)
    # Each floor's raw peer (C tasks x batch C, and 4 x 8 beside 4 processes) runs right beside the
    # engine; the rest of the grid after the other peers.
    raw_rest = [(8, 1), (32, 1), (2, 8), (2, 32)]
    for rep in range(a.reps):   # rep-major: slow drift of the VM spreads over every contender
        print(f"-- PostgreSQL, repetition {rep + 1}/{a.reps}", flush=True)
        for c in (1, 8, 32):
            runs = [(f"okengine pg C={c}" + BARE_LABEL * bare, lambda bare=bare: pg_single(cluster, n, c, bare=bare))
                    for bare in with_bare(c)]
            runs.append((f"raw asyncpg {c} tasks x batch {c}", lambda: raw_pg.run(raw_dsn, n, c, c, cluster.data_dir)))
            for label, make in side_by_side(rep, runs):
                await measure(rec, a, label, rep, make)
        for label, make in side_by_side(rep, [
                ("okengine pg 4 procs x 8", lambda: pg_multi(cluster, n, 4, 8)),
                ("raw asyncpg 4 tasks x batch 8", lambda: raw_pg.run(raw_dsn, n, 4, 8, cluster.data_dir))]):
            await measure(rec, a, label, rep, make)
        await measure(rec, a, "okengine pg C=8, 50 % delayed", rep, lambda: pg_single(cluster, n, 8, delayed=True))
        for c in (1, 8, 32):
            await measure(rec, a, f"procrastinate C={c}", rep,
                          lambda: procrastinate_peer.run(proc_dsn, n, c, cluster.data_dir))
        for consumers, batch in PGQUEUER_GRID:
            await measure(rec, a, f"pgqueuer {consumers} x batch {batch}", rep,
                          lambda: pgqueuer_peer.run(pgq_dsn, n, consumers, batch, cluster.data_dir))
        for tasks, batch in raw_rest:
            await measure(rec, a, f"raw asyncpg {tasks} tasks x batch {batch}", rep,
                          lambda: raw_pg.run(raw_dsn, n, tasks, batch, cluster.data_dir))


async def sqlite_throughput(rec, a):
    from engine_runs import sqlite_single
    from peers import raw_sqlite
    from report import CONCS, sqlite_claim_batch

    with tempfile.TemporaryDirectory(prefix="oke-bench-sqlite-", dir=None) as d:
        def raw_runs(b: int) -> list:
            """The raw loop at batch b both ways: synchronous=FULL, and NORMAL + an fdatasync."""
            return [(f"raw sqlite3 batch {b}", lambda: raw_sqlite.run(f"{d}/raw.db", a.messages, b, "FULL")),
                    (f"raw sqlite3 batch {b}, NORMAL + fdatasync",
                     lambda: raw_sqlite.run(f"{d}/raw.db", a.messages, b, "NORMAL", own_sync=True))]

        for rep in range(a.reps):
            print(f"-- SQLite, repetition {rep + 1}/{a.reps} ({d})", flush=True)
            for c in CONCS:  # the engine and the raw loop at batch C (its floors' peer) side by side
                runs = [(f"okengine sqlite C={c}" + BARE_LABEL * bare,
                         lambda bare=bare: sqlite_single(d, a.messages, c, bare=bare)) for bare in with_bare(c)]
                runs += raw_runs(c)
                for label, make in side_by_side(rep, runs):
                    await measure(rec, a, label, rep, make)
            await measure(rec, a, "okengine sqlite C=8, 50 % delayed", rep,
                          lambda: sqlite_single(d, a.messages, 8, delayed=True))
            for b in sorted({sqlite_claim_batch(c) for c in CONCS} - set(CONCS)):
                for label, make in raw_runs(b):
                    await measure(rec, a, label, rep, make)


async def latency(rec, cluster, a):
    from latency import engine_latency, raw_latency_run

    cluster.create_database("bench_lat_raw")
    for rep in range(a.reps):
        print(f"-- latency, repetition {rep + 1}/{a.reps} ({a.latency_samples} emits each)", flush=True)
        await measure(rec, a, "okengine emit→handler", rep,
                      lambda: engine_latency(cluster, a.latency_samples, seed=rep))
        await measure(rec, a, "raw LISTEN/NOTIFY emit→handler", rep,
                      lambda: raw_latency_run(cluster, cluster.dsn("bench_lat_raw"), a.latency_samples, seed=rep))


async def enqueue(rec, cluster, a):
    import enqueue_bench

    n = a.enqueue_messages
    with tempfile.TemporaryDirectory(prefix="oke-bench-enqueue-") as d:
        path = f"{d}/enqueue.db"
        stores = [("sqlite", f"sqlite+aiosqlite:///{path}", path),
                  ("pg", cluster.create_database("bench_enqueue"), cluster.dsn("bench_enqueue"))]
        for rep in range(a.reps):
            print(f"-- enqueue, repetition {rep + 1}/{a.reps} ({n:,} messages per emit_many)", flush=True)
            for store, url, target in stores:
                for label, one in enqueue_bench.rows(store, url, target, n):
                    await measure(rec, a, label, rep, one)


async def run_all(a, cluster, rec):
    if "pg" in a.only:
        await pg_throughput(rec, cluster, a)
    if "sqlite" in a.only:
        await sqlite_throughput(rec, a)
    if "latency" in a.only:
        await latency(rec, cluster, a)
    if "enqueue" in a.only:
        await enqueue(rec, cluster, a)


def report(a, rec, info) -> str:
    import report as r

    parts, floors = [], []
    head = (f"okengine once benchmark — {time.strftime('%Y-%m-%d %H:%M')}, {info['cores']} cores "
            f"({info['cpu']}), Python {info['python']}, {info['postgres'].split(' on ')[0] + ', ' if info['postgres'] else ''}"
            f"SQLite {info['sqlite']}, asyncpg {info['asyncpg']}, procrastinate {info['procrastinate']}, PgQueuer {info['pgqueuer']}, "
            f"engine at {info['git_head']}{' + uncommitted changes' if info['git_dirty'] else ''} "
            f"(engine/ copied at start, sha256 {info['engine_sha256']})")
    parts.append(head)
    for section, fn, args in (("pg", r.pg_section, (rec, a.messages, a.reps)),
                              ("sqlite", r.sqlite_section, (rec, a.messages, a.reps)),
                              ("latency", r.latency_section, (rec, a.latency_samples, a.reps)),
                              ("enqueue", r.enqueue_section, (rec, a.enqueue_messages, a.reps))):
        if section in a.only:
            text, fl = fn(*args)
            parts.append(text)
            floors += fl
    parts.append(r.floors_table(floors))
    parts.append(r.load_note(rec.rows))
    checked = [x for x in rec.rows if "verified" in x]  # the drains (an enqueue run has nothing to drain)
    bad = [x for x in checked if x["verified"] is False]
    parts.append(f"\nCorrectness: {len(checked) - len(bad)} of {len(checked)} drains verified "
                 "(delivered == N, sum(attempts) == N, max(attempts) == 1)"
                 + ("" if not bad else "; FAILED: " + ", ".join(f"{x['label']} rep {x['rep']}" for x in bad)))
    if a.quick:
        parts.append(f"(--quick: {a.messages:,} messages, {a.reps} repetition(s); not comparable with a full run)")
    return "\n".join(parts)


def main() -> int:
    a = parse_args()
    engine_sha = pin_engine()

    def on_term(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    cluster = None
    try:
        cluster = PgCluster(use_env=False)
        if a.only & {"pg", "latency", "enqueue"}:
            print("starting a private PostgreSQL …", flush=True)
            cluster.start()
            print(f"  {cluster.admin_dsn} ({cluster.data_dir})", flush=True)
        info = meta(cluster if cluster.running else None, engine_sha)
        rec = Recorder(RESULTS_DIR / f"once-{stamp}.jsonl",
                       {**info, "messages": a.messages, "reps": a.reps, "latency_samples": a.latency_samples,
                        "only": sorted(a.only), "quick": a.quick})
        try:
            asyncio.run(run_all(a, cluster, rec))
        except KeyboardInterrupt:
            print("\ninterrupted: the report below covers the runs that finished", file=sys.stderr)
            interrupted = True
        else:
            interrupted = False
        text = report(a, rec, info) + ("\n(INTERRUPTED: incomplete)" if interrupted else "")
        print("\n" + text)
        (RESULTS_DIR / f"once-{stamp}.txt").write_text(text + "\n")
        print(f"\nraw results: {rec.path.relative_to(REPO)}; report: bench/results/once-{stamp}.txt")
        if interrupted:
            return 130
        return 0 if not any(x.get("verified") is False for x in rec.rows) else 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        if cluster is not None and cluster.running:
            cluster.stop()
            print("PostgreSQL stopped.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
