#!/usr/bin/env python
"""Several hosts, one PostgreSQL, a bad network: the chaos run's invariants across a partition.

    python bench/netfaults.py            the long form (12,000 messages, a 25 s partition)
    python bench/netfaults.py --short    the CI form tests/test_network_faults.py runs (~60 s)
    --seed N, --keep (keep the work directory)                          needs root, iproute2, iptables

It builds its own hosts: network namespaces `okn<pid>-pg` (PostgreSQL, on 10.77.<i>.1) and
`okn<pid>-w<i>` (one worker process each, on 10.77.<i>.2), one veth pair per worker. Addresses
exist only inside those namespaces and nothing is routed out of them; this process (emitter,
console readers, verification) reaches the server through its Unix socket. While thousands of keyed
and unkeyed messages are emitted, worker 1 is cut off from PostgreSQL (iptables DROP both ways in
its namespace: a silent partition, no reset) for longer than several leases, and worker 2's link
gets latency and loss (tc netem; where the kernel has no netem, a slow tbf link and iptables random
drops); then both heal. Every namespace (with its links and rules) is removed at the end, on failure
too.

Checked: every invariant of bench/chaos.py (none lost, one holder per live lease, so the cut-off
worker's late outcomes are fenced out, per-key order, console, no worker died), and

  partition  the cut-off worker's emits (a probe every 200 ms) that ended inside the
             partition raised StoreUnavailable (after the store's command timeout); after the heal its emits
             succeed again, and it ran handlers again, by itself: same process, no restart
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chaos  # noqa: E402  (bench/chaos.py: the workers, the emitter, the readers, the checks)

from engine.store.postgres.store import COMMAND_TIMEOUT_S  # noqa: E402

NET = "10.77"  # a private range used only on the veths this run creates inside its namespaces


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


class Net:
    """The namespaces, veth pairs and faults of one run; `teardown` removes them all."""

    def __init__(self, hosts: int) -> None:
        self.tag = f"okn{os.getpid()}"
        self.pg = f"{self.tag}-pg"
        self.hosts = [f"{self.tag}-w{i}" for i in range(1, hosts + 1)]
        self.made: list[str] = []

    def pg_addr(self, i: int) -> str:
        return f"{NET}.{i}.1"

    def build(self) -> None:
        for ns in (self.pg, *self.hosts):
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", ns, "link", "set", "dev", "lo", "up")
        for i, ns in enumerate(self.hosts, 1):
            sh("ip", "-n", self.pg, "link", "add", "name", f"p{i}", "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            sh("ip", "-n", self.pg, "addr", "add", f"{self.pg_addr(i)}/24", "dev", f"p{i}")
            sh("ip", "-n", ns, "addr", "add", f"{NET}.{i}.2/24", "dev", "eth0")
            sh("ip", "-n", self.pg, "link", "set", "dev", f"p{i}", "up")
            sh("ip", "-n", ns, "link", "set", "dev", "eth0", "up")

    def _iptables(self, i: int, op: str, *rule: str) -> None:
        ns, peer = self.hosts[i - 1], self.pg_addr(i)
        sh("ip", "netns", "exec", ns, "iptables", op, "OUTPUT", "-d", peer, *rule)
        sh("ip", "netns", "exec", ns, "iptables", op, "INPUT", "-s", peer, *rule)

    def cut(self, i: int) -> None:
        self._iptables(i, "-I", "-j", "DROP")

    def heal_cut(self, i: int) -> None:
        self._iptables(i, "-D", "-j", "DROP")

    def degrade(self, i: int) -> str:
        """Latency and loss both ways on host i's link; says which way it was done."""
        ends = (("ip", "netns", "exec", self.hosts[i - 1]), "eth0"), (("ip", "netns", "exec", self.pg), f"p{i}")
        netem = [sh(*ex, "tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "40ms", "10ms",
                    "loss", "2%", check=False).returncode == 0 for ex, dev in ends]
        if all(netem):
            return "netem delay 40±10 ms, loss 2% each way"
        for (ex, dev), ok in zip(ends, netem):
            if ok:
                sh(*ex, "tc", "qdisc", "del", "dev", dev, "root")
            sh(*ex, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", "2mbit", "burst", "4kb",
               "latency", "300ms")
        self._iptables(i, "-I", "-m", "statistic", "--mode", "random", "--probability", "0.02", "-j", "DROP")
        self.fallback = True
        return "no netem in this kernel: tbf 2 Mbit/s (queueing up to 300 ms), 2% random drops each way"

    def heal_degrade(self, i: int) -> None:
        for ex, dev in ((("ip", "netns", "exec", self.hosts[i - 1]), "eth0"),
                        (("ip", "netns", "exec", self.pg), f"p{i}")):
            sh(*ex, "tc", "qdisc", "del", "dev", dev, "root", check=False)
        if getattr(self, "fallback", False):
            self._iptables(i, "-D", "-m", "statistic", "--mode", "random", "--probability", "0.02", "-j", "DROP")

    def teardown(self) -> None:
        """Kill what still runs in our namespaces (our own processes), then delete them."""
        for ns in reversed(self.made):
            pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (OSError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check=False)
        self.made.clear()


class NetWorkers(chaos.Workers):
    """Worker slot s runs in host namespace s+1 and reaches PostgreSQL over its own link."""

    def __init__(self, cfg: chaos.Config, net: Net, pg_port: int, db: str, root: Path) -> None:
        super().__init__(cfg, "", root)
        self.net, self.pg_port, self.db = net, pg_port, db

    def prefix(self, slot: int) -> list[str]:
        return ["ip", "netns", "exec", self.net.hosts[slot]]

    def url_of(self, slot: int) -> str:
        return f"postgresql+asyncpg://postgres@{self.net.pg_addr(slot + 1)}:{self.pg_port}/{self.db}"

    def extra_args(self, slot: int) -> list[str]:
        return ["--probe-ms", "200"]


@dataclass
class Faults:
    cut_at: float       # share of the messages emitted when the cut begins
    cut_s: float
    degrade_at: float
    degrade_s: float


# One answer on the degraded link: netem's 40±10 ms plus a lost packet's retransmission (Linux waits
# at least 200 ms), or the tbf fallback's queue (up to 300 ms): time that passes between the store
# setting a lease and the worker hearing of it, which no renewal gives back.
LINK_MS = 300


def profile(short: bool, seed: int) -> tuple[chaos.Config, Faults]:
    never = (1e9, 1e9)  # no SIGKILLs here: the network is the fault
    if short:
        # The cut ends with about half of the emits still to come: under load the healed worker's
        # reconnect takes a few seconds, and the check needs it to run handlers after it.
        return (chaos.Config("pg", True, workers=3, messages=2500, keys=24, keyed_share=0.6, concurrency=4,
                             slow_share=0.01, tape_share=0.3, emit_s=36, kill_every=never, drain_timeout_s=60,
                             cli_every_s=3.0, seed=seed, link_ms=LINK_MS),
                Faults(cut_at=0.08, cut_s=COMMAND_TIMEOUT_S + 6, degrade_at=0.2, degrade_s=12))
    return (chaos.Config("pg", False, workers=3, messages=12_000, keys=50, keyed_share=0.6, concurrency=4,
                         tape_share=0.25, emit_s=90, kill_every=never, drain_timeout_s=200, seed=seed,
                         link_ms=LINK_MS),
            Faults(cut_at=0.2, cut_s=25, degrade_at=0.3, degrade_s=40))


async def at_share(share: float, cfg: chaos.Config, obs: chaos.Observed, progress: asyncio.Event) -> None:
    while len(obs.confirmed) < share * cfg.messages:
        progress.clear()
        await progress.wait()


async def faulter(net: Net, workers: NetWorkers, cfg: chaos.Config, faults: Faults, obs: chaos.Observed,
                  progress: asyncio.Event, notes: list[str]) -> None:
    async def cut() -> None:
        await at_share(faults.cut_at, cfg, obs, progress)
        wid = workers.current[0][0]
        net.cut(1)
        t0 = time.time()  # from here on no packet passes
        await asyncio.sleep(faults.cut_s)
        net.heal_cut(1)
        obs.partitions.append((t0, time.time(), wid))

    async def degrade() -> None:
        await at_share(faults.degrade_at, cfg, obs, progress)
        t0 = time.time()
        notes.append(net.degrade(2))
        await asyncio.sleep(faults.degrade_s)
        net.heal_degrade(2)
        notes.append(f"worker 2 degraded {time.time() - t0:.1f} s")

    await asyncio.gather(cut(), degrade())


def check_partition(rep: chaos.Report, obs: chaos.Observed, workers: NetWorkers, root: Path) -> None:
    problems: list[str] = []
    summary = "no partition happened"
    for start, end, wid in obs.partitions:
        probes = []
        for line in (root / f"probe-{wid}").read_text().splitlines():
            _p, began, ended, result = line.split(" ")
            probes.append((int(began) / 1000, int(ended) / 1000, result))
        # ended while cut off (one begun just before the cut hangs too, and counts)
        inside = [p for p in probes if start + 0.2 <= p[1] <= end]
        after = [p for p in probes if p[0] >= end]
        late = [p for p in after if p[0] >= end + COMMAND_TIMEOUT_S + 5]
        if not inside:
            problems.append(f"{wid}: no probe emit ended inside the partition")
        problems += [f"{wid}: an emit begun {p[0] - start:.1f} s into the partition ended {p[2]}"
                     for p in inside if p[2] != "StoreUnavailable"]
        if not any(p[2] == "ok" for p in after):
            problems.append(f"{wid}: no emit succeeded after the heal")
        problems += [f"{wid}: an emit {p[0] - end:.1f} s after the heal ended {p[2]}" for p in late if p[2] != "ok"]
        first_ok = min((p[1] for p in after if p[2] == "ok"), default=None)
        handled_after = sum(1 for line in (root / f"events-{wid}").read_text().splitlines()
                            if line.startswith("S ") and int(line.split(" ")[4]) / 1000 > end)
        if handled_after == 0:
            problems.append(f"{wid}: ran no handler after the heal")
        if wid in workers.killed or workers.all[wid].poll() not in (None, 0):
            problems.append(f"{wid}: was restarted or died")
        summary = (f"{wid} cut off {end - start:.1f} s: {len(inside)} emits inside all StoreUnavailable, "
                   f"first emit ok {0 if first_ok is None else first_ok - end:.1f} s after the heal, "
                   f"{handled_after} handlers run after it by the same process")
    rep.check("partition", bool(obs.partitions) and not problems, summary, problems)


async def run(cfg: chaos.Config, faults: Faults, keep: bool) -> bool:
    import engine
    from engine import oke, signal
    from pgcluster import PgCluster

    root = Path(tempfile.mkdtemp(prefix="oke-netfaults-"))
    net = Net(cfg.workers)
    pg = None
    workers: NetWorkers | None = None
    started = time.monotonic()
    title = (f"network faults {'short' if cfg.short else 'full'} / PostgreSQL in a namespace: {cfg.workers} "
             f"hosts x {cfg.concurrency}, {cfg.messages} messages, lease {cfg.lease_ms} ms, cut {faults.cut_s:.0f} s, "
             f"degraded {faults.degrade_s:.0f} s, seed {cfg.seed}")
    print(f"-- {title}\n   work dir {root}", flush=True)
    ok = False
    notes: list[str] = []
    try:
        net.build()
        listen = ",".join(net.pg_addr(i) for i in range(1, cfg.workers + 1))
        pg = PgCluster(use_env=False, netns=net.pg, settings={"listen_addresses": listen})
        await asyncio.to_thread(pg.start)
        url = await asyncio.to_thread(pg.create_database, "oke_net")
        plan = chaos.make_plan(cfg)
        engine.reset()
        jobs = signal.once(chaos.JOBS, retries=cfg.retries, dead_letter=True)
        signal.live(chaos.TAPE, optional=True)
        obs = chaos.Observed()
        workers = NetWorkers(cfg, net, pg.port, "oke_net", root)
        workers.start(0)
        await workers.ready()
        for slot in range(1, cfg.workers):
            workers.start(slot)
        await workers.ready()
        print(f"   {cfg.workers} workers up after {time.monotonic() - started:.1f} s; emitting", flush=True)
        async with oke("netfaults-driver", database_url=url, bindings=[]) as app:
            stop_readers, progress = asyncio.Event(), asyncio.Event()
            readers = [asyncio.create_task(chaos.tape_follower(url, obs, stop_readers)),
                       asyncio.create_task(chaos.ops_reader(app, obs, stop_readers)),
                       asyncio.create_task(chaos.cli_reader(url, cfg, obs, stop_readers))]
            faulting = asyncio.create_task(faulter(net, workers, cfg, faults, obs, progress, notes))
            emitting = asyncio.create_task(chaos.emitter(app, jobs, cfg, plan, obs, progress))
            while not emitting.done():
                await asyncio.wait([emitting], timeout=5)
                print(f"   {time.monotonic() - started:5.0f} s  emitted {len(obs.confirmed)}/{cfg.messages}, "
                      f"partitions {len(obs.partitions)}, tape {obs.tape_last}", flush=True)
                if not emitting.done():
                    workers.check_alive()
            await emitting
            progress.set()
            await faulting
            drained, state = await chaos.wait_drained(url, cfg, workers, cfg.drain_timeout_s)
            obs.drained = time.time()
            print(f"   {time.monotonic() - started:5.0f} s  {'drained' if drained else 'NOT DRAINED'}: {state}",
                  flush=True)
            stop_problems = await workers.stop()
            await asyncio.sleep(0.3)
            stop_readers.set()
            await asyncio.gather(*readers)
        rep = await chaos.verify(url, cfg, plan, obs, workers, stop_problems, root)
        check_partition(rep, obs, workers, root)
        if not drained:
            rep.check("drain", False, f"not drained within {cfg.drain_timeout_s:.0f} s: {state}")
        rep.figures.insert(0, f"elapsed {time.monotonic() - started:.1f} s")
        rep.figures += [f"network: {n}" for n in notes]
        rep.print(title)
        ok = rep.passed
        if not ok:
            print(workers.logs(1500)[-6000:])
    except chaos.WorkerDied as err:
        print(f"\n== {title}\n   RESULT: FAIL: {err}", flush=True)
    finally:
        if workers is not None:
            workers.kill_all()
        if pg is not None:
            await asyncio.to_thread(pg.stop)
        net.teardown()
        if ok and not keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"   kept {root}", flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="the small CI form")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    cfg, faults = profile(args.short, seed)
    return 0 if asyncio.run(run(cfg, faults, args.keep)) else 1


if __name__ == "__main__":
    sys.exit(main())
