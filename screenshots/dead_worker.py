"""A worker for the workers screenshot: it takes one message and hangs in its handler until
screenshots/make.py SIGKILLs it, leaving a lease whose holder no longer beats (orphaned).

    python screenshots/dead_worker.py URL READY_FILE
"""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import flow, oke, signal  # noqa: E402
from engine.flows import Binding  # noqa: E402


async def main(url: str, ready: Path) -> None:
    nightly = signal.once("reports.nightly", description="The nightly sales report")

    async def build(payload: object, fx: object) -> None:
        ready.write_text("held")
        await asyncio.sleep(3600)  # killed here

    app = oke("reports", database_url=url, lease_ms=600_000, bindings=[Binding(nightly, flow("reports.build", do=build))])
    async with app:
        await app.emit(nightly, {"day": "2026-11-30"})
        await app.run(concurrency=2)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
