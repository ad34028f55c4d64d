"""An app process for the shared-clock tests.

    python tests/workers/clock_app.py --url URL --dir DIR --id ID [--every 1s]

Binds flow "ticks.rec" to clock.every(EVERY), boots on URL, writes DIR/ready-<ID> and runs until
DIR/stop exists (or it is killed). Its handler appends "<at> <message id> <ID>" to DIR/handled,
one os.write per line with O_APPEND, so lines from several processes never interleave.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine import clock, flow, oke, on  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--id", required=True)
    parser.add_argument("--every", default="1s")
    args = parser.parse_args()
    fd = os.open(args.dir / "handled", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @on(clock.every(args.every))
    @flow("ticks.rec")
    async def record(tick, fx):
        os.write(fd, f"{tick['at']} {fx.message_id} {args.id}\n".encode())

    async with oke("clocked", database_url=args.url, worker_id=f"clock-{args.id}") as app:
        running = asyncio.create_task(app.run(concurrency=2))
        (args.dir / f"ready-{args.id}").touch()
        while not (args.dir / "stop").exists() and not running.done():
            await asyncio.sleep(0.05)
        await app.stop()
        await running


if __name__ == "__main__":
    asyncio.run(main())
