"""An app that binds one flow to a once signal, boots, and exits (cross-process binding tests).

    python tests/workers/bound_app.py URL SIGNAL FLOW

Boot's log (WARNING and up) goes to stderr, so a test reads what an operator's log would say.
"""
from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine import flow, oke, on, signal  # noqa: E402


async def handle(payload: object, fx: object) -> None:
    return None


async def main(url: str, signal_name: str, flow_name: str) -> None:
    on(signal.once(signal_name, description=f"work for {flow_name}"), flow(flow_name, do=handle))
    async with oke("bound", database_url=url):
        print("booted", flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(main(*sys.argv[1:4]))
