#!/usr/bin/env python
"""Chaos run: once delivery under SIGKILLs, lost leases, failing handlers and database restarts.

    python bench/chaos.py --pg          full size on a private PostgreSQL (4 worker processes)
    python bench/chaos.py --sqlite      full size on one SQLite file (2 worker processes)
    python bench/chaos.py --short ...   the small form tests/test_chaos.py runs in CI
    python bench/chaos.py --starve ...  beside a busy loop on every core (workers short of CPU)
    (neither --pg nor --sqlite: both)   --seed N, --messages N, --keep (keep the work directory)

Worker processes (tests/chaos_workers/worker.py) compete for `chaos.jobs` messages on one store.
Each message's payload is its plan: how many attempts fail (some fail them all and go dead) and
which attempt sleeps past the short lease. While the messages are emitted, a killer SIGKILLs a
random worker every few seconds and starts a new one (a new worker id: `w<slot>.<incarnation>`);
after every second kill it also stops another worker cleanly (which hands what it claimed ahead
back to pending) and starts a new one there too; on SQLite one worker writes through its writer
process (`sqlite_writer="process"`), which is SIGKILLed on its own every few seconds, and the other
on its writer thread,
PostgreSQL is restarted (fast, immediate = crash recovery, and stopped for a few seconds), every
attempt of a share of the messages appends an event to the live tape `chaos.tape`, `chaos.jobs` is
paused for a few seconds now and then (2-3 windows; `engine.ops.pause` / `resume`, the second window
through `okconsole pause/resume --yes`), and readers follow the tape and the console (`engine.ops.stats` and
`python -m okconsole stats --json`) the whole time. Then the run drains, the workers stop, and the
records are checked against the once and live promises with plain SQL and the handlers' own logs:

  final      every message is `delivered` or `dead`, none still locked
  lost       every confirmed emit is stored, every planned message exists; a duplicate exists only
             where an emit failed without confirming (outage) and was emitted again
  attempts   per message, with A = attempts, F = attempts with a failure record (kind 'failure'),
             S = attempts with a `succeeded` run, L = the rest ("lost" attempts: the holder was
             SIGKILLed, outlived its lease, or could not settle before the lease ran out; such an
             attempt increments attempts and leaves no failure record):
               - at most one failure record per attempt, all within 1..A; F and S disjoint
               - delivered  <=> S = {A}, and every f in F is <= retries
               - dead       <=> A in F, A >= retries + 1, and every attempt retries+1 .. A-1 is in L
                                (so |F| = A - |L|; with no lost attempt |F| = retries + 1 = A)
               - every lost attempt is explained: its worker was SIGKILLed, or its run is
                 `lease_lost`, or its worker was stopped during an outage and logged giving up
                 its outcome, or it never reached the handler and some worker was killed
               - a message with no lost attempt and no outage failure ends exactly as planned
               - failure codes match the handler's own log; a `failed` run has a failure record
  lease      one holder at a time: for consecutive attempts n, n+1 of a message, if n lost its lease
             then n+1 was claimed after n's lease expiry (claim = lease_expires_at(n+1) - lease_ms, both
             read from the row by the handlers; a lease renewed before the handler started counts
             from the renewal, later than the claim), and if n's failure was recorded then n+1's handler
             started after n's handler ended; a handler still running when the next attempt started
             never got its outcome recorded. (After a settle the claim time is not comparable: a claim
             statement reads the clock when it begins and may take the message, re-checked once its row
             lock is free, after a settle that committed meanwhile: tens of ms later under load.)
  key order  per key, all attempts of all messages in seq order: each hold begins after the previous
             one ended (same two rules), so no two holders of a key overlap and keys go in emit order;
             the first claim of a message comes after its predecessor's finished_at; successful
             completions follow seq order; emits were stored in order
  lease left every handler started with at least 90 % of `lease_ms` left: the message's
             lease_expires_at as its handler read it from the row right after it began, against
             the wall-clock time it began (the store runs on this machine: one clock for both),
             for the attempts the row still named then (bench/netfaults.py's lossy link: less the
             longest one answer may take on it, which passes before the worker hears of its lease)
  tape       seq 1..head with no hole (nothing is pruned here), one epoch, every event an attempt
             logged is there with its payload, every event on the tape was logged by its attempt
             (or its emit raised StoreUnavailable, "may not be stored", or its worker was killed);
             a follower polling during the run saw seqs only grow, one by one
  console    stats reads succeeded except around database restarts; delivered + dead never
             went down between two reads; the CLI exited 0 (or 1, one line, while the store was away)
  workers    no worker exited on its own
  time       a share of the messages are delayed (0-500 ms), some prioritised, some deduplicated
             (each of those emitted twice at once): no attempt was claimed or started before its
             message's run_at, by the store's clock (PostgreSQL's own, read by the handler with the
             row); every delayed message was stored with a run_at; the twin emits of a dedupe key
             returned one id (unless an outage made one unconfirmed); a watcher polling during the
             run never saw two pending/inflight messages with one dedupe key
  clock      every worker runs clock.every("1s"): exactly one message per tick (its dedupe key the
             tick time), and every tick between the first and the last is there except in a
             PostgreSQL outage or while no worker was up (ready 1 s before it, not ended until 1 s after)
  pause      every planned pause window happened (from the pause call's return to the resume call):
             no attempt started in one after its first 1.3 s (the pause's 1 s promise, plus a claim's round
             trip), emits were still stored in the windows, pause/resume calls failed only in
             restarts (and were made again), and the signal ends resumed (the drain is `final`)
  limits     `chaos.capped` (concurrency 2) and `chaos.paced` (8 starts a second) messages emitted
             through the whole run under the same chaos (LimitRun): all delivered, never more than 2
             capped handlers at once, never more than 8 paced starts in any window of 1 s less the
             hand-over allowance, from the intervals the handlers logged; each limit was reached

Exit status 0 when every check passes, 1 otherwise.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal as os_signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from limitkit import most_at_once, most_in_window  # noqa: E402
from prockit import children  # noqa: E402

WORKER = REPO / "tests" / "chaos_workers" / "worker.py"
JOBS, TAPE, FLOW = "chaos.jobs", "chaos.tape", "chaos.worker"
# What fx.emit raises when the store may or may not have committed the append (engine/app.py).
UNCONFIRMED_APPEND_ERRORS = frozenset({"StoreUnavailable", "AppendInterrupted"})
TOL_MS = 2  # PostgreSQL rounds its clock to the ms, Python truncates: allow for both
# The docs promise the lease from the handler's start: a handler starts with this share of it left.
START_LEASE_SHARE = 0.9


@dataclass
class Config:
    backend: str                 # "pg" | "sqlite"
    short: bool
    workers: int
    messages: int
    keys: int
    keyed_share: float
    retries: int = 3
    lease_ms: int = 2000
    slow_ms: int = 2500
    slow_share: float = 0.01     # messages whose attempt 1 sleeps past the lease (a third as many: attempt 2)
    tape_share: float = 1.0      # messages whose every attempt appends to the live tape
    emit_s: float = 40.0         # emission is spread over this long
    kill_every: tuple[float, float] = (2.0, 6.0)
    stop_after_kills: int = 2    # after every 2nd kill, another worker is also stopped cleanly
    down_for: tuple[float, float] = (0.2, 1.5)
    # (share of messages emitted, how): a pg_ctl restart mode, or "down:S" (stopped for S seconds)
    pg_restarts: tuple[tuple[float, str], ...] = ()
    concurrency: int = 8
    drain_timeout_s: float = 300.0
    cli_every_s: float = 3.0
    seed: int = 0
    delayed_share: float = 0.25   # emitted with delay 0-500 ms
    # The longest one answer may take on the workers' link (bench/netfaults.py's lossy link: a lost
    # packet waits out TCP's retransmission): it passes between the store setting a lease and the
    # worker learning of it, so no renewal gives it back; the lease-left check allows it.
    link_ms: int = 0
    priority_share: float = 0.2   # emitted with priority 1-9
    dedupe_share: float = 0.1     # emitted twice at once with one dedupe key (and a delay, so the twin meets it)
    pause_windows: int = 3        # the jobs signal is paused this many times during the run
    pause_for: tuple[float, float] = (3.0, 6.0)    # each pause lasts this long (s)
    pause_gap: tuple[float, float] = (10.0, 20.0)  # before each pause (s)
    # SQLite: odd slots write on the thread (`sqlite_writer="thread"`), even ones in the writer
    # process, which is SIGKILLed on its own (the worker lives on) this often
    writer_kill_every: tuple[float, float] = (1.0, 2.5)
    starve: bool = False          # a busy loop on every core beside the run (Starver)


def profile(backend: str, short: bool, seed: int) -> Config:
    # Tape appends are serialised by the tape's row lock, held across several client round trips:
    # on a loaded 2-core machine PostgreSQL managed 25-150 appends/s. Handlers queueing for that lock
    # must stay well inside the lease, or a reclaim storm follows (leases are not renewed): so only a
    # share of the messages append, and PostgreSQL runs 4 handlers per process.
    if backend == "pg" and not short:
        return Config("pg", False, workers=4, messages=20_000, keys=50, keyed_share=0.6, emit_s=90,
                      concurrency=4, pg_restarts=((0.3, "fast"), (0.55, "immediate"), (0.8, "down:3")),
                      tape_share=0.25, drain_timeout_s=400, seed=seed)
    if backend == "sqlite" and not short:
        return Config("sqlite", False, workers=2, messages=20_000, keys=50, keyed_share=0.6, emit_s=90,
                      kill_every=(3.0, 8.0), tape_share=0.5, drain_timeout_s=400, seed=seed)
    if backend == "pg":
        return Config("pg", True, workers=4, messages=800, keys=24, keyed_share=0.6, concurrency=4,
                      slow_share=0.02, tape_share=0.5, emit_s=8, kill_every=(1.5, 3.0), down_for=(0.1, 0.6),
                      pg_restarts=((0.45, "immediate"),), drain_timeout_s=90, cli_every_s=2.0,
                      pause_windows=2, pause_for=(2.0, 3.0), pause_gap=(0.5, 1.5), seed=seed)
    return Config("sqlite", True, workers=2, messages=700, keys=8, keyed_share=0.6, lease_ms=1000,
                  slow_ms=1300, slow_share=0.02, emit_s=6, kill_every=(1.5, 3.0), down_for=(0.1, 0.6),
                  drain_timeout_s=90, cli_every_s=2.0, pause_windows=2, pause_for=(2.0, 2.5),
                  pause_gap=(0.5, 1.0), seed=seed)


# --------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class Planned:
    n: int
    key: str | None
    fails: int            # attempts 1..fails raise ChaosFailure
    slow: tuple[int, ...]  # attempts that outlive the lease
    tape: bool            # every attempt appends to the tape
    delay_ms: int = 0     # emitted with this delay (0: none)
    priority: int = 0
    dedupe: str | None = None  # emitted twice at once with this dedupe key

    def payload(self) -> dict[str, Any]:
        return {"n": self.n, "key": self.key, "fails": self.fails, "slow": list(self.slow), "tape": self.tape}

    def options(self) -> dict[str, Any]:
        """The emit's time and order options."""
        return {"delay": f"{self.delay_ms}ms" if self.delay_ms else None, "priority": self.priority,
                "dedupe": self.dedupe}


def make_plan(cfg: Config) -> list[Planned]:
    rng = random.Random(cfg.seed)
    keys = [f"k{i:02d}" for i in range(cfg.keys)]
    out = []
    for n in range(cfg.messages):
        key = rng.choice(keys) if rng.random() < cfg.keyed_share else None
        r = rng.random()
        fails = (0 if r < 0.70 else 1 if r < 0.84 else 2 if r < 0.91 else 3 if r < 0.94
                 else cfg.retries + 1)  # the last 6% fail every attempt: dead
        fails = min(fails, cfg.retries + 1)
        r = rng.random()
        slow = (1,) if r < cfg.slow_share else (2,) if r < cfg.slow_share * 4 / 3 else ()
        out.append(Planned(n, key, fails, slow, rng.random() < cfg.tape_share))
    # the time and order options draw from a generator of their own: the plan above stays the same
    opts = random.Random(cfg.seed + 1)
    for i, p in enumerate(out):
        delay = opts.randrange(1, 501) if opts.random() < cfg.delayed_share else 0
        priority = opts.randrange(1, 10) if opts.random() < cfg.priority_share else 0
        dedupe = f"d{p.n}" if opts.random() < cfg.dedupe_share else None
        if dedupe is not None:
            delay = max(delay, 300)  # the twin emit lands while the first is still pending
        out[i] = replace(p, delay_ms=delay, priority=priority, dedupe=dedupe)
    return out


# --------------------------------------------------------------------------- plain SQL readers

class Plain:
    """One persistent connection with the database's own driver; reconnects after an outage."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sqlite = url.startswith("sqlite")
        self.conn: Any = None

    async def rows(self, sql: str, *args: Any) -> list[tuple]:
        if self.sqlite:
            def run() -> list[tuple]:
                if self.conn is None:
                    self.conn = sqlite3.connect(self.url.split(":///", 1)[1], timeout=30,
                                                check_same_thread=False, isolation_level=None)
                q = sql
                for i in range(len(args), 0, -1):
                    q = q.replace(f"${i}", "?")
                return [tuple(r) for r in self.conn.execute(q, args).fetchall()]
            return await asyncio.to_thread(run)
        import asyncpg
        try:
            if self.conn is None or self.conn.is_closed():
                self.conn = await asyncpg.connect(self.url.replace("postgresql+asyncpg://", "postgresql://", 1),
                                                  timeout=5)
            async with asyncio.timeout(30):
                return [tuple(r) for r in await self.conn.fetch(sql, *args)]
        except BaseException:
            if self.conn is not None:
                self.conn.terminate()
            self.conn = None
            raise

    async def close(self) -> None:
        if self.conn is None:
            return
        if self.sqlite:
            self.conn.close()
        else:
            self.conn.terminate()
        self.conn = None


# --------------------------------------------------------------------------- worker processes

class WorkerDied(RuntimeError):
    pass


async def _exited(proc: subprocess.Popen, deadline: float) -> None:
    """Until `proc` exits or the monotonic `deadline` passes."""
    while proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


class Workers:
    """Worker subprocesses by slot; each (re)start is a new incarnation with a new worker id."""

    def __init__(self, cfg: Config, url: str, root: Path) -> None:
        self.cfg, self.url, self.dir = cfg, url, root
        self.current: dict[int, tuple[str, subprocess.Popen]] = {}
        self.incarnations: Counter[int] = Counter()
        self.killed: dict[str, float] = {}     # worker id -> when it was SIGKILLed (epoch s)
        self.stopped: dict[str, float] = {}    # worker id -> when it stopped cleanly mid-run (epoch s)
        self.stop_problems: list[str] = []
        self.all: dict[str, subprocess.Popen] = {}
        self.stopping = False

    def start(self, slot: int) -> str:
        self.incarnations[slot] += 1
        wid = f"w{slot}.{self.incarnations[slot]}"
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        log = open(self.dir / f"log-{wid}", "wb")
        proc = subprocess.Popen(
            [*self.prefix(slot), sys.executable, str(WORKER), "--url", self.url_of(slot), "--dir", str(self.dir),
             "--worker-id", wid, "--lease-ms", str(self.cfg.lease_ms), "--concurrency", str(self.cfg.concurrency),
             "--retries", str(self.cfg.retries), "--slow-ms", str(self.cfg.slow_ms), *self.writer_args(slot),
             *self.extra_args(slot), *self.clock_args()],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
        log.close()
        self.current[slot] = (wid, proc)
        self.all[wid] = proc
        return wid

    # Where and how a slot's process runs: bench/netfaults.py puts each in a network namespace.
    def prefix(self, slot: int) -> list[str]:
        return []

    def url_of(self, slot: int) -> str:
        return self.url

    def extra_args(self, slot: int) -> list[str]:
        return []

    def clock_args(self) -> list[str]:
        """Every worker runs the clock the run checks (see "the clock" below)."""
        return ["--clock-every", CLOCK_EVERY]

    def writer_args(self, slot: int) -> list[str]:
        """SQLite: odd slots keep the writer on a thread; even ones run the writer process."""
        return ["--sqlite-writer", "thread"] if self.cfg.backend == "sqlite" and slot % 2 else []

    def kill_writer(self, slot: int) -> str | None:
        """SIGKILL the SQLite writer process of the worker in `slot` (not the worker); its id."""
        wid, proc = self.current[slot]
        for child in children(proc.pid):
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"engine.store.sqlite.child" in cmdline:
                os.kill(child, os_signal.SIGKILL)
                return wid
        return None

    def kill(self, slot: int) -> str:
        wid, proc = self.current.pop(slot)
        if proc.poll() is None:
            proc.send_signal(os_signal.SIGKILL)
        proc.wait(10)
        self.killed[wid] = time.time()
        return wid

    async def stop_one(self, slot: int, timeout: float = 30.0) -> str:
        """Stop one worker the clean way (app.stop(): nothing starts any more, what it claimed ahead
        goes back to pending, running handlers get the grace period) and wait for it to exit 0."""
        wid, proc = self.current.pop(slot)
        (self.dir / f"stop-{wid}").touch()
        await _exited(proc, time.monotonic() + timeout)
        if proc.poll() != 0:
            self.stop_problems.append(f"{wid} did not stop cleanly mid-run ({proc.poll()})")
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            self.killed[wid] = time.time()
        else:
            self.stopped[wid] = time.time()
        return wid

    async def ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            if all((self.dir / f"ready-{wid}").exists() for wid, _ in self.current.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not boot in time\n" + self.logs())
            await asyncio.sleep(0.05)

    def unexpected(self) -> list[str]:
        """Workers that exited although nobody killed or stopped them."""
        out = []
        for wid, proc in self.all.items():
            rc = proc.poll()
            if rc is not None and wid not in self.killed and not ((self.stopping or wid in self.stopped) and rc == 0):
                out.append(f"{wid} exited with {rc}")
        return out

    def check_alive(self) -> None:
        bad = self.unexpected()
        if bad:
            raise WorkerDied("worker exited on its own: " + "; ".join(bad) + "\n" + self.logs())

    async def stop(self, timeout: float = 60.0) -> list[str]:
        self.stopping = True
        (self.dir / "stop").touch()
        deadline = time.monotonic() + timeout
        problems = []
        for wid, proc in self.current.values():
            await _exited(proc, deadline)
            if proc.poll() != 0:
                problems.append(f"{wid} did not stop cleanly ({proc.poll()})")
        return problems

    def kill_all(self) -> None:
        for proc in self.all.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def logs(self, tail: int = 2500) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}"
                         for p in sorted(self.dir.glob("log-*")) if p.stat().st_size)


class Starver:
    """`--starve`: one busy-looping process per core beside the run, from the first emit until the
    run ends, so the workers get the CPU in slices, as on an overloaded host: a claimed-ahead
    message then waits longer for its handler slot, and replies come back late."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        for _ in range(os.cpu_count() or 1):
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL))

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(10)
        self.procs.clear()


# --------------------------------------------------------------------------- the run

@dataclass
class Observed:
    """What the run saw while it happened."""

    confirmed: dict[int, str] = field(default_factory=dict)   # n -> message id of the confirmed emit
    uncertain: Counter[int] = field(default_factory=Counter)  # n -> emits that raised (maybe stored)
    emit_errors: Counter[str] = field(default_factory=Counter)
    kills: list[tuple[float, str]] = field(default_factory=list)
    writer_kills: list[tuple[float, str]] = field(default_factory=list)  # SQLite writer processes SIGKILLed
    clean_stops: list[tuple[float, str]] = field(default_factory=list)
    restarts: list[tuple[float, float, str]] = field(default_factory=list)  # (start, end, mode)
    restart_errors: list[str] = field(default_factory=list)
    tape_polls: int = 0
    tape_seen: int = 0
    tape_last: int = 0
    tape_epochs: set[str] = field(default_factory=set)
    tape_holes: list[tuple[int, int]] = field(default_factory=list)
    tape_errors: int = 0
    ops_reads: int = 0
    ops_failures: list[tuple[float, str]] = field(default_factory=list)
    ops_regressions: list[str] = field(default_factory=list)
    cli_reads: int = 0
    cli_failures: list[tuple[float, int, str]] = field(default_factory=list)
    cli_regressions: list[str] = field(default_factory=list)
    partitions: list[tuple[float, float, str]] = field(default_factory=list)  # (start, end, worker id)
    twins: dict[int, str] = field(default_factory=dict)  # n -> the id the twin dedupe emit returned
    dedupe_polls: int = 0
    dedupe_doubles: list[str] = field(default_factory=list)  # dedupe keys seen held twice at once
    pause_planned: int = 0  # windows the pauser set out to make (0: no pauser ran, no pause check)
    pauses: list[tuple[float, float, str]] = field(default_factory=list)  # (committed, resume issued, how)
    pause_failures: list[tuple[float, str]] = field(default_factory=list)  # pause/resume calls that failed
    emit_started: float = 0.0
    emit_ended: float = 0.0
    drained: float = 0.0


def is_outage(err: BaseException) -> bool:
    from engine.store.outage import is_outage as engine_is_outage
    return engine_is_outage(err)


async def emitter(app: Any, jobs: Any, cfg: Config, plan: list[Planned], obs: Observed,
                  progress: asyncio.Event) -> None:
    """Emit every planned message, paced over cfg.emit_s; one emit per key at a time (order)."""
    obs.emit_started = time.time()
    started = time.monotonic()
    rate = cfg.messages / cfg.emit_s
    i = 0

    async def emit_one(p: Planned, into: dict[int, str]) -> None:
        backoff = 0.05
        while True:
            try:
                into[p.n] = await app.emit(jobs, p.payload(), key=p.key, **p.options())
                return
            except Exception as err:  # an outage: maybe stored, maybe not; emit again
                obs.uncertain[p.n] += 1
                obs.emit_errors[type(err).__name__ if isinstance(err, StoreUnavailable)
                                else f"{type(err).__name__}: {str(err)[:100]}"] += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    from engine.errors import StoreUnavailable
    while i < len(plan):
        wave: list[Planned] = []
        keys: set[str] = set()
        while i < len(plan) and len(wave) < 50:
            p = plan[i]
            if p.key is not None and p.key in keys:
                break
            if p.key is not None:
                keys.add(p.key)
            wave.append(p)
            i += 1
        await asyncio.gather(*(emit_one(p, obs.confirmed) for p in wave),
                             *(emit_one(p, obs.twins) for p in wave if p.dedupe is not None))
        progress.set()
        ahead = started + i / rate - time.monotonic()
        if ahead > 0:
            await asyncio.sleep(ahead)
    obs.emit_ended = time.time()


async def killer(workers: Workers, cfg: Config, obs: Observed, stop: asyncio.Event) -> None:
    rng = random.Random(cfg.seed + 1)
    stops = random.Random(cfg.seed + 2)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), rng.uniform(*cfg.kill_every))
            return
        except TimeoutError:
            pass
        slot = rng.randrange(cfg.workers)
        obs.kills.append((time.time(), workers.kill(slot)))
        await asyncio.sleep(rng.uniform(*cfg.down_for))
        workers.start(slot)
        if len(obs.kills) % cfg.stop_after_kills == 0:  # its own draws: the kills are as without it
            other = (slot + 1 + stops.randrange(cfg.workers - 1)) % cfg.workers
            obs.clean_stops.append((time.time(), await workers.stop_one(other)))
            workers.start(other)


async def writer_killer(workers: Workers, cfg: Config, obs: Observed, stop: asyncio.Event) -> None:
    """SQLite: SIGKILL a worker's writer process now and then; the worker must go on with a new one."""
    rng = random.Random(cfg.seed + 3)
    process_slots = [slot for slot in range(cfg.workers) if not workers.writer_args(slot)]
    wait = rng.uniform(*cfg.writer_kill_every)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), wait)
            return
        except TimeoutError:
            pass
        slot = rng.choice(process_slots)
        if slot in workers.current and (wid := workers.kill_writer(slot)) is not None:
            obs.writer_kills.append((time.time(), wid))
            wait = rng.uniform(*cfg.writer_kill_every)
        else:
            wait = 0.2  # the worker was just restarted (no writer yet): try again soon


async def restarter(pg: Any, cfg: Config, obs: Observed, progress: asyncio.Event) -> None:
    for share, mode in cfg.pg_restarts:
        while len(obs.confirmed) < share * cfg.messages:
            progress.clear()
            await progress.wait()
        t0 = time.time()
        try:
            if mode.startswith("down"):  # "down:S": stop (fast), stay away S seconds, start again
                await asyncio.to_thread(pg.stop_server, "fast")
                await asyncio.sleep(float(mode.split(":")[1]))
                await asyncio.to_thread(pg.start_server)
            else:
                await asyncio.to_thread(pg.restart, mode)
        except Exception as err:  # keep going: the checks will tell what happened
            obs.restart_errors.append(f"{mode}: {err}")
        obs.restarts.append((t0, time.time(), mode))


async def pauser(app: Any, url: str, cfg: Config, obs: Observed) -> None:
    """Pause the jobs signal now and then while the run goes on, the second window through
    the real CLI, the others through `engine.ops`; always leave it resumed, or the drain never ends."""
    rng = random.Random(cfg.seed + 2)
    obs.pause_planned = cfg.pause_windows
    while not obs.confirmed:  # the emission has begun
        await asyncio.sleep(0.05)
    paused = False
    try:
        for i in range(cfg.pause_windows):
            await asyncio.sleep(rng.uniform(*cfg.pause_gap))
            how = "cli" if i == 1 else "ops"
            paused = True  # from the first call on: it may commit though it raises
            committed = await _until_toggled(app, url, obs, how, pause=True)
            await asyncio.sleep(rng.uniform(*cfg.pause_for))
            issued = time.time()
            obs.pauses.append((committed, issued, how))
            await _until_toggled(app, url, obs, how, pause=False)
            paused = False
    finally:
        if paused:
            await _until_toggled(app, url, obs, "ops", pause=False)


async def _until_toggled(app: Any, url: str, obs: Observed, how: str, *, pause: bool) -> float:
    """Pause (or resume) the jobs signal, calling again until a call succeeds (a database restart
    fails some); when the successful call returned (epoch s)."""
    from engine import ops
    verb = "pause" if pause else "resume"
    env = cli_env()
    while True:
        try:
            if how == "cli":
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "okconsole", "--db", url, verb, JOBS, "--yes", "--reason", "chaos",
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(REPO), stdin=subprocess.DEVNULL)
                _out, errout = await proc.communicate()
                if proc.returncode != 0:
                    raise RuntimeError(f"okconsole {verb} exit {proc.returncode}: "
                                       f"{errout.decode(errors='replace').strip()[-200:]}")
            else:
                await (ops.pause if pause else ops.resume)(app.store, JOBS, actor="chaos", reason="chaos")
            return time.time()
        except Exception as err:
            obs.pause_failures.append((time.time(), f"{verb} ({how}) {type(err).__name__}: {str(err)[:160]}"))
            await asyncio.sleep(0.2)


async def tape_follower(url: str, obs: Observed, stop: asyncio.Event) -> None:
    """Poll the tape from the store while the run goes on: seqs must only grow, one by one."""
    reader = Plain(url)
    try:
        while True:
            final = stop.is_set()
            try:
                [(epoch, head)] = await reader.rows("SELECT epoch, head FROM oke_tapes WHERE signal = $1", TAPE) \
                    or [(None, 0)]
                if epoch is not None:
                    obs.tape_epochs.add(epoch)
                rows = await reader.rows("SELECT seq FROM oke_tape_events WHERE signal = $1 AND seq > $2 "
                                         "ORDER BY seq LIMIT 5000", TAPE, obs.tape_last)
                obs.tape_polls += 1
                for (seq,) in rows:
                    if seq != obs.tape_last + 1:
                        obs.tape_holes.append((obs.tape_last, seq))
                    obs.tape_last = max(obs.tape_last, seq)
                    obs.tape_seen += 1
                if len(rows) == 5000:
                    continue
            except Exception:
                obs.tape_errors += 1
                await asyncio.sleep(0.2)
                continue
            if final:
                return
            await asyncio.sleep(0.05)
    finally:
        await reader.close()


async def dedupe_watcher(url: str, obs: Observed, stop: asyncio.Event) -> None:
    """Poll for a dedupe key that two pending/inflight messages hold (the index must forbid it)."""
    reader = Plain(url)
    try:
        while not stop.is_set():
            try:
                rows = await reader.rows(
                    "SELECT dedupe, count(*) FROM oke_messages WHERE signal = $1 AND dedupe IS NOT NULL "
                    "AND status IN ('pending', 'inflight') GROUP BY dedupe HAVING count(*) > 1", JOBS)
                obs.dedupe_polls += 1
                obs.dedupe_doubles += [f"{k} held by {c}" for k, c in rows]
            except Exception:
                pass  # the database is restarting
            await asyncio.sleep(0.2)
    finally:
        await reader.close()


def _in_outage(obs: Observed, at: float, slack: float = 10.0) -> bool:
    return any(start - 0.5 <= at <= end + slack for start, end, _ in obs.restarts) or bool(obs.restart_errors)


async def ops_reader(app: Any, obs: Observed, stop: asyncio.Event) -> None:
    """The console's model (`engine.ops.stats`) read beside the run."""
    from engine import ops
    last_finished = 0
    while not stop.is_set():
        confirmed_before = len(obs.confirmed)
        try:
            rows = await ops.stats(app.store)
        except Exception as err:
            obs.ops_failures.append((time.time(), f"{type(err).__name__}: {str(err)[:120]}"))
            await asyncio.sleep(0.3)
            continue
        obs.ops_reads += 1
        row = next((r for r in rows if r.signal == JOBS), None)
        if row is not None:
            finished = row.delivered + row.dead
            total = finished + row.pending + row.inflight
            if finished < last_finished:
                obs.ops_regressions.append(f"delivered+dead went from {last_finished} to {finished}")
            if total < confirmed_before:
                obs.ops_regressions.append(f"{total} messages counted after {confirmed_before} confirmed emits")
            last_finished = max(last_finished, finished)
        await asyncio.sleep(0.5)


def cli_env() -> dict[str, str]:
    """The environment `python -m okconsole` runs in: this checkout's code, no colours."""
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), NO_COLOR="1")


async def cli_reader(url: str, cfg: Config, obs: Observed, stop: asyncio.Event) -> None:
    """`python -m okconsole stats --json` in a process of its own, now and then."""
    last_finished = 0
    env = cli_env()
    while not stop.is_set():
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "okconsole", "--db", url, "stats", "--json",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(REPO),
            stdin=subprocess.DEVNULL)
        out, errout = await proc.communicate()
        if proc.returncode != 0:
            obs.cli_failures.append((time.time(), proc.returncode, errout.decode(errors="replace").strip()[-300:]))
        else:
            try:
                rows = json.loads(out)
                row = next(r for r in rows if r["signal"] == JOBS)
                finished = row["delivered"] + row["dead"]
                if finished < last_finished:
                    obs.cli_regressions.append(f"delivered+dead went from {last_finished} to {finished}")
                last_finished = max(last_finished, finished)
                obs.cli_reads += 1
            except Exception as err:
                obs.cli_failures.append((time.time(), 0, f"bad JSON: {err}: {out[:200]!r}"))
        try:
            await asyncio.wait_for(stop.wait(), cfg.cli_every_s)
        except TimeoutError:
            pass


async def wait_drained(url: str, cfg: Config, workers: Workers, deadline_s: float) -> tuple[bool, str]:
    reader = Plain(url)
    deadline = time.monotonic() + deadline_s
    state = ""
    try:
        while time.monotonic() < deadline:
            workers.check_alive()
            try:
                rows = await reader.rows("SELECT status, count(*) FROM oke_messages WHERE signal = $1 "
                                         "GROUP BY status", JOBS)
            except Exception as err:
                state = f"({type(err).__name__})"
                await asyncio.sleep(0.5)
                continue
            counts = dict(rows)
            state = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            if not counts.get("pending") and not counts.get("inflight"):
                return True, state
            await asyncio.sleep(0.25)
        return False, state
    finally:
        await reader.close()


# --------------------------------------------------------------------------- verification

@dataclass
class Attempt:
    msg: str
    n: int
    worker: str | None = None
    start: int | None = None
    claim: int | None = None      # lease_expires_at - lease_ms, when the row named this attempt
    lease: int | None = None
    row_mismatch: bool = False    # the row no longer named this attempt when the handler read it
    end: int | None = None
    outcome: str | None = None    # E | F | X
    x_code: str | None = None
    event_ids: list[str] = field(default_factory=list)
    run_at: int | None = None     # the row's run_at when the handler started ("-": none)
    store_now: int | None = None  # the store's clock then


class Report:
    def __init__(self) -> None:
        self.checks: list[tuple[str, bool, str, list[str]]] = []
        self.figures: list[str] = []

    def check(self, name: str, ok: bool, summary: str, problems: list[str] | None = None) -> None:
        self.checks.append((name, ok, summary, problems or []))

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _, _ in self.checks)

    def print(self, title: str) -> None:
        print(f"\n== {title}", flush=True)
        for line in self.figures:
            print(f"   {line}")
        for name, ok, summary, problems in self.checks:
            print(f"   [{'PASS' if ok else 'FAIL'}] {name:10} {summary}")
            for p in problems[:8]:
                print(f"            - {p}")
            if len(problems) > 8:
                print(f"            … and {len(problems) - 8} more")
        print(f"   RESULT: {'PASS' if self.passed else 'FAIL'}", flush=True)


def clean_stop_logs(root: Path) -> tuple[int, dict[tuple[str, int], str]]:
    """What the workers' logs say about their clean stops, in one read of each log: how many
    messages claimed ahead they handed back, and (message id, attempt) -> the worker that ran it
    but, stopped during an outage, gave up writing its outcome (its log names each one)."""
    handed_back = 0
    given_up: dict[tuple[str, int], str] = {}
    for path in root.glob("log-*"):
        worker = path.name.removeprefix("log-")
        for line in path.read_text(errors="replace").splitlines():
            handed_back += sum(int(n) for n in re.findall(r"handed (\d+) messages claimed ahead back", line))
            if "giving up settling" in line:
                for mid, attempt in re.findall(r"(msg_\w+) attempt (\d+)", line):
                    given_up[(mid, int(attempt))] = worker
    return handed_back, given_up


def read_logs(root: Path) -> tuple[dict[tuple[str, int], Attempt], list[str]]:
    attempts: dict[tuple[str, int], Attempt] = {}
    bad: list[str] = []
    for path in sorted(root.glob("events-*")):
        for line in path.read_text(errors="replace").splitlines():
            f = line.split(" ")
            try:
                kind, msg, attempt, worker = f[0], f[1], int(f[2]), f[3]
                a = attempts.setdefault((msg, attempt), Attempt(msg, attempt))
                if kind == "S":
                    if a.start is not None:
                        bad.append(f"attempt {attempt} of {msg} started twice ({a.worker}, {worker})")
                    a.worker, a.start = worker, int(f[4])
                    holder, row_attempts, lease = f[5], f[6], f[7]
                    if len(f) > 9 and f[8] not in ("-", "?") and f[9] != "?":
                        a.run_at, a.store_now = int(f[8]), int(f[9])
                    if holder == "?":
                        pass  # the read met the database restarting
                    elif holder == worker and row_attempts == str(attempt) and lease not in ("-", "?"):
                        a.lease = int(lease)
                    else:
                        a.row_mismatch = True
                elif kind == "T":
                    a.event_ids.append(f[4])
                elif kind in ("E", "F", "X"):
                    if a.outcome is not None:
                        bad.append(f"attempt {attempt} of {msg} ended twice")
                    a.outcome, a.end = kind, int(f[4])
                    if kind == "X":
                        a.x_code = f[5]
                else:
                    bad.append(f"unknown record {line!r}")
            except (IndexError, ValueError):
                bad.append(f"{path.name}: malformed line {line!r}")
    return attempts, bad


async def verify(url: str, cfg: Config, plan: list[Planned], obs: Observed, workers: Workers,
                 stop_problems: list[str], root: Path) -> Report:
    rep = Report()
    rd = Plain(url)
    try:
        msgs = await rd.rows("SELECT id, seq, key, status, attempts, retries, locked_by, lease_expires_at, "
                             "finished_at, payload FROM oke_messages WHERE signal = $1 ORDER BY seq", JOBS)
        fails = await rd.rows("SELECT message_id, attempt, code, kind, at FROM oke_failures ORDER BY id")
        runs = await rd.rows("SELECT message_id, attempt, worker_id, status, started_at, ended_at FROM oke_runs "
                             "WHERE signal = $1", JOBS)
        tape_meta = await rd.rows("SELECT epoch, head, pruned_through FROM oke_tapes WHERE signal = $1", TAPE)
        tape = await rd.rows("SELECT seq, payload FROM oke_tape_events WHERE signal = $1 ORDER BY seq", TAPE)
        timed = await rd.rows("SELECT id, run_at, priority, dedupe, payload FROM oke_messages WHERE signal = $1",
                              JOBS)
        created = [c for (c,) in await rd.rows("SELECT created_at FROM oke_messages WHERE signal = $1", JOBS)]
        paused_now = [s for (s,) in await rd.rows("SELECT signal FROM oke_pauses")]
    finally:
        await rd.close()
    logged, log_problems = read_logs(root)
    (root / "rows.json").write_text(json.dumps({"messages": msgs, "failures": fails, "runs": runs}))
    lease_ms = cfg.lease_ms
    by_n = {p.n: p for p in plan}
    killed = set(workers.killed)
    writers_killed = {wid for _at, wid in obs.writer_kills}

    # ---------------------------------------------------------------- figures
    status = Counter(m[3] for m in msgs)
    total_attempts = sum(m[4] for m in msgs)
    keyed = sum(1 for p in plan if p.key is not None)
    rep.figures.append(f"{len(msgs)} messages stored for {cfg.messages} planned ({keyed} keyed over "
                       f"{cfg.keys} keys): delivered {status['delivered']}, dead {status['dead']}, "
                       f"other {len(msgs) - status['delivered'] - status['dead']}")
    emit_s = obs.emit_ended - obs.emit_started
    rep.figures.append(f"emitted in {emit_s:.1f} s, drained {obs.drained - obs.emit_ended:.1f} s later; "
                       f"{sum(obs.uncertain.values())} emits raised during outages and were emitted again"
                       + (f" ({dict(obs.emit_errors)})" if obs.emit_errors else ""))
    handed_back, given_up = clean_stop_logs(root)
    rep.figures.append(f"chaos: {len(obs.kills)} SIGKILLs and {len(obs.clean_stops)} clean stops (which handed "
                       f"{handed_back} messages claimed ahead back) over "
                       f"{len(workers.all)} worker incarnations; "
                       + (", ".join(f"PostgreSQL restart -m {mode} {end - start:.1f} s"
                                    for start, end, mode in obs.restarts) or "no database restarts"))

    # ---------------------------------------------------------------- final
    not_final = [f"{m[0]} is {m[3]} (locked_by {m[6]})" for m in msgs
                 if m[3] not in ("delivered", "dead") or m[6] is not None]
    rep.check("final", not not_final and len(msgs) > 0,
              f"{status['delivered'] + status['dead']} of {len(msgs)} delivered or dead", not_final)

    # ---------------------------------------------------------------- lost
    problems = []
    stored_ids = {m[0] for m in msgs}
    ns: dict[int, list[str]] = defaultdict(list)
    for m in msgs:
        ns[json.loads(m[9])["n"]].append(m[0])
    missing_ids = [f"confirmed emit of n={n} ({mid}) is not stored" for n, mid in obs.confirmed.items()
                   if mid not in stored_ids]
    problems += missing_ids
    problems += [f"n={n} was never stored" for n in by_n if n not in ns]
    problems += [f"n={n} stored {len(ids)} times with only {obs.uncertain[n]} unconfirmed emits"
                 for n, ids in ns.items() if len(ids) > 1 + obs.uncertain[n]]
    problems += [f"unknown n={n}" for n in ns if n not in by_n]
    problems += [f"n={n} never confirmed" for n in by_n if n not in obs.confirmed]
    problems += [f"emit raised {what} x{count} (an outage must raise StoreUnavailable)"
                 for what, count in obs.emit_errors.items() if what != "StoreUnavailable"]
    dupes = sum(len(ids) - 1 for ids in ns.values())
    rep.check("lost", not problems,
              f"{len(obs.confirmed)} confirmed emits all stored, every planned message present, "
              f"{dupes} duplicates (from {sum(obs.uncertain.values())} unconfirmed emits)", problems)

    # ---------------------------------------------------------------- attempts
    fail_rows: dict[str, dict[int, tuple[str, int]]] = defaultdict(dict)
    problems = []
    for mid, attempt, code, kind, at in fails:
        if kind != "failure":
            problems.append(f"{mid}: unexpected failure kind {kind!r}")
            continue
        if attempt in fail_rows[mid]:
            problems.append(f"{mid}: two failure records for attempt {attempt}")
        fail_rows[mid][attempt] = (code, at)
    run_rows: dict[tuple[str, int], list[tuple[str, str, int, int]]] = defaultdict(list)
    for mid, attempt, wid, st, started_at, ended_at in runs:
        run_rows[(mid, attempt)].append((st, wid, started_at, ended_at))
    lost_kinds: Counter[str] = Counter()
    clean = clean_as_planned = 0
    dup_success_handlers = 0
    for mid, seq, key, st, A, retries, _lb, _lease, _fin, payload in msgs:
        p = by_n[json.loads(payload)["n"]]
        F = fail_rows.get(mid, {})
        S = {a for a in range(1, A + 1) if any(r[0] == "succeeded" for r in run_rows.get((mid, a), []))}
        L = set(range(1, A + 1)) - set(F) - S
        bad = []
        if any(not 1 <= a <= A for a in F):
            bad.append(f"failure records outside 1..{A}: {sorted(F)}")
        if set(F) & S:
            bad.append(f"attempts both failed and succeeded: {sorted(set(F) & S)}")
        for a in range(1, A + 1):
            rr = run_rows.get((mid, a), [])
            if len(rr) > 1:
                bad.append(f"attempt {a} has {len(rr)} runs")
            if any(r[0] == "failed" for r in rr) and a not in F:
                bad.append(f"attempt {a}: a failed run without a failure record")
        if st == "delivered":
            if S != {A}:
                bad.append(f"delivered but succeeded attempts are {sorted(S)} of {A}")
            if any(a > retries for a in F):
                bad.append(f"delivered after a recorded failure past the retries: {sorted(F)}")
        elif st == "dead":
            if A not in F or A < retries + 1:
                bad.append(f"dead with attempts {A} and failures at {sorted(F)}")
            if not set(range(retries + 1, A)) <= L:
                bad.append(f"dead at attempt {A} but attempts {sorted(set(range(retries + 1, A)) - L)} "
                           f"past the retries were recorded")
            if S:
                bad.append(f"dead but attempt(s) {sorted(S)} succeeded")
        # every failure record is the handler's own: planned failure ("chaos") or the outage it met
        for a, (code, _at) in F.items():
            att = logged.get((mid, a))
            want = None if att is None else ("chaos" if att.outcome == "F" else att.x_code)
            if att is None or att.outcome not in ("F", "X"):
                bad.append(f"attempt {a} has failure {code!r} but its handler logged {att and att.outcome}")
            elif code != want:
                bad.append(f"attempt {a}: failure code {code!r}, handler logged {want!r}")
        for a in S:
            att = logged.get((mid, a))
            if att is None or att.outcome != "E":
                bad.append(f"attempt {a} succeeded but its handler logged {att and att.outcome}")
        # lost attempts must be explained
        for a in sorted(L):
            att = logged.get((mid, a))
            rr = run_rows.get((mid, a), [])
            if any(r[0] == "lease_lost" for r in rr):
                lost_kinds["lease lost (run lease_lost)"] += 1
            elif att is not None and att.worker in killed:
                lost_kinds["holder SIGKILLed"] += 1
            elif att is not None and att.worker in writers_killed:
                lost_kinds["holder's writer process SIGKILLed (its settle's reply lost)"] += 1
            elif att is not None and given_up.get((mid, a)) == att.worker:
                lost_kinds["holder stopped in an outage, its settle given up"] += 1
            elif (att is None or att.start is None) and (killed or writers_killed):
                lost_kinds["claimed, holder killed before the handler ran"] += 1
            elif (att is None or att.start is None) and obs.partitions:
                lost_kinds["claimed, the reply lost in a network partition"] += 1
            else:
                bad.append(f"attempt {a} is unaccounted for (handler {att and att.outcome}, worker "
                           f"{att and att.worker}, runs {rr})")
        dup_success_handlers += max(0, sum(1 for a in range(1, A + 1)
                                           if (x := logged.get((mid, a))) and x.outcome == "E") - 1)
        outage_failure = any(c != "chaos" for c, _ in F.values())
        if not L and not outage_failure and ns[p.n] == [mid]:
            clean += 1
            if p.fails <= retries:
                expected = ("delivered", p.fails + 1, p.fails)
            else:
                expected = ("dead", retries + 1, retries + 1)
            if (st, A, len(F)) == expected:
                clean_as_planned += 1
            else:
                bad.append(f"planned {p.fails} failures; ended {st} after {A} attempts with {len(F)} "
                           f"failures (expected {expected})")
        problems += [f"{mid} (n={p.n}, {st}, attempts {A}): {b}" for b in bad]
    problems += log_problems
    rep.figures.append(f"attempts {total_attempts}: failure records {sum(len(v) for v in fail_rows.values())}, "
                       f"succeeded {sum(1 for v in run_rows.values() for r in v if r[0] == 'succeeded')}, "
                       f"lost {sum(lost_kinds.values())} ("
                       + (", ".join(f"{k} {v}" for k, v in lost_kinds.items()) or "none") + ")"
                       + f"; {dup_success_handlers} handler returns beyond the first (at-least-once)")
    rep.check("attempts", not problems,
              f"failures + successes + explained lost = attempts for all {len(msgs)}; "
              f"{clean_as_planned}/{clean} untouched messages ended exactly as planned", problems)

    # ---------------------------------------------------------------- lease
    problems = []
    checked_pairs = unverifiable = mismatched = overlaps_ok = 0
    held = {(mid, a) for mid, v in fail_rows.items() for a in v} | \
           {k for k, v in run_rows.items() if any(r[0] == "succeeded" for r in v)}
    for a in logged.values():
        if a.lease is not None:
            a.claim = a.lease - lease_ms
        if a.row_mismatch:
            mismatched += 1
    for mid, seq, key, st, A, *_ in msgs:
        for n in range(1, A):
            prev, nxt = logged.get((mid, n)), logged.get((mid, n + 1))
            if prev is None or nxt is None:
                unverifiable += 1
                continue
            if (mid, n) in held:
                # n's failure was recorded (fenced: it still held the lease); n+1 may only start after
                # it. Compared by handler start: a claim statement reads the clock when it begins and
                # may take the message (re-checked once its row lock is free) after a concurrent settle
                # committed, so lease_expires_at - lease_ms can precede that commit by the statement's
                # run time, tens of ms on a loaded machine.
                bound, when, what = fail_rows[mid][n][1], nxt.start, "failure recorded"
            elif prev.lease is not None and nxt.claim is not None:
                # n lost its lease: the claim's own clock must be past it (a stale clock only delays)
                bound, when, what = prev.lease, nxt.claim, "lease expiry"
            else:
                unverifiable += 1
                continue
            checked_pairs += 1
            if when is None or when + TOL_MS < bound:
                problems.append(f"{mid}: attempt {n + 1} {'started' if what[0] == 'f' else 'claimed'} at {when}, "
                                f"before attempt {n} let go at {bound} ({what})")
            if prev.end is not None and nxt.start is not None and nxt.start < prev.end:
                overlaps_ok += 1
                if (mid, n) in held:
                    problems.append(f"{mid}: attempt {n} was still running when {n + 1} started, yet its "
                                    f"outcome was recorded")
    rep.check("lease", not problems,
              f"{checked_pairs} successive attempts checked (next claim >= previous lease expiry or "
              f"recorded end); {overlaps_ok} overlapping handlers were all lease-lost; {unverifiable} pairs "
              f"unverifiable (lease unread: restart or kill), {mismatched} handlers started after being "
              f"reclaimed", problems)
    check_lease_left(rep, cfg, logged)

    # ---------------------------------------------------------------- key order
    problems = []
    intervals_checked = 0
    keyed_msgs: dict[str, list[tuple]] = defaultdict(list)
    for m in msgs:
        if m[2] is not None:
            keyed_msgs[m[2]].append(m)
    for key, rows in keyed_msgs.items():
        order = [json.loads(r[9])["n"] for r in rows]
        if order != sorted(order):
            problems.append(f"key {key}: stored out of emit order")
        ivals = []
        for idx, (mid, seq, _k, st, A, *_rest) in enumerate(rows):
            for a in range(1, A + 1):
                att = logged.get((mid, a))
                if att is None or att.claim is None:
                    continue
                if (mid, a) in held:
                    end = att.end if att.end is not None else att.lease
                else:
                    end = att.lease
                ivals.append((idx, a, att.claim, end, mid, (mid, a) in held, att.start))
        # in emit order (seq), attempt by attempt, each hold must begin after the one before it ended:
        # that is both "never two holders of a key at once" and "in seq order"
        for (i1, a1, c1, e1, m1, held1, _s1), (i2, a2, c2, e2, m2, _h2, s2) in zip(ivals, ivals[1:]):
            intervals_checked += 1
            # after a recorded outcome the next holder starts after it; after a lost lease it is
            # claimed after the expiry (see the lease check for why not the claim after a settle)
            when = s2 if held1 else c2
            if when is None or when + TOL_MS < e1:
                problems.append(f"key {key}: {m2} (position {i2}) attempt {a2} {'started' if held1 else 'claimed'} "
                                f"at {when} while {m1} (position {i1}) attempt {a1} held until {e1}")
        for prev, cur in zip(rows, rows[1:]):
            first = min((x.claim for a in range(1, cur[4] + 1)
                         if (x := logged.get((cur[0], a))) and x.claim is not None), default=None)
            if first is not None and prev[8] is not None and first + TOL_MS < prev[8]:
                problems.append(f"key {key}: {cur[0]} claimed at {first} before {prev[0]} finished at {prev[8]}")
        succ = sorted((r[3], idx) for idx, row in enumerate(rows) for a in range(1, row[4] + 1)
                      for r in run_rows.get((row[0], a), []) if r[0] == "succeeded")
        idxs = [idx for _, idx in succ]
        if idxs != sorted(idxs):
            problems.append(f"key {key}: successful completions out of seq order")
    rep.check("key order", not problems,
              f"{len(keyed_msgs)} keys, {sum(len(v) for v in keyed_msgs.values())} messages: stored in emit "
              f"order, {intervals_checked} successive holds disjoint and in seq order, successes in order",
              problems)

    # ---------------------------------------------------------------- tape
    problems = []
    if not tape_meta:
        problems.append("no tape metadata")
        epoch, head, pruned = None, 0, 0
    else:
        epoch, head, pruned = tape_meta[0]
    seqs = [s for s, _ in tape]
    if pruned != 0:
        problems.append(f"pruned_through is {pruned}, nothing should be pruned")
    if seqs != list(range(1, head + 1)):
        holes = sorted(set(range(1, head + 1)) - set(seqs))
        problems.append(f"tape seqs are not 1..{head}: {len(seqs)} events, missing {holes[:10]}")
    if obs.tape_epochs != {epoch}:
        problems.append(f"epochs seen during the run {sorted(obs.tape_epochs)}, now {epoch}")
    if obs.tape_holes:
        problems.append(f"the follower saw holes: {obs.tape_holes[:5]}")
    if obs.tape_last != head:
        problems.append(f"the follower ended at {obs.tape_last}, head is {head}")
    events = {f"{epoch}.{s}": json.loads(pl) for s, pl in tape}
    logged_events = 0
    for att in logged.values():
        for eid in att.event_ids:
            logged_events += 1
            ev = events.get(eid)
            if ev is None:
                problems.append(f"event {eid} of {att.msg} attempt {att.n} is not on the tape")
            elif (ev["m"], ev["a"], ev["w"]) != (att.msg, att.n, att.worker):
                problems.append(f"event {eid} is {ev}, logged by {att.msg} attempt {att.n} {att.worker}")
    unlogged = unconfirmed = 0
    for eid, ev in events.items():
        att = logged.get((ev["m"], ev["a"]))
        if att is None or att.worker != ev["w"]:
            problems.append(f"event {eid} {ev} has no handler start behind it")
        elif eid in att.event_ids:
            continue
        elif att.outcome == "X" and att.x_code in UNCONFIRMED_APPEND_ERRORS:
            # The emit raised "the store did not confirm the append, so the event may not be stored":
            # the connection died between COMMIT and its reply (PostgreSQL killed by `-m immediate`
            # after the commit record was flushed). Stored is one of the two outcomes it announced.
            unconfirmed += 1
        else:
            unlogged += 1
            if ev["w"] not in killed:
                problems.append(f"event {eid} appended by {ev['w']} (not killed) but not logged "
                                f"(the attempt ended {att.outcome or 'never'})")
    rep.check("tape", not problems,
              f"seq 1..{head} contiguous in epoch {epoch}; {logged_events} logged appends all present, "
              f"{unlogged} appended by handlers killed before logging, {unconfirmed} stored though the emit "
              f"raised StoreUnavailable (commit unconfirmed); follower polled {obs.tape_polls}x, "
              f"saw {obs.tape_seen} events in order, {obs.tape_errors} polls met an outage", problems)

    # ---------------------------------------------------------------- console
    problems = list(obs.ops_regressions) + list(obs.cli_regressions)
    problems += [f"engine.ops.stats failed at {at:.1f} outside a restart: {err}" for at, err in obs.ops_failures
                 if not _in_outage(obs, at)]
    for at, rc, err in obs.cli_failures:
        if rc != 1 or not _in_outage(obs, at) or len(err.splitlines()) != 1:
            problems.append(f"okconsole stats exit {rc} at {at:.1f} ({len(err.splitlines())} lines; restarts "
                            f"{[(round(a, 1), round(b, 1)) for a, b, _ in obs.restarts]}): {err}")
    if obs.ops_reads == 0 or obs.cli_reads == 0:
        problems.append(f"too few console reads ({obs.ops_reads} ops, {obs.cli_reads} CLI)")
    rep.check("console", not problems,
              f"engine.ops.stats read {obs.ops_reads}x ({len(obs.ops_failures)} during restarts), "
              f"okconsole stats --json {obs.cli_reads}x ({len(obs.cli_failures)} exit 1 during restarts); "
              f"delivered+dead never went down", problems)

    # ---------------------------------------------------------------- workers
    problems = workers.unexpected() + workers.stop_problems + stop_problems + obs.restart_errors
    for path in sorted(root.glob("log-*")):
        lines = path.read_text(errors="replace").splitlines()
        # asyncpg's own pool warns with a traceback while it cannot reconnect: expected in a restart
        bad = [i for i, line in enumerate(lines) if line.startswith("Traceback")
               and not (i and lines[i - 1].startswith("Failed to restore the pool connection floor"))]
        if bad:
            problems.append(f"{path.name} logged a traceback: {lines[bad[0] - 1:bad[0]]} … "
                            f"{lines[min(bad[0] + 30, len(lines) - 1)]}")
    rep.check("workers", not problems,
              f"{len(workers.all)} incarnations, {len(workers.killed)} SIGKILLed, the rest stopped cleanly; "
              f"{len(obs.writer_kills)} SQLite writer processes SIGKILLed under a live worker; no tracebacks but asyncpg's reconnect warnings", problems)
    check_time_order(rep, cfg, plan, obs, logged, timed)
    if obs.pause_planned:
        check_pause(rep, obs, logged, created, paused_now)
    return rep


def check_lease_left(rep: Report, cfg: Config, logged: dict[tuple[str, int], Attempt]) -> None:
    """Every handler started with at least START_LEASE_SHARE of its lease left: the row's
    lease_expires_at (the store's clock) against the handler's start (this machine's wall clock,
    which the store shares here); attempts whose row read failed or named another holder are not
    counted."""
    need = cfg.lease_ms * START_LEASE_SHARE - cfg.link_ms
    lefts = sorted(((a.lease - a.start, a) for a in logged.values() if a.lease is not None and a.start is not None),
                   key=lambda la: la[0])
    problems = [f"attempt {a.n} of {a.msg} started by {a.worker} at {a.start} with {left} ms of its lease left"
                for left, a in lefts if left + TOL_MS < need]
    unread = sum(1 for a in logged.values() if a.start is not None and a.lease is None)
    link = f", less the link's {cfg.link_ms} ms" if cfg.link_ms else ""
    spread = (f"least {lefts[0][0]} ms, 1st percentile {lefts[len(lefts) // 100][0]} ms, "
              f"median {lefts[len(lefts) // 2][0]} ms") if lefts else "none measured"
    rep.check("lease left", bool(lefts) and not problems,
              f"{len(lefts)} handler starts measured, {len(problems)} with less than {START_LEASE_SHARE:.0%} of the "
              f"{cfg.lease_ms} ms lease left{link} ({spread}); {unread} not measured (row unread in a restart, or "
              f"reclaimed first)", problems)


def check_time_order(rep: Report, cfg: Config, plan: list[Planned], obs: Observed,
                     logged: dict[tuple[str, int], Attempt], timed: list[tuple]) -> None:
    """The delay / priority / dedupe invariants."""
    problems: list[str] = []
    by_n = {p.n: p for p in plan}
    plan_of: dict[str, Planned] = {}
    for mid, _run_at, priority, dedupe, payload in timed:
        p = plan_of[mid] = by_n[json.loads(payload)["n"]]
        if (priority, dedupe) != (p.priority, p.dedupe):
            problems.append(f"{mid} (n={p.n}): stored priority/dedupe {(priority, dedupe)}, "
                            f"emitted {(p.priority, p.dedupe)}")
    # run_at as each handler read it from the row when it started (a failure without back-off
    # clears it: due again at once), by the store's clock read in the same statement
    early = checked = 0
    for (mid, n), att in logged.items():
        p = plan_of.get(mid)
        if p is None or att.store_now is None:
            continue  # not a message of the plan, or the read met a restart
        if n == 1 and p.delay_ms and att.run_at is None:
            problems.append(f"{mid} (n={p.n}) was emitted with delay {p.delay_ms} ms but had no run_at")
        if att.run_at is None:
            continue
        checked += 1
        claim = None if att.lease is None else att.lease - cfg.lease_ms
        if att.store_now + TOL_MS < att.run_at or (claim is not None and claim + TOL_MS < att.run_at):
            early += 1
            problems.append(f"attempt {n} of {mid} started at {att.store_now} (claimed ~{claim}) "
                            f"before its run_at {att.run_at}")
    twins_ok = 0
    for p in plan:
        if p.dedupe is None or p.n not in obs.twins or p.n not in obs.confirmed:
            continue
        if obs.twins[p.n] == obs.confirmed[p.n]:
            twins_ok += 1
        elif not obs.uncertain[p.n]:
            problems.append(f"n={p.n}: the twin emits of dedupe {p.dedupe!r} returned "
                            f"{obs.confirmed[p.n]} and {obs.twins[p.n]}")
    problems += [f"dedupe key {d}" for d in obs.dedupe_doubles]
    delayed = sum(1 for p in plan if p.delay_ms)
    rep.check("time", not problems,
              f"{delayed} delayed, {sum(1 for p in plan if p.priority)} prioritised, "
              f"{sum(1 for p in plan if p.dedupe)} deduplicated; {checked} attempts of delayed messages "
              f"none before run_at ({early} early); {twins_ok} twin emits got one id; "
              f"{obs.dedupe_polls} dedupe polls saw no key held twice", problems)


PAUSE_GRACE_S = 1.0   # no process claims a paused signal from at most 1 s after the pause
CLAIM_SLACK_S = 0.3   # a claim sent just inside the grace, on the wire, and its handler's start


def check_pause(rep: Report, obs: Observed, logged: dict[tuple[str, int], Attempt], created: list[int],
                paused_now: list[str]) -> None:
    """While the jobs signal is paused no attempt starts (past the grace); emits are still stored."""
    problems: list[str] = []
    if len(obs.pauses) != obs.pause_planned:
        problems.append(f"{len(obs.pauses)} pause windows of {obs.pause_planned} planned")
    if JOBS in paused_now:
        problems.append(f"{JOBS} is still paused after the run")
    problems += [f"{what} at {at:.1f} outside a restart" for at, what in obs.pause_failures if not _in_outage(obs, at)]
    starts = [(att.start / 1000, att) for att in logged.values() if att.start is not None]
    in_grace = strict = stored = 0
    latest = 0.0  # the latest start into a pause, in its grace
    per_window = []
    for committed, issued, how in obs.pauses:
        strict_from = committed + PAUSE_GRACE_S + CLAIM_SLACK_S
        grace_here = sum(1 for t, _ in starts if committed <= t < strict_from)
        latest = max([latest] + [t - committed for t, _ in starts if committed <= t < strict_from])
        early = sorted(((t, att) for t, att in starts if strict_from <= t < issued), key=lambda s: s[0])
        problems += [f"attempt {att.n} of {att.msg} started at {t:.3f} by {att.worker}, {t - committed:.2f} s "
                     f"into the pause ({how}) committed at {committed:.3f}, resumed at {issued:.3f}"
                     + (f" (lease from {att.claim / 1000:.3f})" if att.claim is not None else "")
                     for t, att in early]
        stored_here = sum(1 for c in created if committed * 1000 <= c < issued * 1000)
        in_grace, strict, stored = in_grace + grace_here, strict + len(early), stored + stored_here
        per_window.append(f"{issued - committed:.1f} s {how}: {grace_here}+{len(early)} starts, {stored_here} emits")
    if obs.pauses and stored == 0:
        problems.append("no message was stored while the signal was paused")
    paused_s = sum(issued - committed for committed, issued, _ in obs.pauses)
    rep.check("pause", not problems,
              f"{len(obs.pauses)} windows, paused {paused_s:.1f} s in all ({'; '.join(per_window)}): "
              f"{in_grace} attempts started in the first {PAUSE_GRACE_S + CLAIM_SLACK_S:.1f} s (grace; the latest "
              f"{latest:.2f} s in), "
              f"{strict} after it; {stored} emits stored while paused; "
              f"{len(obs.pause_failures)} pause/resume calls failed in restarts and were made again; ends resumed",
              problems)


# --------------------------------------------------------------------------- the clock
# Every worker binds flow "chaos.clock" to clock.every(CLOCK_EVERY), so each worker emits every tick
# while SIGKILLs, clean stops, writer kills and PostgreSQL restarts go on around it.

CLOCK_EVERY, CLOCK_SIGNAL, CLOCK_MS = "1s", "clock.chaos.clock", 1000
CLOCK_MARGIN_S = 1.0  # a worker covers a tick from this long after it was ready to this long before it ended


def clock_cover(workers: Workers, obs: Observed) -> Callable[[float], bool]:
    """Whether some worker was up around a tick time (epoch s): ready at least CLOCK_MARGIN_S
    before it, not killed or asked to stop until CLOCK_MARGIN_S after it, and its SQLite writer process
    not SIGKILLed in the 3 s before it. A tick no worker covered may be skipped (as documented)."""
    spans = []
    asked_to_stop = {wid: at for at, wid in obs.clean_stops}  # it stops ticking when asked, not when it exits
    for wid in workers.all:
        ready = workers.dir / f"ready-{wid}"
        if ready.exists():
            end = workers.killed.get(wid) or asked_to_stop.get(wid) or workers.stopped.get(wid) or time.time()
            spans.append((wid, ready.stat().st_mtime, end))
    writer_kills = [(at, wid) for at, wid in obs.writer_kills]

    def covered(t: float) -> bool:
        return any(start + CLOCK_MARGIN_S <= t <= end - CLOCK_MARGIN_S
                   and not any(w == wid and t - 3 <= at <= t + CLOCK_MARGIN_S for at, w in writer_kills)
                   for wid, start, end in spans)

    return covered


async def check_clock(rep: Report, url: str, obs: Observed, workers: Workers) -> None:
    """clock: exactly one message per tick over the run (never two for one tick, keyed by the tick
    time), and no tick missing between the first and the last while a worker was up to emit it
    (see `clock_cover`), outside PostgreSQL outages."""
    rd = Plain(url)
    try:
        rows = await rd.rows("SELECT payload, dedupe FROM oke_messages WHERE signal = $1", CLOCK_SIGNAL)
    finally:
        await rd.close()
    ats = Counter(json.loads(payload)["at"] for payload, _ in rows)
    problems = [f"tick {at} stored {n} times" for at, n in sorted(ats.items()) if n > 1]
    problems += [f"message of tick {json.loads(p)['at']} has dedupe {d!r}" for p, d in rows
                 if d != str(json.loads(p)["at"])]
    covered = clock_cover(workers, obs)
    missing = [at for at in range(min(ats, default=0), max(ats, default=0), CLOCK_MS) if at not in ats]
    unexplained = [at for at in missing if covered(at / 1000) and not _in_outage(obs, at / 1000)]
    problems += [f"tick {at} missing while a worker was up" for at in unexplained]
    if not ats:
        problems.append("no tick was stored")
    rep.check("clock", not problems,
              f"{len(ats)} ticks, {len(rows)} messages (one each), {len(missing)} missed while no worker "
              "was up or in an outage", problems)


# --------------------------------------------------------------------------- flow limits

from chaos_workers.worker import CAPPED, CAPPED_CONCURRENCY, PACED, PACED_RATE  # noqa: E402

# A start is counted when its claim commits; the handler starts once the answer reached its worker
# and the loop ran it. Under this run's load that takes up to this long: the window check on the
# handlers' own start times allows it (docs/design/flow-limits.md).
LIMIT_HANDOVER_MS = 400


class LimitRun:
    """The flow-limit section: `chaos.capped` (concurrency 2) and `chaos.paced` (8 starts a second)
    messages emitted through the whole run, beside the jobs, under the same SIGKILLs, clean stops
    and PostgreSQL restart; then checked from the intervals the handlers logged (DIR/limits-<ID>):

      limits   every limited message delivered (held back, never failed); never more than 2
               `chaos.capped` handlers running at once (a handler SIGKILLed mid-run counts until
               its worker's kill); never more than 8 `chaos.paced` starts in any window of
               1 s less the hand-over allowance; and the limit was reached (else it checked nothing)
    """

    def __init__(self, cfg: Config) -> None:
        from engine import signal

        self.cfg = cfg  # declared after engine.reset() (run), as the jobs signal is
        self.capped = signal.once(CAPPED, concurrency=CAPPED_CONCURRENCY)
        self.paced = signal.once(PACED, rate=PACED_RATE)
        from engine.durations import parse_rate

        self.rate_count, self.window_ms = parse_rate(PACED_RATE) or (0, 0)
        self.ids: list[str] = []
        self.messages = max(30, cfg.messages // 20)  # capped ones

    async def emit(self, app: Any) -> None:
        """Capped messages in bursts of 6 spread over the emission, so the limit, not the emits,
        keeps them to 2 at once; paced ones in two bursts of three windows' worth each (at a
        quarter and at three quarters of it). An emit that raised (an outage) is made again (its
        first may be stored too: every stored one is checked)."""
        bursts = self.messages // 6
        gap = self.cfg.emit_s / bursts
        paced_at = {bursts // 4, bursts * 3 // 4}
        for b in range(bursts):
            for n in range(6):
                await self._emit(app, self.capped, b * 6 + n)
            if b in paced_at:
                for m in range(self.rate_count * 3):
                    await self._emit(app, self.paced, m)
            await asyncio.sleep(gap)

    async def _emit(self, app: Any, target: Any, n: int) -> None:
        while True:
            try:
                self.ids.append(await app.emit(target, {"n": n}))
                return
            except Exception as err:
                if not is_outage(err):
                    raise
                await asyncio.sleep(0.2)

    async def drained(self, url: str, deadline_s: float) -> str:
        reader = Plain(url)
        deadline, state = time.monotonic() + deadline_s, ""
        try:
            while time.monotonic() < deadline:
                try:
                    rows = await reader.rows("SELECT status, count(*) FROM oke_messages WHERE signal IN ($1, $2) "
                                             "GROUP BY status", CAPPED, PACED)
                except Exception as err:
                    state = f"({type(err).__name__})"
                    await asyncio.sleep(0.5)
                    continue
                counts = dict(rows)
                state = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                if not counts.get("pending") and not counts.get("inflight"):
                    return ""
                await asyncio.sleep(0.25)
            return state
        finally:
            await reader.close()

    def intervals(self, root: Path, killed: dict[str, float]) -> dict[str, list[tuple[int, int]]]:
        """Per signal, (start, end) of every handler run; one SIGKILLed mid-run ends at the kill."""
        starts: dict[tuple[str, str], tuple[str, str, int]] = {}
        out: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for path in sorted(root.glob("limits-*")):
            for line in path.read_text(errors="replace").splitlines():
                kind, name, msg, attempt, worker, at = line.split(" ")
                if kind == "L":
                    starts[(msg, attempt)] = (name, worker, int(at))
                else:
                    name, _worker, started = starts.pop((msg, attempt))
                    out[name].append((started, int(at)))
        for name, worker, started in starts.values():
            out[name].append((started, int(killed.get(worker, time.time()) * 1000)))
        return out

    async def check(self, rep: Report, url: str, root: Path, workers: Workers, not_drained: str) -> None:
        rd = Plain(url)
        try:
            rows = await rd.rows("SELECT id, status FROM oke_messages WHERE signal IN ($1, $2)", CAPPED, PACED)
        finally:
            await rd.close()
        runs = self.intervals(root, workers.killed)
        problems = [f"{mid} ended {st}" for mid, st in rows if st != "delivered"]
        problems += [f"emitted {mid} is not stored" for mid in set(self.ids) - {r[0] for r in rows}]
        if not_drained:
            problems.append(f"not drained: {not_drained}")
        capped = most_at_once(runs[CAPPED])
        if capped != CAPPED_CONCURRENCY:
            problems.append(f"{CAPPED}: at most {capped} running at once, the limit is {CAPPED_CONCURRENCY}")
        starts = sorted(start for start, _ in runs[PACED])
        paced = most_in_window(starts, self.window_ms - LIMIT_HANDOVER_MS)
        if paced > self.rate_count or most_in_window(starts, self.window_ms) < self.rate_count:
            problems.append(f"{PACED}: {paced} starts within {self.window_ms - LIMIT_HANDOVER_MS} ms "
                            f"(the rate is {PACED_RATE})")
        rep.check("limits", not problems,
                  f"{len(rows)} limited messages delivered; {CAPPED} at most {capped} at once "
                  f"(limit {CAPPED_CONCURRENCY}), {PACED} at most {paced} starts in "
                  f"{self.window_ms - LIMIT_HANDOVER_MS} ms ({PACED_RATE}) over {len(starts)} starts", problems)


# --------------------------------------------------------------------------- main

async def run(cfg: Config, keep: bool) -> bool:
    import engine
    from engine import oke, signal

    root = Path(tempfile.mkdtemp(prefix=f"oke-chaos-{cfg.backend}-"))
    pg = None
    workers: Workers | None = None
    started = time.monotonic()
    title = (f"chaos {'short' if cfg.short else 'full'} / {'PostgreSQL' if cfg.backend == 'pg' else 'SQLite'}: "
             f"{cfg.workers} workers x {cfg.concurrency}, {cfg.messages} messages, lease {cfg.lease_ms} ms, "
             f"slow {cfg.slow_ms} ms, retries {cfg.retries}, seed {cfg.seed}"
             + (f", CPU starved ({os.cpu_count()} busy loops)" if cfg.starve else ""))
    print(f"-- {title}\n   work dir {root}", flush=True)
    starver = Starver()
    ok = False
    try:
        if cfg.backend == "pg":
            from pgcluster import PgCluster
            pg = PgCluster(use_env=False)  # our own server: we restart it
            await asyncio.to_thread(pg.start)
            url = await asyncio.to_thread(pg.create_database, "oke_chaos")
        else:
            url = f"sqlite+aiosqlite:///{root / 'chaos.db'}"
        plan = make_plan(cfg)
        engine.reset()
        jobs = signal.once(JOBS, retries=cfg.retries, dead_letter=True)
        signal.live(TAPE, optional=True)
        obs = Observed()
        workers = Workers(cfg, url, root)
        limited = LimitRun(cfg)
        # the first worker creates the schema, then the rest start
        workers.start(0)
        await workers.ready()
        for slot in range(1, cfg.workers):
            workers.start(slot)
        await workers.ready()
        print(f"   {cfg.workers} workers up after {time.monotonic() - started:.1f} s; emitting", flush=True)
        if cfg.starve:
            starver.start()

        app = oke("chaos-driver", database_url=url, bindings=[])
        async with app:
            stop_chaos, stop_readers = asyncio.Event(), asyncio.Event()
            progress = asyncio.Event()
            readers = [asyncio.create_task(tape_follower(url, obs, stop_readers)),
                       asyncio.create_task(ops_reader(app, obs, stop_readers)),
                       asyncio.create_task(cli_reader(url, cfg, obs, stop_readers)),
                       asyncio.create_task(dedupe_watcher(url, obs, stop_readers))]
            chaos = [asyncio.create_task(killer(workers, cfg, obs, stop_chaos)),
                     asyncio.create_task(pauser(app, url, cfg, obs))]
            if cfg.backend == "sqlite":
                chaos.append(asyncio.create_task(writer_killer(workers, cfg, obs, stop_chaos)))
            if pg is not None:
                chaos.append(asyncio.create_task(restarter(pg, cfg, obs, progress)))
            emitting = asyncio.create_task(emitter(app, jobs, cfg, plan, obs, progress))
            limit_emits = asyncio.create_task(limited.emit(app))
            while not emitting.done():
                await asyncio.wait([emitting], timeout=5)
                print(f"   {time.monotonic() - started:5.0f} s  emitted {len(obs.confirmed)}/{cfg.messages}, "
                      f"kills {len(obs.kills)}, restarts {len(obs.restarts)}, tape {obs.tape_last}", flush=True)
                if not emitting.done():
                    workers.check_alive()
            await emitting
            # the chaos goes on for a while after the last emit, then every slot is up for the drain
            await asyncio.sleep(cfg.emit_s * 0.25)
            stop_chaos.set()
            progress.set()
            await asyncio.gather(*chaos)  # every restart was reached during the emission
            drained, state = await wait_drained(url, cfg, workers, cfg.drain_timeout_s)
            obs.drained = time.time()
            await limit_emits
            limits_left = await limited.drained(url, cfg.drain_timeout_s / 3)
            print(f"   {time.monotonic() - started:5.0f} s  {'drained' if drained else 'NOT DRAINED'}: {state}",
                  flush=True)
            # A lease-lost holder may still be running its handler (and appending to the tape) after
            # the drain: stop the workers first, so the follower's last poll sees the final head.
            stop_problems = await workers.stop()
            starver.stop()  # the run is over: the checks need no starving
            await asyncio.sleep(0.3)  # the follower catches the last appends
            stop_readers.set()
            await asyncio.gather(*readers)
        rep = await verify(url, cfg, plan, obs, workers, stop_problems, root)
        await check_clock(rep, url, obs, workers)
        await limited.check(rep, url, root, workers, limits_left)
        if not drained:
            rep.check("drain", False, f"not drained within {cfg.drain_timeout_s:.0f} s: {state}")
        rep.figures.insert(0, f"elapsed {time.monotonic() - started:.1f} s")
        rep.print(title)
        ok = rep.passed
        if not ok:
            print(workers.logs(1500)[-6000:])
    except WorkerDied as err:
        print(f"\n== {title}\n   RESULT: FAIL: {err}", flush=True)
    finally:
        starver.stop()
        if workers is not None:
            workers.kill_all()
        if pg is not None:
            await asyncio.to_thread(pg.stop)
        if ok and not keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"   kept {root}", flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", action="store_true", help="PostgreSQL (a private server), 4 workers")
    parser.add_argument("--sqlite", action="store_true", help="one SQLite file, 2 workers")
    parser.add_argument("--short", action="store_true", help="the small CI form")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--starve", action="store_true", help="a busy loop on every core beside the run")
    parser.add_argument("--restarts", default=None,
                        help='PostgreSQL restarts, e.g. "0.3:fast,0.6:immediate,0.8:down:5"')
    args = parser.parse_args(argv)
    backends = [b for b, on in (("pg", args.pg), ("sqlite", args.sqlite)) if on] or ["pg", "sqlite"]
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    results = {}
    for backend in backends:
        cfg = profile(backend, args.short, seed)
        if args.messages:
            cfg = replace(cfg, messages=args.messages)
        if args.starve:
            cfg = replace(cfg, starve=True)
        if args.restarts is not None:
            cfg = replace(cfg, pg_restarts=tuple((float(r.split(":", 1)[0]), r.split(":", 1)[1])
                                                 for r in args.restarts.split(",") if r))
        results[backend] = asyncio.run(run(cfg, args.keep))
    print("\n" + "  ".join(f"{b}: {'PASS' if ok else 'FAIL'}" for b, ok in results.items()), flush=True)
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
