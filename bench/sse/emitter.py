"""`app.emit` at a fixed rate from its own process, on the store the server reads (cross-process path).

    python bench/sse/emitter.py --db URL --rate R --duration S

The server learns of each append the way any other process's appends reach it: the SQLite WAL
file changing (polled every 20 ms by the hub) or NOTIFY on PostgreSQL. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

from _util import die_with_parent, emit_at_rate, payload, say  # noqa: E402
from engine_server import declare  # noqa: E402


async def main(args: argparse.Namespace) -> None:
    from engine import oke

    sig = declare()  # the emitter declares the exposure too, else emit() refuses (OKE1240)
    async with oke("sse-bench-emitter", database_url=args.db) as app:
        say(ready=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
        say(**await emit_at_rate(lambda i: app.emit(sig, payload(i)), args.rate, args.duration))
        # stay until told, so the orchestrator can read this process's CPU after the drain
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


if __name__ == "__main__":
    die_with_parent()
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--duration", type=float, required=True)
    asyncio.run(main(parser.parse_args()))
