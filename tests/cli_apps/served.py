"""An app as a user would write it: module-level declarations and `app = oke(...)` from env."""
from __future__ import annotations

import os

from engine import flow, http, oke, on, signal

status = signal.live("order-status")
jobs = signal.once("jobs.run", retries=0)
on(http.live(status).public())


@on(jobs)
@flow("workers.jobs")
async def run_job(payload, fx):
    await fx.emit(status, {"job": payload["n"], "status": "done"})


app = oke("served", database_url=os.environ["OKE_DATABASE_URL"])
