#!/usr/bin/env python
"""Soak: steady emit + claim + SSE fan-out + connection churn, with purge and retention keeping the
store bounded; resources sampled all along, start (after warm-up) compared with end.

    python bench/soak.py                  30 minutes on a private PostgreSQL
    python bench/soak.py --seconds 60     the CI form (tests/test_soak.py)
    python bench/soak.py --sqlite         on one SQLite file
    python bench/soak.py --url URL        on an existing database (PostgreSQL or SQLite)
    options: --rate N (emits/s, 50), --max-count N (tape retention, 1000), --clients N (persistent SSE clients, 6), --every S (sampling)
    python bench/soak.py --sqlite --minutes 3 --keep-runs 30s --keep-delivered 30s
                                          the engine's retention instead of the operator's purge

A server process (tests/chaos_workers/soak_server.py: `app.serve()` = HTTP/SSE + workers) handles
`soak.jobs`, each handler appending to the live tape `soak.feed` (retention max_count 1000) that
is exposed at /_oke/live/soak.feed. This process emits at a steady rate, keeps N SSE clients
connected, opens and drops short-lived connections all the time (live, resume by Last-Event-ID,
replay with ?tail=, a pruned cursor that must get 410, a raw socket reset mid-stream, a client that
never reads), and purges delivered and dead messages older than 5 s every 5 s, as an operator would.

Every few seconds it samples the server process (RSS, open fds, TCP connections to PostgreSQL and
from HTTP clients), pg_stat_activity, throughput per interval (emits, tape appends, events received
by a persistent client), the backlog (pending, oldest pending age) and row counts. It asserts, from
the first sample after warm-up to the last: RSS growth < 30 MB or < 30 %; fds other than HTTP client
and PostgreSQL sockets equal ± 5; the server's PostgreSQL connections within its pools' limit, their
floor (least of 3 samples) equal ± 2 (pg_stat_activity ± 4);
throughput of the last interval >= 70 % of the first; the backlog bounded (at most 10 s of work, at
most 3 s at the end; the producer holds back while about 3 s of messages are unhandled, as a
well-behaved producer would); messages and tape rows
bounded; every persistent client got every event in order without a reconnect; no unexpected HTTP
status, emit, purge or server error. oke_runs grows by one row per attempt (runs are trace history:
purge keeps them); its growth is printed, not asserted. Exit status 0 on PASS, 1 on FAIL.

With --keep-runs / --keep-delivered (the app's retention options) the purger stays off and the
server's background pass keeps the store bounded instead: the runs, messages and failures rows must
then be flat (end at most start + 50 % + 2 s of traffic), and the longest time one retention batch
held the writer (its statements timed on the writer's thread: max and p99, from the server's
DIR/retention.json) must be at most 50 ms; the whole write as the event loop saw it is printed too.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

SERVER = REPO / "tests" / "chaos_workers" / "soak_server.py"
JOBS, FEED = "soak.jobs", "soak.feed"
DEFAULT_MAX_COUNT = 1000
PURGE_EVERY_S, PURGE_OLDER_MS = 5.0, 5000
RETENTION_PASS_S = 10.0  # engine/retention.py PASS_EVERY_S
MB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- /proc

def proc_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of pid."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_fds(pid: int) -> tuple[int, set[int]]:
    """Open fds of pid, and the inodes of its sockets."""
    fd_dir = f"/proc/{pid}/fd"
    inodes = set()
    names = os.listdir(fd_dir)
    for name in names:
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return len(names), inodes


def tcp_table() -> list[tuple[int, int, int, int]]:
    """(local port, remote port, state, inode) of every TCP socket of this network namespace."""
    out = []
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            out.append((int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16), int(f[3], 16),
                        int(f[9])))
    return out


ESTABLISHED = 1


# --------------------------------------------------------------------------- SSE clients

@dataclass
class ClientStats:
    events: int = 0
    last_seq: int = 0
    last_id: str | None = None
    gaps: list[tuple[int, int]] = field(default_factory=list)
    connects: int = 0
    errors: list[str] = field(default_factory=list)


def parse_frames(buffer: str) -> tuple[list[dict[str, str]], str]:
    frames = []
    while "\n\n" in buffer:
        block, buffer = buffer.split("\n\n", 1)
        frame: dict[str, str] = {}
        for line in block.split("\n"):
            if line.startswith(":") or not line:
                continue
            name, _, value = line.partition(":")
            frame[name] = value[1:] if value.startswith(" ") else value
        if frame:
            frames.append(frame)
    return frames, buffer


async def persistent_client(base: str, stats: ClientStats) -> None:
    """Stay connected for the whole run; every event must arrive, in order, exactly once."""
    import httpx
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10)) as client:
        while True:
            headers = {"Last-Event-ID": stats.last_id} if stats.last_id else {}
            url = f"{base}/_oke/live/{FEED}" + ("" if stats.last_id else "?tail=0")
            stats.connects += 1
            try:
                async with client.stream("GET", url, headers=headers) as resp:
                    if resp.status_code != 200:
                        stats.errors.append(f"status {resp.status_code}: {(await resp.aread())[:200]!r}")
                        await asyncio.sleep(1)
                        continue
                    buffer = ""
                    async for chunk in resp.aiter_text():
                        frames, buffer = parse_frames(buffer + chunk.replace("\r\n", "\n"))
                        for frame in frames:
                            if frame.get("data") == "[DONE]":
                                return
                            if "data" not in frame or "id" not in frame:
                                continue
                            seq = int(frame["id"].rsplit(".", 1)[1])
                            if stats.last_seq and seq != stats.last_seq + 1:
                                stats.gaps.append((stats.last_seq, seq))
                            stats.last_seq, stats.last_id = seq, frame["id"]
                            stats.events += 1
                stats.errors.append("stream ended without [DONE]")
            except asyncio.CancelledError:
                raise
            except Exception as err:
                stats.errors.append(f"{type(err).__name__}: {err}")
                await asyncio.sleep(0.5)


@dataclass
class ChurnStats:
    opened: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    gone_410: int = 0
    unexpected: list[str] = field(default_factory=list)
    active: int = 0
    peak: int = 0


async def churn(base: str, port: int, stats: ChurnStats, persistent: ClientStats, epoch_box: dict,
                rng: random.Random, max_count: int, max_open: int = 6) -> None:
    """Open and drop short-lived connections all the time, in every way a client can."""
    import httpx
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, connect=10), limits=limits) as client:
        tasks: set[asyncio.Task] = set()

        async def one(kind: str) -> None:
            stats.active += 1
            stats.peak = max(stats.peak, stats.active)
            try:
                await asyncio.wait_for(_one(kind), 15)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                stats.unexpected.append(f"{kind}: {type(err).__name__}: {err}")
            finally:
                stats.active -= 1

        async def _one(kind: str) -> None:
            path = f"/_oke/live/{FEED}"
            if kind in ("rst", "idle"):
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(f"GET {path}?tail=5 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                await w.drain()
                if kind == "rst":
                    await r.read(rng.randint(100, 3000))
                    sock = w.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    await asyncio.sleep(rng.uniform(0.5, 3))  # never reads: the server's buffers hold
                w.close()
                return
            headers, url = {}, base + path
            want = rng.randint(1, 30)
            expect_410 = False
            if kind == "live":
                url += "?tail=0"
            elif kind == "replay":
                url += "?tail=50"
                want = 50
            elif kind == "resume":
                if not persistent.last_id:
                    return
                headers["Last-Event-ID"] = persistent.last_id
            elif kind == "pruned":
                if persistent.last_seq <= max_count + 10 or not epoch_box.get("epoch"):
                    return
                headers["Last-Event-ID"] = f"{epoch_box['epoch']}.1"
                expect_410 = True
            async with client.stream("GET", url, headers=headers) as resp:
                if expect_410:
                    body = json.loads(await resp.aread())
                    if resp.status_code != 410 or body["error"]["data"]["reason"] != "pruned":
                        stats.unexpected.append(f"pruned cursor got {resp.status_code} {body}")
                    stats.gone_410 += 1
                    return
                if resp.status_code != 200:
                    stats.unexpected.append(f"{kind}: status {resp.status_code}")
                    return
                got, buffer = 0, ""
                deadline = time.monotonic() + rng.uniform(0.2, 3)
                async for chunk in resp.aiter_text():
                    frames, buffer = parse_frames(buffer + chunk)
                    got += sum(1 for f in frames if "data" in f)
                    if got >= want or time.monotonic() > deadline:
                        break  # drop the connection mid-stream

        kinds = ["live", "live", "resume", "replay", "pruned", "rst", "idle"]
        try:
            while True:
                await asyncio.sleep(rng.uniform(0.05, 0.4))
                if stats.active >= max_open:
                    continue
                kind = rng.choice(kinds)
                stats.opened += 1
                stats.by_kind[kind] = stats.by_kind.get(kind, 0) + 1
                task = asyncio.create_task(one(kind))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


# --------------------------------------------------------------------------- the run

@dataclass
class Sample:
    t: float
    rss: int
    cpu_s: float
    fds: int
    http_conns: int
    pg_conns: int | None       # server process -> PostgreSQL
    pg_activity: int | None    # pg_stat_activity rows of the database
    emitted: int
    received: int
    head: int
    pending: int
    lag_ms: int
    rows: dict[str, int]


async def run(args: argparse.Namespace) -> bool:
    import engine
    from chaos import Plain
    from engine import oke, ops, signal

    root = Path(tempfile.mkdtemp(prefix="oke-soak-"))
    duration = args.seconds if args.seconds is not None else args.minutes * 60
    every = args.every or (5.0 if duration <= 120 else 10.0)
    warmup = min(max(duration * 0.25, every), 120.0)
    pg = None
    server: subprocess.Popen | None = None
    ok = False
    try:
        if args.url:
            url = args.url
        elif args.sqlite:
            url = f"sqlite+aiosqlite:///{root / 'soak.db'}"
        else:
            from pgcluster import PgCluster
            pg = PgCluster(use_env=False)
            await asyncio.to_thread(pg.start)
            url = await asyncio.to_thread(pg.create_database, "oke_soak")
        is_pg = not url.startswith("sqlite")
        pg_port = None
        if is_pg:
            from sqlalchemy.engine import make_url
            pg_port = make_url(url).port or 5432
        backend = "PostgreSQL" if is_pg else "SQLite"
        title = (f"soak / {backend}: {duration:.0f} s at {args.rate}/s, {args.clients} SSE clients + churn, "
                 f"{'retention ' + str(args.keep_runs or '-') + ' runs / ' + str(args.keep_delivered or '-') + ' messages' if retained(args) else f'purge every {PURGE_EVERY_S:.0f} s'}, tape max_count {args.max_count}, sample every {every:.0f} s, "
                 f"warm-up {warmup:.0f} s")
        print(f"-- {title}\n   work dir {root}", flush=True)

        port = free_port()
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        log = open(root / "server.log", "wb")
        keeps = {"--keep-runs": args.keep_runs, "--keep-delivered": args.keep_delivered,
                 "--keep-dead": args.keep_delivered}
        keep = [a for option, value in keeps.items() if value for a in (option, value)]
        server = subprocess.Popen([sys.executable, str(SERVER), "--url", url, "--dir", str(root),
                                   "--port", str(port), "--max-count", str(args.max_count), *keep]
                                  + (["--tracemalloc", str(root / "tracemalloc.txt")] if args.trace_memory else []),
                                  stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
        log.close()
        deadline = time.monotonic() + 90
        while not (root / "ready").exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start ({server.poll()}):\n"
                                   + (root / "server.log").read_text(errors="replace")[-3000:])
            await asyncio.sleep(0.05)
        pid = server.pid
        base = f"http://127.0.0.1:{port}"

        engine.reset()
        jobs = signal.once(JOBS, retries=1, dead_letter=True)
        app = oke("soak-driver", database_url=url, bindings=[])
        samples: list[Sample] = []
        counters = {"emitted": 0, "emit_errors": [], "purged": 0, "purge_errors": [], "sample_errors": [],
                    "held_back_s": 0.0}
        backlog = max(3 * args.rate, 100)
        rng = random.Random(args.seed)
        async with app:
            clients = [ClientStats() for _ in range(args.clients)]
            churn_stats = ChurnStats()
            epoch_box: dict[str, str] = {}
            reader = Plain(url)

            async def emitter() -> None:
                """A steady producer that holds back while the server has more than `backlog` unhandled
                (estimated as emitted minus the events a persistent client got: one per first attempt)."""
                keys = [f"k{i}" for i in range(20)]
                credit, last = 0.0, time.monotonic()
                while True:
                    now = time.monotonic()
                    credit = min(credit + (now - last) * args.rate, args.rate)  # at most 1 s of burst
                    last = now
                    batch = int(credit)
                    if batch > 0 and counters["emitted"] - clients[0].events > backlog:
                        counters["held_back_s"] += batch / args.rate  # the server is behind: skip, no burst later
                        credit -= batch
                        batch = 0
                    if batch > 0:
                        credit -= batch
                        n0 = counters["emitted"]
                        counters["emitted"] += batch

                        async def one(n: int) -> None:
                            try:
                                await app.emit(jobs, {"n": n}, key=keys[n % 20] if n % 10 < 3 else None)
                            except Exception as err:
                                counters["emit_errors"].append(f"{type(err).__name__}: {err}")

                        await asyncio.gather(*(one(n) for n in range(n0, n0 + batch)))
                    await asyncio.sleep(0.05)

            async def purger() -> None:
                while True:
                    await asyncio.sleep(PURGE_EVERY_S)
                    if retained(args):
                        continue  # the server's retention keeps the store bounded instead
                    for status in ("delivered", "dead"):
                        try:
                            done = await ops.purge(app.store, JOBS, status, older_than_ms=PURGE_OLDER_MS,
                                                   actor="soak", reason="soak retention")
                            counters["purged"] += done.purged
                        except Exception as err:
                            counters["purge_errors"].append(f"{type(err).__name__}: {err}")

            async def sample(t: float) -> None:
                rss = proc_rss(pid)
                cpu_s = proc_cpu_s(pid)
                fds, inodes = proc_fds(pid)
                http_conns = pg_conns = 0
                for local, remote, state, inode in tcp_table():
                    if inode in inodes and state == ESTABLISHED:
                        if local == port:
                            http_conns += 1
                        elif remote == pg_port:
                            pg_conns += 1
                rows = {}
                for table in ("oke_messages", "oke_runs", "oke_failures", "oke_tape_events", "oke_audit"):
                    rows[table] = (await reader.rows(f"SELECT count(*) FROM {table}"))[0][0]
                [(epoch, head)] = await reader.rows("SELECT epoch, head FROM oke_tapes WHERE signal = $1", FEED)
                epoch_box["epoch"] = epoch
                [(pending, oldest)] = await reader.rows(
                    "SELECT count(*), min(created_at) FROM oke_messages WHERE signal = $1 AND status = 'pending'",
                    JOBS)
                activity = None
                if is_pg:
                    activity = (await reader.rows("SELECT count(*) FROM pg_stat_activity "
                                                  "WHERE datname = current_database()"))[0][0]
                samples.append(Sample(t, rss, cpu_s, fds, http_conns, pg_conns if is_pg else None, activity,
                                      counters["emitted"], clients[0].events, head, pending,
                                      int(time.time() * 1000) - oldest if oldest else 0, rows))
                s = samples[-1]
                prev = samples[-2] if len(samples) > 1 else None
                dt = (s.t - prev.t) if prev else 1
                rate = lambda a, b: (a - b) / dt if prev else 0.0  # noqa: E731
                print(f"   {s.t:6.0f} s  rss {s.rss / MB:6.1f} MB  cpu {rate(s.cpu_s, prev.cpu_s if prev else 0) * 100:3.0f} %  "
                      f"fds {s.fds:4d}  http {s.http_conns:3d}  "
                      f"pg {s.pg_conns if s.pg_conns is not None else '-':>3}/{s.pg_activity or '-':<3}  "
                      f"emit/s {rate(s.emitted, prev.emitted if prev else 0):6.1f}  "
                      f"tape/s {rate(s.head, prev.head if prev else 0):6.1f}  "
                      f"recv/s {rate(s.received, prev.received if prev else 0):6.1f}  "
                      f"pending {s.pending:5d}  lag {s.lag_ms:6d} ms  msgs {rows['oke_messages']:6d}  "
                      f"runs {rows['oke_runs']:7d}  tape {rows['oke_tape_events']:5d}  "
                      f"churn {churn_stats.opened}", flush=True)

            t0 = time.monotonic()
            tasks = [asyncio.create_task(persistent_client(base, c)) for c in clients]
            await asyncio.sleep(0.5)
            tasks += [asyncio.create_task(emitter()), asyncio.create_task(purger()),
                      asyncio.create_task(churn(base, port, churn_stats, clients[0], epoch_box, rng, args.max_count))]
            next_at = 0.0
            while True:
                now = time.monotonic() - t0
                if now >= next_at:
                    try:
                        await sample(now)
                    except Exception as err:
                        counters["sample_errors"].append(f"{type(err).__name__}: {err}")
                    next_at += every
                if now >= duration or server.poll() is not None:
                    break
                if any(t.done() for t in tasks):
                    break
                await asyncio.sleep(min(0.2, max(0.0, next_at - (time.monotonic() - t0))))
            crashed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await reader.close()

        (root / "stop").touch()
        try:
            rc = await asyncio.to_thread(server.wait, 30)
        except subprocess.TimeoutExpired:
            rc = None
        server_log = (root / "server.log").read_text(errors="replace")
        ok = report(title, samples, warmup, duration, args, counters, clients, churn_stats, crashed, rc,
                    server_log, is_pg)
        if retained(args):
            ok = report_retention(root / "retention.json", samples, warmup, args) and ok
        if not ok:
            print(server_log[-4000:])
    finally:
        if server is not None and server.poll() is None:
            server.kill()
            server.wait(10)
        if pg is not None:
            await asyncio.to_thread(pg.stop)
        if ok and not args.keep and not args.trace_memory:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"   kept {root}", flush=True)
    return ok


def report(title: str, samples: list[Sample], warmup: float, duration: float, args: argparse.Namespace,
           counters: dict[str, Any], clients: list[ClientStats], churn_stats: ChurnStats, crashed: list,
           server_rc: int | None, server_log: str, is_pg: bool) -> bool:
    checks: list[tuple[str, bool, str]] = []
    after = [s for s in samples if s.t >= warmup - 0.5]
    print(f"\n== {title}")
    if len(after) < 3:
        print(f"   RESULT: FAIL: only {len(after)} samples after warm-up ({len(samples)} in all)")
        return False
    base, end = after[0], after[-1]

    def per_s(a: Sample, b: Sample, attr: str) -> float:
        return (getattr(b, attr) - getattr(a, attr)) / (b.t - a.t)

    first_tp = per_s(after[0], after[1], "received")
    last_tp = per_s(after[-2], after[-1], "received")
    first_tape = per_s(after[0], after[1], "head")
    last_tape = per_s(after[-2], after[-1], "head")
    growth = end.rss - base.rss
    # RSS slope over the post-warm-up samples (least squares), MB per minute
    ts = [s.t for s in after]
    rs = [s.rss / MB for s in after]
    mt, mr = sum(ts) / len(ts), sum(rs) / len(rs)
    slope = sum((t - mt) * (r - mr) for t, r in zip(ts, rs)) / max(sum((t - mt) ** 2 for t in ts), 1e-9) * 60

    print(f"   start = first sample after warm-up (t={base.t:.0f} s), end = last sample (t={end.t:.0f} s)")
    rows = [
        ("server RSS", f"{base.rss / MB:.1f} MB", f"{end.rss / MB:.1f} MB",
         f"{growth / MB:+.1f} MB ({growth / base.rss * 100:+.1f} %), slope {slope:+.2f} MB/min"),
        ("open fds", str(base.fds), str(end.fds), f"{end.fds - base.fds:+d}"),
        ("  of which HTTP clients", str(base.http_conns), str(end.http_conns), f"{end.http_conns - base.http_conns:+d}"),
        ("server->PG connections", str(base.pg_conns), str(end.pg_conns),
         f"{(end.pg_conns or 0) - (base.pg_conns or 0):+d}" if is_pg else "-"),
        ("pg_stat_activity (db)", str(base.pg_activity), str(end.pg_activity),
         f"{(end.pg_activity or 0) - (base.pg_activity or 0):+d}" if is_pg else "-"),
        ("recv/s (client 0)", f"{first_tp:.1f}", f"{last_tp:.1f}", f"{last_tp / first_tp * 100 if first_tp else 0:.0f} %"),
        ("tape appends/s", f"{first_tape:.1f}", f"{last_tape:.1f}", ""),
        ("pending / lag", f"{base.pending} / {base.lag_ms} ms", f"{end.pending} / {end.lag_ms} ms", ""),
    ] + [(f"rows {t}", str(base.rows[t]), str(end.rows[t]), f"{end.rows[t] - base.rows[t]:+d}")
         for t in base.rows]
    for name, a, b, d in rows:
        print(f"   {name:24} {a:>18} -> {b:<18} {d}")
    print(f"   emitted {end.emitted}, purged {counters['purged']}, churn {churn_stats.opened} connections "
          f"({', '.join(f'{k} {v}' for k, v in sorted(churn_stats.by_kind.items()))}; peak {churn_stats.peak} "
          f"open; {churn_stats.gone_410} got 410 pruned), persistent clients "
          f"{', '.join(str(c.events) for c in clients)} events")

    # Pooled PostgreSQL connections come and go with the load of the moment (overflow connections
    # close when returned), as do churned HTTP clients: judge fds without either, and connections by
    # their floor (the least of 3 samples), which a leak would raise.
    def other_fds(x: Sample) -> int:
        return x.fds - x.http_conns - (x.pg_conns or 0)

    checks.append(("memory", growth < 30 * MB or growth < 0.3 * base.rss,
                   f"RSS {growth / MB:+.1f} MB ({growth / base.rss * 100:+.1f} %) after warm-up (< 30 MB or < 30 %)"))
    checks.append(("fds", abs(other_fds(end) - other_fds(base)) <= 5,
                   f"fds other than HTTP client and PostgreSQL sockets {other_fds(base)} -> {other_fds(end)} (± 5); "
                   f"all fds {base.fds} -> {end.fds}"))
    max_http = args.clients + churn_stats.peak + 2
    checks.append(("http conns", all(s.http_conns <= max_http for s in after),
                   f"HTTP client sockets never above {args.clients} clients + {churn_stats.peak} churn peak + 2 "
                   f"(max seen {max(s.http_conns for s in after)})"))
    if is_pg:
        head3, tail3 = after[:3], after[-3:]
        floor_a, floor_b = min(s.pg_conns or 0 for s in head3), min(s.pg_conns or 0 for s in tail3)
        act_a, act_b = min(s.pg_activity or 0 for s in head3), min(s.pg_activity or 0 for s in tail3)
        # the server's pools at most: asyncpg 4 + SQLAlchemy 3 + 12 overflow, and the LISTEN connection
        limit = 4 + 3 + 12 + 1
        checks.append(("pg conns", abs(floor_b - floor_a) <= 2 and abs(act_b - act_a) <= 4
                       and all((s.pg_conns or 0) <= limit for s in after),
                       f"server->PG floor {floor_a} -> {floor_b} (± 2), never above its pools' {limit} (max "
                       f"{max(s.pg_conns or 0 for s in after)}); pg_stat_activity floor {act_a} -> {act_b} (± 4)"))
    checks.append(("throughput", first_tp > 0 and last_tp >= 0.7 * first_tp,
                   f"events received/s {first_tp:.1f} first interval -> {last_tp:.1f} last (>= 70 %)"))
    backlog = max(3 * args.rate, 100)
    held = counters["held_back_s"]
    # bounded, not flat: a stall of a few seconds (the machine busy elsewhere) may pile up a few
    # seconds of work, which must be gone by the end
    peak = max(s.pending for s in after)
    stalls = [s.t for s in after if s.pending > backlog]
    checks.append(("backlog", peak <= 10 * args.rate and end.pending <= backlog,
                   f"pending at most {peak} after warm-up (<= 10 s of work, {10 * args.rate}), {end.pending} at the "
                   f"end (<= {backlog}); oldest pending {end.lag_ms} ms at the end; "
                   + (f"over {backlog} at {len(stalls)} samples (t = {', '.join(f'{t:.0f}' for t in stalls[:5])} s); "
                      if stalls else "")
                   + f"the producer held back {held:.1f} s of {duration:.0f} s"
                   + (" (the server could not keep up)" if held > 1 else "")))
    msg_bound = int(args.rate * (PURGE_EVERY_S + PURGE_OLDER_MS / 1000) * 3 + 500)
    if args.keep_delivered:  # the engine's retention: what it keeps plus one pass interval of traffic
        msg_bound = int(args.rate * (kept_s(args.keep_delivered) + RETENTION_PASS_S) * 1.5 + 500)
    checks.append(("store", all(s.rows["oke_messages"] <= msg_bound for s in after)
                   and all(s.rows["oke_tape_events"] <= args.max_count for s in after),
                   f"messages never above {msg_bound} (max {max(s.rows['oke_messages'] for s in after)}), tape "
                   f"rows never above {args.max_count} (max {max(s.rows['oke_tape_events'] for s in after)}); "
                   f"oke_runs +{end.rows['oke_runs'] - base.rows['oke_runs']}"
                   + (" (keep_runs bounds them)" if args.keep_runs else " (unbounded: purge keeps runs)")))
    problems = []
    for i, c in enumerate(clients):
        if c.gaps:
            problems.append(f"client {i} missed events: {c.gaps[:3]}")
        if c.connects != 1 or c.errors:
            problems.append(f"client {i} connected {c.connects}x: {c.errors[:3]}")
    spread = max(c.events for c in clients) - min(c.events for c in clients)
    if spread > args.rate * 3:
        problems.append(f"clients received {[c.events for c in clients]} events")
    checks.append(("sse", not problems,
                   f"{len(clients)} persistent clients each got every event in order on one connection"
                   + ("" if not problems else ": " + "; ".join(problems[:4]))))
    errors = (counters["emit_errors"][:3] + counters["purge_errors"][:3] + counters["sample_errors"][:3]
              + churn_stats.unexpected[:5] + [repr(t.exception()) for t in crashed])
    if server_rc != 0:
        errors.append(f"server exited with {server_rc}")
    if "Traceback" in server_log:
        errors.append("the server logged a traceback")
    checks.append(("errors", not errors,
                   f"emit {len(counters['emit_errors'])}, purge {len(counters['purge_errors'])}, churn "
                   f"{len(churn_stats.unexpected)}, sampling {len(counters['sample_errors'])}; server exit "
                   f"{server_rc}" + ("" if not errors else ": " + "; ".join(errors)[:1500])))
    for name, good, summary in checks:
        print(f"   [{'PASS' if good else 'FAIL'}] {name:11} {summary}")
    ok = all(good for _, good, _ in checks)
    print(f"   RESULT: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def kept_s(duration: str) -> float:
    from engine.durations import parse_duration_ms
    return (parse_duration_ms(duration) or 0) / 1000


def retained(args: argparse.Namespace) -> bool:
    """The run uses the engine's retention (--keep-runs / --keep-delivered), not the purger."""
    return bool(args.keep_runs or args.keep_delivered)


def report_retention(held_path: Path, samples: list[Sample], warmup: float, args: argparse.Namespace) -> bool:
    """Rows flat from start to end, and no retention batch holding the writer over 50 ms."""
    after = [s for s in samples if s.t >= warmup - 0.5]
    base, end = after[0], after[-1]
    tables = [t for t, on in (("oke_runs", args.keep_runs), ("oke_messages", args.keep_delivered),
                              ("oke_failures", args.keep_delivered)) if on]
    # between two passes the rows grow by one pass interval of traffic, and the samples fall anywhere
    # in that saw-tooth: flat = the end at most the start plus one tooth and one sample interval
    every = after[1].t - after[0].t
    flat = {t: end.rows[t] <= base.rows[t] + args.rate * (RETENTION_PASS_S + every) for t in tables}
    held = json.loads(held_path.read_text()) if held_path.exists() else {"batches": 0, "max_ms": 0.0, "p99_ms": 0.0}
    quick = held["batches"] > 0 and held["max_ms"] <= 50
    rows = ", ".join(f"{t} {base.rows[t]} -> {end.rows[t]}" for t in tables)
    print(f"   [{'PASS' if all(flat.values()) else 'FAIL'}] retention   rows flat after warm-up: {rows}")
    print(f"   [{'PASS' if quick else 'FAIL'}] writer hold {held['batches']} retention batches held the writer "
          f"(their statements, timed on its thread) max {held['max_ms']:.2f} ms, p99 {held['p99_ms']:.2f} ms "
          f"(<= 50 ms); each whole write as the loop saw it (commit and waits included) max "
          f"{held.get('write_max_ms', 0):.2f} ms, p99 {held.get('write_p99_ms', 0):.2f} ms", flush=True)
    return all(flat.values()) and quick


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=None, help="overrides --minutes")
    parser.add_argument("--sqlite", action="store_true", help="one SQLite file instead of PostgreSQL")
    parser.add_argument("--url", default=None, help="an existing database instead of a private one")
    parser.add_argument("--rate", type=int, default=50, help="emits per second (well below capacity)")
    parser.add_argument("--max-count", type=int, default=DEFAULT_MAX_COUNT, help="tape retention")
    parser.add_argument("--clients", type=int, default=6, help="persistent SSE clients")
    parser.add_argument("--every", type=float, default=None, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--keep-runs", default=None, metavar="D", help="the server's keep_runs (e.g. 30s)")
    parser.add_argument("--keep-delivered", default=None, metavar="D",
                        help="the server's keep_delivered and keep_dead (e.g. 30s); the purger stays off")
    parser.add_argument("--trace-memory", action="store_true",
                        help="the server traces allocations (tracemalloc; slower) into <work dir>/tracemalloc.txt")
    args = parser.parse_args(argv)
    return 0 if asyncio.run(run(args)) else 1


if __name__ == "__main__":
    sys.exit(main())
