"""Issue #3 bench: SSE fan-out and tape replay of okengine live tapes, beside a bare sse-starlette ceiling.

    pip install -e '.[bench]'
    python bench/sse_bench.py            # SQLite: 1,000 subscribers, 200 events/s for 20 s, 100k replay
    python bench/sse_bench.py --quick    # 200 subscribers for 5 s, one replay
    python bench/sse_bench.py --pg       # also against a private PostgreSQL (tests/pgcluster.py)
    python bench/sse_bench.py --profile  # py-spy the engine server (and emitter) while it fans out / replays
    python bench/sse_bench.py --reps 3   # interleaved repetitions, medians in the table

Every process is separate and on 127.0.0.1:

  * the server (bench/sse/engine_server.py running `app.serve()`, or bench/sse/bare_server.py) —
    its RSS and CPU come from /proc/<pid>;
  * subscriber processes (bench/sse/subscribers.py, `--sub-procs`, default 2) holding raw asyncio
    connections each, reading the stream with a hand-written de-chunker and SSE splitter; their CPU
    is measured too, so a client-bound run is visible;
  * the emitter: either inside the server process ("emit in server": `app.emit` in the serving app,
    which wakes the local hub directly; for the bare endpoint the broadcaster) or, for the engine,
    its own process ("emit from another process": `app.emit` on the same store, reaching the server
    through the SQLite WAL poll or PostgreSQL NOTIFY — the cross-process path).

Fan-out numbers: delivered events/s = all receipts across subscribers / (last receipt − first emit),
so a server that falls behind is charged for the time it takes to catch up (the drain waits up to
`--drain` s after the last emit); latency = receive wall time − the `t` (`time.time()` just before the
emit) carried in each payload; memory per connection = (server RSS with every stream open − RSS
after one warm-up request) / streams. Replay: a fresh tape filled with 100,000 events through
`engine.live.tape.append` in batches of 1,000 (`store.write`), then one reader with
`Last-Event-ID: <epoch>.0` timed from its request to the 100,000th event.

Floors (issue #3): fan-out ≥ 50% of the bare endpoint's delivered rate, p99 < 250 ms,
replay > 20,000 events/s. Raw results go to bench/results/sse-<timestamp>.json (with the engine's
git HEAD and whether engine/ had uncommitted changes).

On a shared machine other processes' CPU turns into our latency: before each scenario the run waits
(up to --quiet-wait s) for the box to be quiet, and every row reports the cores other processes used
meanwhile ("others"), and the server's CPU per delivered event (µs/dlv), which contention moves less.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SSE = BENCH / "sse"
RESULTS = BENCH / "results"
sys.path[:0] = [str(SSE), str(REPO / "tests")]

from _util import (BARE_PATH, LIVE_PATH, Histogram, cpu_s, free_port, machine_busy,  # noqa: E402
                   rss_kib)
import spyfold  # noqa: E402
from livekit import wait_listening  # noqa: E402

PY = sys.executable
FLOOR_RATIO = 0.50
FLOOR_P99_MS = 250.0
FLOOR_REPLAY = 20_000.0


def log(text: str) -> None:
    print(text, flush=True)


# ------------------------------------------------------------------------------- processes
class Child:
    """A benchmark process speaking JSON lines on stdout; `progress` lines are kept aside."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, err_path: Path) -> None:
        self.name = name
        self.proc = proc
        self.err_path = err_path
        self.lines: asyncio.Queue[dict | None] = asyncio.Queue()
        self.progress: dict[str, Any] = {}
        self.reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if "progress" in msg:
                self.progress = msg
            else:
                await self.lines.put(msg)
        await self.lines.put(None)

    def stderr_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.err_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def next(self, timeout: float) -> dict:
        try:
            msg = await asyncio.wait_for(self.lines.get(), timeout)
        except TimeoutError:
            raise RuntimeError(f"{self.name}: no answer within {timeout:.0f}s\n{self.stderr_tail()}") from None
        if msg is None:
            await self.proc.wait()
            raise RuntimeError(f"{self.name} exited (rc {self.proc.returncode})\n{self.stderr_tail()}")
        return msg

    async def send(self, line: str | dict) -> None:
        assert self.proc.stdin is not None
        text = line if isinstance(line, str) else json.dumps(line)
        try:
            self.proc.stdin.write(text.encode() + b"\n")
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass

    async def finish(self, grace: float = 15.0, quit_line: str | dict | None = None) -> None:
        if self.proc.returncode is None:
            if quit_line is not None:
                await self.send(quit_line)
            try:
                await asyncio.wait_for(self.proc.wait(), grace)
            except TimeoutError:
                await self.kill()
        self.reader.cancel()

    async def kill(self) -> None:
        if self.proc.returncode is not None:
            return
        try:
            self.proc.terminate()
            await asyncio.wait_for(self.proc.wait(), 5)
        except ProcessLookupError:
            return
        except TimeoutError:
            try:
                self.proc.kill()
            except ProcessLookupError:
                return
            await self.proc.wait()


class Procs:
    """Every process this run started, so each one is ended on the way out (also on Ctrl-C)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.children: list[Child] = []
        self.plain: list[asyncio.subprocess.Process] = []
        self.counter = 0

    async def spawn(self, name: str, *argv: Any) -> Child:
        self.counter += 1
        err_path = self.workdir / f"{self.counter:02d}-{name.replace(' ', '_')}.stderr"
        proc = await asyncio.create_subprocess_exec(
            *[str(a) for a in argv], stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=open(err_path, "wb"), cwd=str(self.workdir), limit=64 * 1024 * 1024,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        child = Child(name, proc, err_path)
        self.children.append(child)
        return child

    async def spawn_plain(self, *argv: Any, out: Path) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(*[str(a) for a in argv], stdin=subprocess.DEVNULL,
                                                    stdout=open(out, "wb"), stderr=subprocess.STDOUT)
        self.plain.append(proc)
        return proc

    async def close_all(self) -> None:
        for child in self.children:
            await child.kill()
            child.reader.cancel()
        for proc in self.plain:
            if proc.returncode is None:
                try:
                    proc.kill()
                    await proc.wait()
                except ProcessLookupError:
                    pass


async def warm(port: int, path: str, last_event_id: str | None = None) -> None:
    """One request through the streaming path (lazy imports, first hub), then hang up."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n"
    if last_event_id:
        head += f"Last-Event-ID: {last_event_id}\r\n"
    w.write((head + "\r\n").encode())
    status = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 30)
    if b" 200 " not in status.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"warm-up request got {status[:200]!r}")
    w.close()
    await asyncio.sleep(0.3)


class Spy:
    """py-spy record on a pid until stopped; raw collapsed stacks for spyfold."""

    def __init__(self, procs: Procs, out: Path) -> None:
        self.procs = procs
        self.out = out
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, pid: int) -> None:
        if shutil.which("py-spy") is None:
            log("    (py-spy not installed: pip install py-spy)")
            return
        self.proc = await self.procs.spawn_plain("py-spy", "record", "-p", pid, "-r", "100", "-f", "raw",
                                                 "-o", self.out, "--nonblocking", "--threads",
                                                 out=self.out.with_suffix(".log"))

    async def stop(self, title: str) -> dict | None:
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.proc.kill()
            return None
        if not self.out.exists():
            log(f"    (py-spy wrote nothing; see {self.out.with_suffix('.log')})")
            return None
        folded = spyfold.fold(self.out)
        folded["title"] = title
        return folded


class Cpu:
    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self.t = time.monotonic()
        self.cpu = {k: sum(cpu_s(p) for p in v) for k, v in pids.items()}
        self.per_pid = {p: cpu_s(p) for v in pids.values() for p in v}
        self.busy, self.total = machine_busy()

    def since(self, earlier: "Cpu") -> dict[str, float]:
        wall = self.t - earlier.t
        out = {f"{k}_cpu_pct": 100 * (self.cpu[k] - earlier.cpu[k]) / wall for k in self.cpu}
        peaks = [100 * (self.per_pid[p] - earlier.per_pid[p]) / wall for p in self.pids.get("client", [])]
        out["client_cpu_max_proc_pct"] = max(peaks, default=0.0)
        out["machine_busy_pct"] = 100 * (self.busy - earlier.busy) / max(1, self.total - earlier.total)
        ours = sum(self.cpu[k] - earlier.cpu[k] for k in self.cpu) / wall
        out["others_cores"] = max(0.0, out["machine_busy_pct"] / 100 * (os.cpu_count() or 1) - ours)
        out["cpu_window_s"] = wall
        return out


async def wait_quiet(args: argparse.Namespace, what: str) -> float:
    """Wait (up to --quiet-wait s) until other processes use < --quiet-cores of the machine.

    Benchmarks on a shared box: another job's CPU shows up as our latency. Returns the load seen.
    """
    deadline = time.monotonic() + args.quiet_wait
    said = False
    while True:
        busy0, total0 = machine_busy()
        await asyncio.sleep(2.0)
        busy1, total1 = machine_busy()
        cores = (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1)
        if cores < args.quiet_cores or time.monotonic() > deadline:
            if said or cores >= args.quiet_cores:
                log(f"  [{what}: other processes use {cores:.2f} cores{'' if cores < args.quiet_cores else '; going ahead anyway'}]")
            return cores
        if not said:
            log(f"  [{what}: other processes use {cores:.2f} cores; waiting up to {args.quiet_wait:.0f}s for a quiet box]")
            said = True


# ------------------------------------------------------------------------------- fan-out
async def run_fanout(procs: Procs, args: argparse.Namespace, label: str, kind: str, db: str | None,
                     emit_from: str) -> dict:
    others_before = await wait_quiet(args, label)
    port = free_port()
    uv = ["--uvloop"] if args.uvloop else []
    if kind == "engine":
        server = await procs.spawn(f"{label} server", PY, SSE / "engine_server.py", "--db", db, "--port", port, *uv)
        path = LIVE_PATH
    else:
        server = await procs.spawn(f"{label} server", PY, SSE / "bare_server.py", "--port", port, *uv)
        path = BARE_PATH
    await server.next(30)
    await wait_listening(port, timeout=30.0)
    await warm(port, path)
    rss0 = rss_kib(server.pid)
    log(f"  {label}: server pid {server.pid}, RSS {rss0 / 1024:.1f} MiB; opening {args.subs} streams "
        f"from {args.sub_procs} processes ...")
    shares = [args.subs // args.sub_procs + (1 if i < args.subs % args.sub_procs else 0)
              for i in range(args.sub_procs)]
    subs = [await procs.spawn(f"{label} subs{i}", PY, SSE / "subscribers.py", "fanout", "--port", port,
                              "--path", path, "--count", n) for i, n in enumerate(shares) if n]
    t_conn = time.monotonic()
    hello = [await s.next(240) for s in subs]
    connect_s = time.monotonic() - t_conn
    n_conn = sum(h["connected"] for h in hello)
    failed = sum(h["failed"] for h in hello)
    if failed:
        log(f"    {failed} streams failed to open: {[h['errors'] for h in hello if h['errors']]}")
    await asyncio.sleep(1.0)
    rss1 = rss_kib(server.pid)
    emitter = None
    if emit_from == "process":
        emitter = await procs.spawn(f"{label} emitter", PY, SSE / "emitter.py", "--db", db,
                                    "--rate", args.rate, "--duration", args.duration)
        await emitter.next(60)
    log(f"    {n_conn} open in {connect_s:.1f}s, server RSS +{(rss1 - rss0) / 1024:.1f} MiB; "
        f"emitting {args.rate:g}/s for {args.duration:g}s ({'another process' if emitter else 'in the server'}) ...")
    pids = {"server": [server.pid], "client": [s.pid for s in subs]}
    if emitter:
        pids["emitter"] = [emitter.pid]
    spy = Spy(procs, procs.workdir / f"pyspy-{label.replace(' ', '_')}.txt") if args.profile and kind == "engine" else None
    spy_emitter = Spy(procs, procs.workdir / f"pyspy-{label.replace(' ', '_')}-emitter.txt") \
        if spy and emitter else None
    cpu_a = Cpu(pids)
    if spy:
        await spy.start(server.pid)
    if spy_emitter:
        await spy_emitter.start(emitter.pid)
    source = emitter or server
    await source.send("go" if emitter else {"cmd": "emit", "rate": args.rate, "duration": args.duration})
    # Bounded: subscribers are stopped at the latest `--drain` s after the emit window, even when a
    # saturated server has not even reported its emits yet (closing the streams frees it to).
    deadline = time.monotonic() + args.duration + args.drain
    answer = asyncio.ensure_future(source.next(args.duration + args.drain + 300))
    answer.add_done_callback(lambda f: f.cancelled() or f.exception())  # no "never retrieved" on Ctrl-C
    last_total, last_change = -1, time.monotonic()
    while time.monotonic() < deadline:
        total = sum(s.progress.get("progress", 0) for s in subs)
        now = time.monotonic()
        if answer.done():
            expected = (answer.result()["emitted"] - answer.result().get("emit_errors", 0)) * n_conn
            if total >= expected or now - last_change > 5:
                break
        if total != last_total:
            last_total, last_change = total, now
        await asyncio.sleep(0.2)
    cpu_b = Cpu(pids)
    profile = await spy.stop(f"{label}: server process") if spy else None
    profile_emitter = await spy_emitter.stop(f"{label}: emitter process") if spy_emitter else None
    rss2 = rss_kib(server.pid)
    for s in subs:
        await s.send("stop")
    finals = [await s.next(60) for s in subs]
    emitted = await answer
    expected = (emitted["emitted"] - emitted.get("emit_errors", 0)) * n_conn  # failed emits reach nobody
    for s in subs:
        await s.finish(10)
    await server.finish(20, {"cmd": "quit"})
    if emitter:
        await emitter.finish(10, "quit")

    merged = Histogram.merge([f["hist"] for f in finals])
    received = sum(f["received"] for f in finals)
    lasts = [f["last_recv"] for f in finals if f["last_recv"]]
    span = max(args.duration, (max(lasts) - emitted["t0"]) if lasts else 0.0)
    missing = max(0, expected - received)
    cpu = cpu_b.since(cpu_a)
    row = {
        "label": label, "kind": kind, "db": db_kind(db), "emit_from": emit_from,
        "subscribers": n_conn, "failed": failed, "rate": args.rate, "duration_s": args.duration,
        "emit_errors": emitted.get("emit_errors", 0), "emit_error_first": emitted.get("emit_error_first"),
        "emitted": emitted["emitted"] - emitted.get("emit_errors", 0), "emit_start_rate": emitted["start_rate"], "emit_elapsed_s": emitted["elapsed_s"], "emit_behind_s": emitted["behind_s"],
        "emit_max_inflight": emitted["max_inflight"], "others_cores_before": others_before,
        # the bare broadcast is synchronous (queue puts): there is no emit call to time
        "emit_ms_p50": emitted["emit_ms_p50"] if kind == "engine" else None,
        "emit_ms_p99": emitted["emit_ms_p99"] if kind == "engine" else None,
        "expected": expected, "received": received, "complete": received / expected if expected else 0.0,
        "delivered_per_s": received / span if span else 0.0, "offered_per_s": expected / args.duration,
        "span_s": span,
        "p50_ms": Histogram.percentile(merged, 0.50, missing), "p90_ms": Histogram.percentile(merged, 0.90, missing),
        "p99_ms": Histogram.percentile(merged, 0.99, missing), "max_ms": Histogram.percentile(merged, 1.0, missing),
        "rss_before_kib": rss0, "rss_connected_kib": rss1, "rss_after_run_kib": rss2,
        "kib_per_conn": (rss1 - rss0) / n_conn if n_conn else 0.0, "connect_s": connect_s,
        "per_conn_min": min(f["per_conn_min"] for f in finals), "per_conn_max": max(f["per_conn_max"] for f in finals),
        "lost_streams": sum(f["lost"] for f in finals), "client_cpu_self_s": sum(f["cpu_s"] for f in finals),
        "server_us_per_delivery": 1e6 * cpu["server_cpu_pct"] / 100 * cpu["cpu_window_s"] / received if received else None,
        **cpu,
    }
    if profile:
        row["profile"] = profile
    if profile_emitter:
        row["profile_emitter"] = profile_emitter
    if row["emit_errors"]:
        log(f"    {row['emit_errors']:,} emits FAILED, e.g. {row['emit_error_first']}")
    log(f"    emitted {row['emitted']:,} ({row['emit_start_rate']:.0f}/s); "
        f"delivered {row['delivered_per_s']:,.0f}/s of {row['offered_per_s']:,.0f}/s offered "
        f"({100 * row['complete']:.1f}% complete), p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms; "
        f"server CPU {row['server_cpu_pct']:.0f}%, clients {row['client_cpu_pct']:.0f}%, "
        f"{row['server_us_per_delivery'] or 0:.1f} µs server CPU per delivery; other processes {row['others_cores']:.2f} cores")
    return row


def ms(value: float | None, digits: int = 1) -> str:
    if value is None:
        return f"{'-':>8}"
    if value == float("inf"):
        return f"{'never':>8}"
    return f"{value:8.{digits}f}"


def aggregate(rows: list[dict]) -> list[dict]:
    """One row per label: the median of each number over the repetitions (runs kept in `runs`)."""
    by_label: dict[str, list[dict]] = {}
    for r in rows:
        by_label.setdefault(r["label"], []).append(r)
    out = []
    for runs in by_label.values():
        if len(runs) == 1:
            out.append(runs[0])
            continue
        merged = dict(runs[0])
        for key, value in runs[0].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                vals = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
                merged[key] = statistics.median(vals) if vals else value
        merged["runs"] = runs
        merged["label"] = runs[0]["label"]
        for key in ("profile", "profile_emitter"):
            merged[key] = next((r[key] for r in runs if r.get(key)), None)
        out.append(merged)
    return out


def db_kind(db: str | None) -> str:
    if db is None:
        return "memory"
    return "postgresql" if db.startswith("postgresql") else "sqlite"


# ------------------------------------------------------------------------------- replay
async def run_replay(procs: Procs, args: argparse.Namespace, label: str, db: str) -> dict:
    await wait_quiet(args, label)
    fill = await procs.spawn(f"{label} fill", PY, SSE / "fill.py", "--db", db, "--events", args.replay_events,
                             "--batch", 1000)
    info = await fill.next(900)
    await fill.finish(30)
    log(f"  {label}: filled {info['head']:,} events in {info['fill_s']:.1f}s "
        f"({info['head'] / info['fill_s']:,.0f}/s through live.append x1000)")
    port = free_port()
    uv = ["--uvloop"] if args.uvloop else []
    server = await procs.spawn(f"{label} server", PY, SSE / "engine_server.py", "--db", db, "--port", port, *uv)
    await server.next(30)
    await wait_listening(port, timeout=30.0)
    await warm(port, LIVE_PATH, f"{info['epoch']}.{info['head']}")
    cursor = f"{info['epoch']}.0"
    reps = []
    profile = None
    for rep in range(args.replay_reps):
        spy = None
        if args.profile and rep == args.replay_reps - 1:
            spy = Spy(procs, procs.workdir / f"pyspy-{label.replace(' ', '_')}.txt")
            await spy.start(server.pid)
        reader = await procs.spawn(f"{label} reader{rep}", PY, SSE / "subscribers.py", "replay", "--port", port,
                                   "--path", LIVE_PATH, "--last-event-id", cursor, "--until", args.replay_events,
                                   "--timeout", 300)
        cpu_a = Cpu({"server": [server.pid], "client": [reader.pid]})
        final = await reader.next(330)
        cpu_b = Cpu({"server": [server.pid], "client": [reader.pid]})
        await reader.finish(10)
        if spy:
            profile = await spy.stop(label)
        if final.get("t_done") is None:
            raise RuntimeError(f"{label}: replay stopped at {final.get('received')} events ({final})")
        elapsed = final["t_done"] - final["t_request"]
        cpu = cpu_b.since(cpu_a)
        server_cpu_s = cpu["server_cpu_pct"] / 100 * cpu["cpu_window_s"]
        reps.append({"events": final["received"], "elapsed_s": elapsed, "per_s": args.replay_events / elapsed,
                     "per_server_cpu_s": args.replay_events / server_cpu_s if server_cpu_s else None,
                     "ttfb_ms": 1000 * (final["t_first"] - final["t_request"]), **cpu})
        log(f"    rep {rep}: {args.replay_events:,} events in {elapsed:.2f}s = {reps[-1]['per_s']:,.0f}/s "
            f"(first event after {reps[-1]['ttfb_ms']:.0f} ms; server CPU {reps[-1]['server_cpu_pct']:.0f}% = "
            f"{(reps[-1]['per_server_cpu_s'] or 0):,.0f} events per server CPU-second, "
            f"reader {reps[-1]['client_cpu_pct']:.0f}%)")
    await server.finish(20, {"cmd": "quit"})
    rates = sorted(r["per_s"] for r in reps)
    row = {"label": label, "db": db_kind(db), "events": args.replay_events, "fill_s": info["fill_s"],
           "reps": reps, "per_s_median": rates[len(rates) // 2], "per_s_best": rates[-1]}
    if profile:
        row["profile"] = profile
    return row


# ------------------------------------------------------------------------------- report
def report(fanouts: list[dict], replays: list[dict], args: argparse.Namespace) -> bool:
    ok = True
    bare = next((r for r in fanouts if r["kind"] == "bare"), None)
    log("")
    gs = git_state()
    log(f"engine at {gs['head'][:10]}" + (f" + uncommitted changes in {len(gs['dirty_engine_files'])} engine files"
                                            if gs["dirty_engine_files"] else ""))
    log(f"SSE fan-out: {args.subs} subscribers on one tape, {args.rate:g} events/s for {args.duration:g}s "
        f"({platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{'uvloop' if args.uvloop else 'asyncio'} servers, uvicorn log_level=warning)")
    W = max([42] + [len(r["label"]) for r in fanouts + replays])
    head = (f"{'':{W}} {'emit/s':>6} {'delivered/s':>11} {'vs bare':>7} {'complete':>8} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'max ms':>8} {'emit p99':>8} {'KiB/conn':>8} {'srv CPU':>7} {'µs/dlv':>6} {'cli CPU':>7} {'others':>6}  floors")
    log(head)
    log("-" * len(head))
    for r in fanouts:
        ratio = r["delivered_per_s"] / bare["delivered_per_s"] if bare and bare["delivered_per_s"] else None
        marks = ""
        if r["kind"] == "engine":
            thr_ok = ratio is not None and ratio >= FLOOR_RATIO
            lat_ok = r["p99_ms"] < FLOOR_P99_MS
            r["floor_throughput"] = None if ratio is None else thr_ok
            r["floor_p99"] = lat_ok
            marks = (f"thr {'PASS' if thr_ok else 'FAIL'}  " if ratio is not None else "thr n/a  ") + \
                f"p99 {'PASS' if lat_ok else 'FAIL'}"
            ok = ok and lat_ok and (thr_ok or ratio is None)
        r["vs_bare"] = ratio
        log(f"{r['label']:{W}} {r['emit_start_rate']:6.0f} {r['delivered_per_s']:11,.0f} "
            f"{(f'{100 * ratio:6.0f}%' if ratio else '      -'):>7} "
            f"{100 * r['complete']:7.1f}% {ms(r['p50_ms'])} {ms(r['p99_ms'])} {ms(r['max_ms'], 0)} {ms(r['emit_ms_p99'])} "
            f"{r['kib_per_conn']:8.1f} {r['server_cpu_pct']:6.0f}% {r['server_us_per_delivery'] or 0:6.1f} "
            f"{r['client_cpu_pct']:6.0f}% {r['others_cores']:6.2f}  {marks}")
    log(f"  emit/s = events actually emitted per second (target {args.rate:g}; the emitter stops at {args.duration:g}s even "
        f"if a saturated loop made it late); offered = emitted × subscribers / {args.duration:g}s;\n"
        f"  delivered/s = receipts / (last receipt − first emit), streams stopped ≤ {args.drain:g}s after the emit window; "
        f"latency percentiles count undelivered events as never (inf);\n  "
        f"CPU is % of one core over emit+drain (cli = all subscriber processes, busiest one "
        f"{max((r['client_cpu_max_proc_pct'] for r in fanouts), default=0):.0f}%);\n"
        f"  emit p99 = ms from calling app.emit to its return (open-loop emitter; the bare broadcast is synchronous);\n"
        f"  µs/dlv = server CPU per delivered event; others = cores used by processes outside this benchmark "
        f"(a shared box shows up here, and as latency).")
    log(f"  floors: fan-out ≥ {100 * FLOOR_RATIO:.0f}% of bare, p99 < {FLOOR_P99_MS:.0f} ms")
    if replays:
        log("")
        log(f"Tape replay on resume: {args.replay_events:,} events from Last-Event-ID <epoch>.0, one reader")
        head = (f"{'':{W}} {'median ev/s':>11} {'best ev/s':>10} {'1st event':>9} {'srv CPU':>7} {'ev/srv-CPU-s':>12} "
                f"{'cli CPU':>7} {'others':>6} {'fill ev/s':>10}  floor")
        log(head)
        log("-" * len(head))
        for r in replays:
            good = r["per_s_median"] > FLOOR_REPLAY
            r["floor_replay"] = good
            ok = ok and good
            mid = sorted(r["reps"], key=lambda x: x["per_s"])[len(r["reps"]) // 2]
            log(f"{r['label']:{W}} {r['per_s_median']:11,.0f} {r['per_s_best']:10,.0f} {mid['ttfb_ms']:7.0f}ms "
                f"{mid['server_cpu_pct']:6.0f}% {(mid['per_server_cpu_s'] or 0):12,.0f} {mid['client_cpu_pct']:6.0f}% "
                f"{mid['others_cores']:6.2f} "
                f"{r['events'] / r['fill_s']:10,.0f}  "
                f"> {FLOOR_REPLAY:,.0f}/s {'PASS' if good else 'FAIL'}")
    for r in fanouts + replays:
        for key in ("profile", "profile_emitter"):
            if r.get(key):
                log("")
                log(spyfold.render(r[key]["title"], r[key]))
    log("")
    log(f"overall: {'PASS' if ok else 'FAIL'}")
    return ok


# ------------------------------------------------------------------------------- main
def git_state() -> dict:
    """The engine code measured: HEAD, and which engine files differ from it (uncommitted work)."""
    def run(*argv: str) -> str:
        try:
            return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"head": run("rev-parse", "HEAD"), "dirty_engine_files": run("status", "--porcelain", "engine").splitlines()}


async def main(args: argparse.Namespace) -> int:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, task.cancel)
    workdir = Path(tempfile.mkdtemp(prefix="oke-sse-bench-"))
    procs = Procs(workdir)
    pg = None
    fanouts: list[dict] = []
    replays: list[dict] = []
    failures: list[dict] = []
    ok = False
    try:
        backends: list[tuple[str, Any]] = []
        if not args.no_sqlite:
            backends.append(("sqlite", lambda name: f"sqlite:///{workdir / (name + '.db')}"))
        if args.pg:
            from pgcluster import PgCluster

            log("starting a private PostgreSQL (tests/pgcluster.py) ...")
            pg = await asyncio.to_thread(lambda: PgCluster().start())
            backends.append(("postgresql", lambda name: pg.create_database(f"oke_sse_{name}")))
        scenarios: list[tuple[str, str, Any, str, str]] = []  # label, kind, make_db, emit_from, slug
        if not args.no_fanout:
            if not args.no_bare:
                scenarios.append(("bare sse-starlette (in-memory queues)", "bare", None, "server", "bare"))
            for kind, make_db in backends:
                short = "SQLite" if kind == "sqlite" else "PostgreSQL"
                for emit_from in args.emit_from:
                    where = "emit in server" if emit_from == "server" else "emit from another process"
                    scenarios.append((f"okengine {short}, {where}", "engine", make_db, emit_from,
                                      f"fanout_{emit_from}"))
        runs: list[dict] = []
        for rep in range(args.reps):
            if args.reps > 1:
                log(f"fan-out repetition {rep + 1} of {args.reps}")
            for label, kind, make_db, emit_from, slug in scenarios:
                db = await asyncio.to_thread(make_db, f"{slug}_{rep}") if make_db else None
                try:
                    row = await run_fanout(procs, args, label, kind, db, emit_from)
                except RuntimeError as err:  # one broken scenario must not lose the others
                    log(f"    FAILED: {str(err).splitlines()[0]}")
                    failures.append({"label": label, "error": str(err)})
                    await procs.close_all()
                    continue
                row["rep"] = rep
                runs.append(row)
        fanouts = aggregate(runs)
        if not args.no_replay:
            for kind, make_db in backends:
                short = "SQLite" if kind == "sqlite" else "PostgreSQL"
                db = await asyncio.to_thread(make_db, "replay")
                try:
                    replays.append(await run_replay(procs, args, f"okengine {short} replay", db))
                except RuntimeError as err:
                    log(f"    FAILED: {str(err).splitlines()[0]}")
                    failures.append({"label": f"okengine {short} replay", "error": str(err)})
                    await procs.close_all()
        ok = report(fanouts, replays, args)
        for f in failures:
            log(f"FAILED scenario {f['label']}: {f['error'].splitlines()[0]}")
        ok = ok and not failures
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / f"sse-{time.strftime('%Y%m%d-%H%M%S')}.json"
        out.write_text(json.dumps({"args": vars(args), "git": git_state(), "python": platform.python_version(),
                                   "cpus": os.cpu_count(),
                                   "fanout": fanouts, "replay": replays, "failures": failures},
                                  indent=1, default=str))
        log(f"raw results: {out.relative_to(REPO)}")
    finally:
        await procs.close_all()
        if pg is not None:
            await asyncio.to_thread(pg.stop)
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="200 subscribers for 5 s, one replay rep")
    p.add_argument("--pg", action="store_true", help="also run against a private PostgreSQL")
    p.add_argument("--no-sqlite", action="store_true", help="skip the SQLite runs")
    p.add_argument("--subs", type=int, help="subscribers (default 1000, --quick 200)")
    p.add_argument("--sub-procs", type=int, default=2, help="subscriber processes (default 2)")
    p.add_argument("--rate", type=float, default=200.0, help="events emitted per second (default 200)")
    p.add_argument("--duration", type=float, help="emit seconds (default 20, --quick 5)")
    p.add_argument("--drain", type=float, default=30.0, help="max seconds to wait for stragglers after the last emit")
    p.add_argument("--emit-from", nargs="+", choices=["server", "process"], default=["server", "process"],
                   help="engine emitter placement(s) (default both)")
    p.add_argument("--reps", type=int, default=1, help="fan-out repetitions, interleaved; the table shows medians")
    p.add_argument("--replay-events", type=int, default=100_000)
    p.add_argument("--replay-reps", type=int, help="replay repetitions (default 3, --quick 1)")
    p.add_argument("--no-bare", action="store_true")
    p.add_argument("--no-fanout", action="store_true")
    p.add_argument("--no-replay", action="store_true")
    p.add_argument("--uvloop", action="store_true", help="run both servers on uvloop (default: asyncio)")
    p.add_argument("--profile", action="store_true", help="py-spy the engine server (fan-out and last replay)")
    p.add_argument("--quiet-cores", type=float, default=0.3,
                   help="before each scenario, wait until other processes use fewer cores than this")
    p.add_argument("--quiet-wait", type=float, default=30.0, help="...for at most this many seconds (0: never wait)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (databases, stderr logs, py-spy)")
    args = p.parse_args(argv)
    args.subs = args.subs or (200 if args.quick else 1000)
    args.duration = args.duration or (5.0 if args.quick else 20.0)
    args.replay_reps = args.replay_reps or (1 if args.quick else 3)
    args.sub_procs = max(1, min(args.sub_procs, args.subs))
    return args


if __name__ == "__main__":
    # Ctrl-C must stop the run even when started where SIGINT is ignored (a background job of a script)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sys.exit(asyncio.run(main(parse())))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; every benchmark process was stopped", file=sys.stderr)
        sys.exit(130)
