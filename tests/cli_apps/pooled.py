"""An app behind PgBouncer as a user would write it: the database URL from env, and listen_url (a
direct PostgreSQL URL for LISTEN) from env when the deployment has one (tests/test_pgbouncer.py)."""

from __future__ import annotations

import os

from engine import flow, http, oke, on, signal

status = signal.live("pooled.status")
jobs = signal.once("pooled.jobs", retries=1)
on(http.live(status).public())


@on(jobs)
@flow("pooled.workers")
async def run_job(payload, fx):
    await fx.emit(status, {"job": payload["n"], "status": "done"})


_listen = os.environ.get("OKE_TEST_LISTEN_URL")
app = oke("pooled", database_url=os.environ["OKE_DATABASE_URL"], **({"listen_url": _listen} if _listen else {}))
