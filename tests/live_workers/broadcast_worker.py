"""A worker process: `python broadcast_worker.py DB_URL LOG_FILE` runs the catalog's two broadcast
flows until SIGTERM, appending one JSON line per handler call to LOG_FILE."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

from apps import declare_catalog

from engine import oke


async def main(url: str, log_path: str) -> None:
    log = open(log_path, "a", buffering=1)

    def record(flow: str, payload: dict, attempt: int) -> None:
        log.write(json.dumps({"flow": flow, "n": payload["n"], "attempt": attempt, "pid": os.getpid()}) + "\n")

    declare_catalog(record)
    app = oke("catalog-worker", database_url=url)
    async with app:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: loop.create_task(app.stop()))
        print("ready", flush=True)
        await app.run(concurrency=4)
    log.close()
    print("stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
