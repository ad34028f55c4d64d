"""An app that leaves its store to the environment: `oke(...)` without a database_url."""
from __future__ import annotations

from engine import flow, oke, on, signal

jobs = signal.once("plain.jobs", retries=0)


@on(jobs)
@flow("plain.work")
async def work(payload, fx):
    return None


app = oke("plain")
