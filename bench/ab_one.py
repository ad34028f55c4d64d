"""One once-throughput run of the engine found at ENGINE_ROOT (bench/ab.py starts one per run).

    ab_one.py ENGINE_ROOT sqlite|pg MESSAGES HANDLERS [ADMIN_DSN DATA_DIR]

Prints one line `ROW {json}`: the fields of engine_runs.sqlite_single / pg_single.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

root, store, n, handlers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(1, str(BENCH.parent / "tests"))
sys.path.insert(0, root)

import engine  # noqa: E402

assert engine.__file__.startswith(root), f"imported {engine.__file__}, not the engine under {root}"

from engine_runs import pg_single, sqlite_single  # noqa: E402

if store == "sqlite":
    with tempfile.TemporaryDirectory() as workdir:
        row = asyncio.run(sqlite_single(workdir, n, handlers))
else:
    from pgcluster import PgCluster

    cluster = PgCluster(external_dsn=sys.argv[5])
    cluster.data_dir = sys.argv[6]
    row = asyncio.run(pg_single(cluster, n, handlers))
print("ROW " + json.dumps(row))
