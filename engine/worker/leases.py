"""A handler gets its lease: it starts with at least START_LEASE_SHARE of `lease_ms` left.

The docs state the lease from the handler's start: a lease a tenth longer than the slowest
handler is enough. A message claimed ahead runs on a lease that began at its claim, and it may wait
for a handler slot meanwhile (much longer when the machine is short of CPU): one that started
halfway through its lease was taken over by another worker while its handler still ran. So a
message that waited longer than the margin is renewed before its handler starts (claim_ahead.py),
and one that starts right away after its claim pays nothing for this.

The worker judges it by its own monotonic clock, never by the store's: a lease counts from just
before the claim (or renewal) that took it was sent, which is never later than the store's own
start of that lease, so the handler has at least what the worker reckons. (A message an emit
hands to an idle pool counts from what the store says is left of it when it is read: handoff.py.)
"""

from __future__ import annotations

START_LEASE_SHARE = 0.9
# A renewal that itself took longer than the margin leaves less than START_LEASE_SHARE: it is made
# again, at most this many times in all (a store that slow delays the handler no longer).
START_RENEWALS = 3


def start_by(leased_at: float, lease_ms: int) -> float:
    """The latest monotonic time a message leased at `leased_at` (taken before the claim or renewal
    was sent) starts on that lease; later, less than START_LEASE_SHARE of it is left."""
    return leased_at + lease_ms * (1 - START_LEASE_SHARE) / 1000
