"""An app that names its store in code (here from PINNED_DB, as a config file would)."""
from __future__ import annotations

import os

from engine import flow, oke, on, signal

jobs = signal.once("pinned.jobs", retries=0)


@on(jobs)
@flow("pinned.work")
async def work(payload, fx):
    return None


app = oke("pinned", database_url=os.environ["PINNED_DB"])
