"""Fill a store with a realistic history of N messages, fast, consistent with engine/store/schema.py.

Shape (same fractions at every size, deterministic for a given N and seed):

* 4 once signals, recorded in oke_signals as an app's boot would: orders.placed 40 %,
  tasks.email 30 % (keyed by address), tasks.sms 20 %, billing.charge 10 % (keyed by customer).
* seq follows created_at (emit order) over the last 7 days. The newest 4 % are the backlog:
  the oldest 0.1 % of them are inflight (leased by one of 4 workers), the rest pending.
* 0.3 % are dead (3,000 at a million), scattered over the older history, 60 % of them
  tasks.email; each has retries+1 failure rows and as many failed runs. tasks.email has at least
  DLQ_PAGE_MIN dead letters at every size, so the console's dead-letter page holds a full page
  (200 rows) at 1,000 messages as at 1,000,000: the two times then differ by the store's size only,
  not by how many rows the page draws.
* 1 % of the delivered messages succeeded on their 2nd attempt (one failure row, two runs),
  5 % of the pending backlog waits for a retry (attempts 1, one failure row, one failed run).
* Every other attempt has its run row (succeeded), so oke_runs grows with the store as it does live.

Rows go in through sqlite3 executemany on a connection of the fill's own (SQLite), or through
asyncpg COPY (PostgreSQL), in batches; `build_search_index` then fills the text index in bulk. Nothing runs ANALYZE on SQLite (it flips the claim plan);
on PostgreSQL the caller runs VACUUM ANALYZE afterwards, as autovacuum would.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from engine.ids import base32
from engine.store import schema

DAY_MS = 86_400_000
BATCH = 50_000
WORKERS = [f"bench-host:{4000 + i}:w{i}" for i in range(4)]

# name, share of messages, retries, keyed-by, flow, share of the dead letters, failure reasons
SIGNALS = [
    ("orders.placed", 0.40, 2, None, "workers.orders", 0.20,
     [("STOCK_OUT", "item out of stock"), ("TIMEOUT", "inventory service timed out after 5s")]),
    ("tasks.email", 0.30, 3, "email", "workers.email", 0.60,
     [("SMTP_550", "550 mailbox unavailable"), ("SMTP_421", "421 too many connections, try later"),
      ("REFUSED", "recipient refused the message"), ("TIMEOUT", "smtp relay timed out after 10s")]),
    ("tasks.sms", 0.20, 1, None, "workers.sms", 0.10,
     [("CARRIER", "carrier rejected: invalid number"), ("RATE", "provider rate limit")]),
    ("billing.charge", 0.10, 5, "customer", "workers.billing", 0.10,
     [("CARD_DECLINED", "card declined"), ("GATEWAY_502", "payment gateway returned 502")]),
]
STATUSES = ("pending", "inflight", "delivered", "dead")
BACKLOG = 0.04
INFLIGHT = 0.001
DEAD = 0.003
DLQ_PAGE_MIN = 250  # > the console's page of 200 (okconsole/screens/dlq.py LIMIT)
RETRIED_DELIVERED = 0.01
RETRYING_PENDING = 0.05


@dataclass
class Expected:
    """What the fill wrote: counts per signal and status, and the dead letters' count."""
    n: int
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: int = 0
    runs: int = 0
    seconds: float = 0.0
    index_seconds: float = 0.0  # filling the text index behind search, in bulk

    def dead(self, signal: str) -> int:
        return self.counts[signal]["dead"]


def plan(n: int, seed: int = 7) -> tuple[list[int], list[str], Expected]:
    """Per message index: signal index and status (index order is seq order)."""
    rng = random.Random(seed)
    weights = [s[1] for s in SIGNALS]
    sig = rng.choices(range(len(SIGNALS)), weights=weights, k=n)
    status = ["delivered"] * n
    backlog = max(1, round(n * BACKLOG))
    inflight = max(1, round(n * INFLIGHT))
    start = n - backlog
    for i in range(start, n):
        status[i] = "inflight" if i < start + inflight else "pending"
    # Dead letters: per signal a fixed share of round(n * DEAD), placed on that signal's older messages.
    total_dead = max(1, round(n * DEAD))
    older: dict[int, list[int]] = {k: [] for k in range(len(SIGNALS))}
    for i in range(start):
        older[sig[i]].append(i)
    for k, spec in enumerate(SIGNALS):
        want = min(len(older[k]), round(total_dead * spec[5]))
        if spec[0] == "tasks.email":
            want = max(want, min(len(older[k]), DLQ_PAGE_MIN))
        for i in rng.sample(older[k], want):
            status[i] = "dead"
    exp = Expected(n=n, counts={s[0]: dict.fromkeys(STATUSES, 0) for s in SIGNALS})
    for i in range(n):
        exp.counts[SIGNALS[sig[i]][0]][status[i]] += 1
    return sig, status, exp


def generate(n: int, seed: int = 7, now: int | None = None) -> Iterator[tuple[list[dict], list[dict], list[dict]]]:
    """Batches of (messages, failures, runs) rows as dicts keyed by column name."""
    sig, status, _exp = plan(n, seed)
    rng = random.Random(seed + 1)
    now = now or int(time.time() * 1000)
    t0 = now - 7 * DAY_MS
    step = max(1, (7 * DAY_MS - 60_000) // max(1, n))
    msgs: list[dict] = []
    fails: list[dict] = []
    runs: list[dict] = []
    run_no = 0
    for i in range(n):
        name, _share, retries, keyed, flow, _dshare, reasons = SIGNALS[sig[i]]
        st = status[i]
        created = t0 + i * step
        mid = f"msg_{base32(created, 10)}{base32(i, 16)}"
        if keyed == "email":
            bounce = st == "dead"
            key = f"user{rng.randrange(50_000)}@{'bounce.test' if bounce else 'example.com'}"
            payload = {"to": key, "template": "receipt", "n": i}
        elif keyed == "customer":
            key = f"cust_{rng.randrange(20_000)}"
            payload = {"customer": key, "amount_cents": rng.randrange(100, 100_000), "n": i}
        else:
            key = None
            payload = {"order": f"o{i}", "items": rng.randrange(1, 9), "n": i}
        # attempts and their outcomes: list of failed attempts, then whether one succeeded
        if st == "dead":
            failed, ok = retries + 1, False
        elif st == "delivered":
            failed, ok = (1 if rng.random() < RETRIED_DELIVERED else 0), True
        elif st == "pending":
            failed, ok = (1 if rng.random() < RETRYING_PENDING else 0), False
        else:  # inflight: currently running attempt 1 (or a retry)
            failed, ok = (1 if rng.random() < RETRYING_PENDING else 0), False
        attempts = failed + (1 if ok else 0) + (1 if st == "inflight" else 0)
        at = created + 50
        for a in range(1, failed + 1):
            code, text = reasons[rng.randrange(len(reasons))]
            run_no += 1
            run_id = f"run_{base32(at, 10)}{base32(run_no, 16)}"
            fails.append({"message_id": mid, "attempt": a, "code": code, "message": text, "at": at + 40,
                          "run_id": run_id, "kind": "failure", "traceback": TRACEBACK + text})
            runs.append({"run_id": run_id, "flow": flow, "trigger": name, "signal": name, "message_id": mid,
                         "parent_run_id": None, "status": "failed", "attempt": a,
                         "worker_id": WORKERS[run_no % 4], "started_at": at, "ended_at": at + 40,
                         "error": f"{code}: {text}"})
            at += 1000 * a
        if ok:
            run_no += 1
            runs.append({"run_id": f"run_{base32(at, 10)}{base32(run_no, 16)}", "flow": flow, "trigger": name,
                         "signal": name, "message_id": mid, "parent_run_id": None, "status": "succeeded",
                         "attempt": attempts, "worker_id": WORKERS[run_no % 4], "started_at": at,
                         "ended_at": at + 20, "error": None})
        finished = at + 40 if st in ("delivered", "dead") else None
        inflight = st == "inflight"
        msgs.append({"id": mid, "signal": name, "queue": name, "flow": flow, "key": key,
                     "payload": json.dumps(payload, separators=(",", ":")), "status": st,
                     "attempts": attempts, "retries": retries, "dead_letter": True,
                     "locked_by": WORKERS[i % 4] if inflight else None,
                     "lease_expires_at": now + 30_000 if inflight else None,
                     "created_at": created, "updated_at": finished or (now if inflight else at),
                     "finished_at": finished, "parent_run_id": None, "replays": 0})
        if len(msgs) >= BATCH:
            yield msgs, fails, runs
            msgs, fails, runs = [], [], []
    if msgs or fails or runs:
        yield msgs, fails, runs


def signal_rows(now: int) -> list[dict]:
    return [{"name": s[0], "kind": "once", "retries": s[2], "dead_letter": True, "optional": False,
             "retention": None, "description": f"bench signal {s[0]}", "app": "bench", "updated_at": now}
            for s in SIGNALS]


def binding_rows(now: int) -> list[dict]:
    return [{"signal": s[0], "flow": s[4], "kind": "once", "updated_at": now} for s in SIGNALS]


MSG_COLS = [c.name for c in schema.messages.columns if c.name != "seq"]
# Columns the fill leaves at their default (COPY writes every column it names).
MSG_DEFAULTS = {"priority": 0}
# what a failure keeps of its handler's traceback: a few frames, as a real one would (the column
# is read by `show` only, but its size is on every failure row the lists walk past)
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/shop/flows/email.py", line 41, in send_email\n    await smtp.send(mail)\n'
    '  File "/srv/shop/smtp.py", line 88, in send\n    raise MailError(reply)\n'
    "MailError: "
)
FAIL_COLS = [c.name for c in schema.failures.columns if c.name != "id"]
RUN_COLS = [c.name for c in schema.runs.columns]


async def fill(store: Any, url: str, n: int, seed: int = 7, log: Any = print) -> Expected:
    """Write the history into an open, empty store; returns what was written."""
    started = time.perf_counter()
    now = int(time.time() * 1000)
    _sig, _status, exp = plan(n, seed)

    def meta(conn: Any) -> None:
        conn.execute(schema.signals.insert(), signal_rows(now))
        conn.execute(schema.bindings.insert(), binding_rows(now))
    await store.write(meta)

    if store.dialect == "postgresql":
        import asyncpg

        from engine.store.postgres.store import asyncpg_dsn
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            for msgs, fails, runs in generate(n, seed, now):
                async with conn.transaction():
                    await conn.copy_records_to_table(
                        "oke_messages", columns=MSG_COLS,
                        records=[tuple(r.get(c, MSG_DEFAULTS.get(c)) for c in MSG_COLS) for r in msgs])
                    await conn.copy_records_to_table(
                        "oke_failures", columns=FAIL_COLS,
                        records=[tuple(r[c] for c in FAIL_COLS) for r in fails])
                    await conn.copy_records_to_table(
                        "oke_runs", columns=RUN_COLS, records=[tuple(r[c] for c in RUN_COLS) for r in runs])
                exp.failures += len(fails)
                exp.runs += len(runs)
            t = time.perf_counter()
            await conn.execute("VACUUM ANALYZE")  # what autovacuum would have done by now
            log(f"    VACUUM ANALYZE {time.perf_counter() - t:.1f}s")
        finally:
            await conn.close()
    else:
        _fill_sqlite(url, n, seed, now, exp)
    exp.seconds = time.perf_counter() - started
    return exp


def _fill_sqlite(url: str, n: int, seed: int, now: int, exp: Expected) -> None:
    """Bulk inserts on a connection of our own (plain sqlite3 executemany of tuples, one
    transaction a batch): at 10,000,000 rows SQLAlchemy's per-row work would dominate the fill."""
    import sqlite3

    def insert(table: str, cols: list[str]) -> str:
        return f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"

    conn = sqlite3.connect(url.split(":///", 1)[1], timeout=60, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")  # a bench fill: a crash means filling again
        for msgs, fails, runs in generate(n, seed, now):
            conn.execute("BEGIN")
            conn.executemany(insert("oke_messages", MSG_COLS),
                             [tuple(r.get(c, MSG_DEFAULTS.get(c)) for c in MSG_COLS) for r in msgs])
            conn.executemany(insert("oke_failures", FAIL_COLS), [tuple(r[c] for c in FAIL_COLS) for r in fails])
            conn.executemany(insert("oke_runs", RUN_COLS), [tuple(r[c] for c in RUN_COLS) for r in runs])
            conn.execute("COMMIT")
            exp.failures += len(fails)
            exp.runs += len(runs)
    finally:
        conn.close()


BUILD_BATCH = 250_000


async def build_search_index(store: Any, url: str) -> float:
    """Fill the store's text index as the background pass would, in bulk: large batches, and on
    PostgreSQL the GIN index dropped first and built once at the end. Returns the seconds taken."""
    from sqlalchemy import text

    from engine.store import search_index

    started = time.perf_counter()
    postgres = store.dialect == "postgresql"
    gin = f"{search_index.PG_TABLE}_doc"
    if postgres:
        await store.write(lambda conn: conn.execute(text(f"DROP INDEX IF EXISTS {gin}")))
    seq, failure_id, _xmin, _xmax = await store.read(search_index.newest)  # no other writer: all final
    while (await store.write(lambda conn: search_index.index_batch(conn, seq, failure_id, BUILD_BATCH))).more:
        pass
    if postgres:  # minutes at 10M rows: on a connection of its own, past the store's statement timeout
        import asyncpg

        from engine.store.postgres.pooler import asyncpg_dsn
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            await conn.execute("SET maintenance_work_mem = '512MB'")
            await conn.execute(f"CREATE INDEX {gin} ON {search_index.PG_TABLE} USING gin (doc gin_trgm_ops)",
                               timeout=None)
            await conn.execute(f"ANALYZE {search_index.PG_TABLE}", timeout=None)
        finally:
            await conn.close()
    return time.perf_counter() - started
