"""The worker pool: claim a batch, run each flow, settle outcomes in group commits.

Claim lanes keep up to `concurrency` handlers running. Finished attempts queue
for a settler task per lane, each writing whatever has accumulated in a single
transaction, so under load many acks share one commit. Database outages are
retried with back-off; nothing is settled twice and nothing is left half-written:
a message whose outcome was never written stays inflight and is reclaimed after
its lease.

A worker claims ahead: besides the messages running it may hold as many more as its handlers are
expected to finish while one claim is on the wire (at most six times `concurrency`, and the
store's `claim_rows_max` per claim lane), in claims of up to eight times `concurrency` (and
`claim_rows_max`). On PostgreSQL (two lanes, each its own
connection) a slot that frees then finds its next message already here instead of waiting a round
trip; on SQLite (one lane: its claims queue on one writer anyway) a claim cycle carries more
messages for its transaction and its fsync. Slow handlers claim ahead by little or nothing.

A pool is a few objects, each the one owner of its state, wired by `pool.py`; one module each:

- `claiming.py`: the claimer: claim lanes, the rows claims in flight asked for, outage back-off,
  waiting for work, and how a drain knows it is done;
- `claim_ahead.py`: how much a claim asks for, and the line of claimed messages waiting for a slot
  with the renewals of their leases;
- `leases.py`: how much of its lease a handler starts with (a long wait is renewed first);
- `running.py`: the runner: the handler slots and one attempt of a message (`invoking.py` calls
  the handler within its timeout, `turns.py` runs a batch in turn, `failures.py` names a failure);
- `settling.py`: the settler, and the outcomes it lends to a claim's transaction;
- `handoff.py`: an idle pool's offer to emits (PostgreSQL), and running what they hand it;
- `pausing.py`: the pause watcher: which queues a claim may take from;
- `worker_store.py`: the store calls the worker makes (`WorkerStore`), and no others;
- `pool.py`: `WorkerPool`: wires the parts, and `run`, start to stop.
"""

from ..failures import failure_code, failure_message
from .averages import EWMA_WEIGHT
from .claim_ahead import AHEAD_LEASE_SHARE
from .leases import START_LEASE_SHARE
from .pool import WorkerPool
from .route import Route
from .waiting import IDLE_POLL_S, MAX_BACKOFF_S

__all__ = [
    "AHEAD_LEASE_SHARE",
    "EWMA_WEIGHT",
    "IDLE_POLL_S",
    "MAX_BACKOFF_S",
    "Route",
    "START_LEASE_SHARE",
    "WorkerPool",
    "failure_code",
    "failure_message",
]
