"""Fill a fresh tape with N events the fast way: `live.append` in batches inside `store.write`.

    python bench/sse/fill.py --db URL --events 100000 --batch 1000

Prints {"epoch": ..., "head": ..., "fill_s": ...}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

from _util import die_with_parent, payload, say  # noqa: E402
from engine_server import declare  # noqa: E402


async def main(args: argparse.Namespace) -> None:
    from engine import oke
    from engine.live import tape as live

    sig = declare()
    async with oke("sse-bench-fill", database_url=args.db) as app:
        store = app.store
        assert store is not None
        started = time.perf_counter()
        first_id = last_id = ""
        for start in range(0, args.events, args.batch):
            texts = [json.dumps(payload(i), separators=(",", ":"))
                     for i in range(start, min(start + args.batch, args.events))]
            ids = await store.write(lambda c, texts=texts: live.append(c, sig, texts, None))
            first_id = first_id or ids[0]
            last_id = ids[-1]
        fill_s = time.perf_counter() - started
    epoch, _, head = last_id.partition(".")
    say(epoch=epoch, head=int(head), first_id=first_id, fill_s=fill_s)


if __name__ == "__main__":
    die_with_parent()
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    asyncio.run(main(parser.parse_args()))
