"""Several hosts, one PostgreSQL, a bad network (bench/netfaults.py --short).

The script builds its own network namespaces (PostgreSQL in one, a worker process in each of three
others, one veth pair each, 10.77.x.y only inside them), cuts worker 1 off for longer than several
leases (iptables DROP), slows and drops packets on worker 2's link (tc), heals both, and checks the
chaos run's invariants plus the partition's own (emits inside it raise StoreUnavailable, succeed
after it, the same worker process resumes). It removes its namespaces even when it fails. Needs
root, iproute2 and iptables: skipped locally without them, never with CI=true (.ci/run installs them).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgcluster import find_bin_dir
from rootkit import require_root, sh

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.postgres
@pytest.mark.timeout(150)
@pytest.mark.long
def test_partition_latency_and_loss_across_three_worker_hosts():
    require_root("ip", "iptables", "tc")
    if find_bin_dir() is None:
        require_root("initdb")  # fails under CI=true, skips locally
    before = set(sh("ip", "netns", "list").stdout.split())
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "netfaults.py"), "--short"], cwd=str(REPO),
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=140)
    print(proc.stdout[proc.stdout.find("== network"):] if "== network" in proc.stdout else proc.stdout)
    left = {n for n in set(sh("ip", "netns", "list").stdout.split()) - before if n.startswith("okn")}
    assert not left, f"namespaces left behind: {left}"
    assert proc.returncode == 0 and "RESULT: PASS" in proc.stdout, \
        f"network-fault run failed (exit {proc.returncode})\n{proc.stdout[-12000:]}\n{proc.stderr[-4000:]}"
