"""An emitter process for the concurrent dedupe test.

    python tests/workers/dedupe_emitter.py --url URL --dir DIR --id ID --emits N

Boots an app that declares the optional once signal "reports" (nobody consumes it), writes
DIR/ready-<ID>, waits for DIR/go, then emits N messages with dedupe="report:1" as fast as it can
and writes the ids it got back, one a line, to DIR/ids-<ID>. With --dedupe-for D it emits
--rounds times, 20 ms apart, each emit holding the key for D after its message finished (while
the test's worker delivers what was stored meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine import oke, signal  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--id", required=True)
    parser.add_argument("--emits", type=int, default=20)
    parser.add_argument("--dedupe-for", default=None)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    reports = signal.once("reports", optional=True)
    async with oke(f"emitter-{args.id}", database_url=args.url) as app:
        (args.dir / f"ready-{args.id}").touch()
        while not (args.dir / "go").exists():
            await asyncio.sleep(0.005)
        ids: list[str] = []
        for round_ in range(args.rounds):
            if round_:
                await asyncio.sleep(0.02)
            ids += await asyncio.gather(
                *(app.emit(reports, {"n": n}, dedupe="report:1", dedupe_for=args.dedupe_for) for n in range(args.emits))
            )
    (args.dir / f"ids-{args.id}").write_text("\n".join(ids) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
