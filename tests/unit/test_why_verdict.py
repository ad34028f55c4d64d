"""`okconsole why`'s decision (engine/ops/verdict.py): every verdict from a snapshot built by hand, and
which one wins when several hold. No store: the snapshot is what the store read would return."""

from __future__ import annotations

import dataclasses

import pytest

from engine.ops.records import Failure
from engine.ops.verdict import Head, Holder, Pause, Snapshot, decide, span
from hostilekit import HOSTILE_ERROR, HOSTILE_KEY, assert_inert

NOW = 1_700_000_000_000
TIMEOUT = Failure(code="TimeoutError", message="smtp did not answer in 30 s", at=NOW - 5_000, attempt=4)


def pending(**changes) -> Snapshot:
    """A due pending message with a worker bound and seen 10 s ago: nothing holds it."""
    base = Snapshot(
        id="msg_a",
        signal="jobs",
        status="pending",
        attempts=0,
        created_at=NOW - 3_000,
        updated_at=NOW - 3_000,
        now=NOW,
        bound_seen_ago_ms=10_000,
    )
    return dataclasses.replace(base, **changes)


def inflight(holder: Holder | None, lease_left_ms: int = 20_000, **changes) -> Snapshot:
    return pending(
        status="inflight",
        attempts=1,
        updated_at=NOW - 2_000,
        lease_expires_at=NOW + lease_left_ms,
        holder=holder,
        **changes,
    )


LIVE = Holder("w-3", host="box", pid=42, last_seen=NOW - 2_000)
GONE = Holder("w-9", host="box", pid=7, last_seen=NOW - 45_000)
HEAD = Head("msg_head", "pending", 4, TIMEOUT)
PAUSE = Pause(paused_at=NOW - 60_000, actor="ana", reason="smtp down")


def test_a_delivered_message_says_when_and_since_is_its_finish():
    why = decide(pending(status="delivered", attempts=2, finished_at=NOW - 1_000))
    assert (why.verdict, why.since) == ("delivered", NOW - 1_000)
    assert "attempt 2" in why.detail


def test_a_dead_letter_names_its_last_failure_and_the_replay():
    why = decide(pending(status="dead", attempts=4, finished_at=NOW - 1_000, last_failure=TIMEOUT))
    assert why.verdict == "dead"
    assert why.detail == (
        "dead after 4 attempts, last: TimeoutError: smtp did not answer in 30 s; "
        "okconsole replay jobs msg_a requeues it"
    )


def test_a_cancelled_message_is_dead_and_says_it_was_cancelled_and_why():
    cancelled = Failure(code="Cancelled", message="duplicate order", at=NOW, attempt=0)
    why = decide(pending(status="dead", finished_at=NOW, last_failure=cancelled))
    assert why.verdict == "dead"
    assert why.detail.startswith("cancelled by an operator (duplicate order) at ")


def test_running_names_the_worker_where_it_runs_when_it_was_seen_and_the_lease():
    why = decide(inflight(LIVE))
    assert (why.verdict, why.since) == ("running", NOW - 2_000)
    assert why.detail.startswith("held by worker w-3 (box:42), seen 2 s ago; lease until ")
    assert why.detail.endswith("(attempt 1)")


def test_a_holder_not_seen_for_30_s_is_orphaned_reclaimable_when_its_lease_ends():
    why = decide(inflight(GONE, lease_left_ms=25_000))
    assert (why.verdict, why.since) == ("orphaned", NOW - 45_000)
    assert "worker w-9 (box:7), seen 45 s ago" in why.detail
    assert why.detail.endswith("(in 25 s)") and "reclaimable at " in why.detail


@pytest.mark.parametrize(
    "holder", [Holder("ghost"), dataclasses.replace(LIVE, stopped_at=NOW - 1_000)], ids=["no record", "stopped"]
)
def test_a_holder_with_no_record_or_a_clean_stop_is_orphaned(holder):
    assert decide(inflight(holder)).verdict == "orphaned"


def test_an_expired_lease_of_a_live_holder_is_due_taken_over_by_the_next_claim():
    why = decide(inflight(LIVE, lease_left_ms=-4_000))
    assert why.verdict == "due"
    assert why.detail.startswith("its lease expired 4 s ago; held by worker w-3")


def test_due_says_how_long_and_that_it_waits_for_a_worker():
    why = decide(pending())
    assert (why.verdict, why.since) == ("due", NOW - 3_000)
    assert why.detail == "due for 3 s; waiting for a free worker"


def test_not_due_says_until_when_and_whether_it_is_a_delay_or_a_back_off():
    delayed = decide(pending(run_at=NOW + 90_000))
    assert delayed.verdict == "not_due"
    assert "(in 1 min 30 s): a delay; okconsole retry jobs msg_a makes it due now" in delayed.detail
    backoff = decide(pending(run_at=NOW + 5_000, attempts=4, last_failure=TIMEOUT))
    assert "a back-off after attempt 4 (last: TimeoutError: smtp did not answer in 30 s)" in backoff.detail


def test_blocked_by_key_names_the_head_its_status_attempts_and_last_failure():
    why = decide(pending(key="k1", head=HEAD))
    assert why.verdict == "blocked_by_key"
    assert why.detail == (
        "waits behind msg_head (pending, 4 failed attempts, last: TimeoutError: smtp did not answer"
        " in 30 s), the head of key 'k1': okconsole why msg_head"
    )


def test_paused_names_who_why_and_the_resume():
    why = decide(pending(pause=PAUSE))
    assert (why.verdict, why.since) == ("paused", NOW - 60_000)
    assert why.detail.startswith("signal jobs paused by ana: smtp down at ")
    assert why.detail.endswith("okconsole resume jobs lets it run")


@pytest.mark.parametrize("seen", [None, 5 * 60_000 + 1])
def test_no_process_bound_seen_in_5_min_is_no_worker(seen):
    why = decide(pending(bound_seen_ago_ms=seen))
    assert why.verdict == "no_worker"
    assert why.detail.startswith("no process bound to jobs seen in the last 5 min")
    assert decide(pending(bound_seen_ago_ms=5 * 60_000 - 1)).verdict == "due"


@pytest.mark.parametrize(
    ("snapshot", "verdict", "also"),
    [
        (
            pending(pause=PAUSE, key="k1", head=HEAD, bound_seen_ago_ms=None, run_at=NOW + 9_000),
            "paused",
            "no_worker, blocked_by_key, not_due",
        ),
        (pending(key="k1", head=HEAD, bound_seen_ago_ms=None), "no_worker", "blocked_by_key"),
        (pending(key="k1", head=HEAD, run_at=NOW + 9_000), "blocked_by_key", "not_due"),
        (inflight(GONE, pause=PAUSE), "orphaned", "paused"),
    ],
    ids=["paused first", "no_worker before blocked", "blocked before not_due", "orphaned before paused"],
)
def test_the_first_reason_wins_and_the_detail_names_the_others(snapshot, verdict, also):
    why = decide(snapshot)
    assert why.verdict == verdict
    assert why.detail.endswith(f"(also: {also})")


def test_a_running_handler_of_a_paused_signal_is_running():
    assert decide(inflight(LIVE, pause=PAUSE)).verdict == "running"


def test_hostile_stored_text_in_the_detail_is_inert_and_on_one_line():
    hostile = Failure(code=HOSTILE_ERROR, message=HOSTILE_ERROR + "\nline two", at=NOW, attempt=1)
    snapshots = [
        pending(key=HOSTILE_KEY, head=Head("msg_head", "pending", 1, hostile)),
        pending(pause=Pause(NOW, HOSTILE_ERROR, HOSTILE_ERROR)),
        inflight(Holder(HOSTILE_KEY, host=HOSTILE_ERROR, pid=1, last_seen=NOW)),
        pending(status="dead", last_failure=hostile),
    ]
    for snapshot in snapshots:
        detail = decide(snapshot).detail
        assert_inert(detail)
        assert "\n" not in detail


def test_span_reads_as_a_person_says_it():
    assert [span(ms) for ms in (850, 12_400, 245_000, 11_520_000, 187_200_000)] == [
        "850 ms",
        "12 s",
        "4 min 5 s",
        "3 h 12 min",
        "2 d 4 h",
    ]
