"""once: delivery physics in one process, on SQLite and PostgreSQL.

Every test runs a real app on a real database (`db_url`) and asserts on the stored rows.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import json
import threading

import pytest
from pydantic import BaseModel, ConfigDict, EmailStr, Field, TypeAdapter

from engine import OkeError, flow, oke, on, signal
from engine.ids import now_ms
from engine.store import Claimed, Outcome
from workers.db import fetch, scalar, table_counts


class Email(BaseModel):
    to: EmailStr
    body: str


class PaymentDeclined(Exception):
    code = "E_DECLINED"


class IntCoded(Exception):
    code = 402


async def _row(url: str, msg_id: str) -> dict:
    rows = await fetch(url, "SELECT status, attempts, locked_by, lease_expires_at, key, payload, "
                            "parent_run_id, finished_at FROM oke_messages WHERE id = $1", msg_id)
    assert len(rows) == 1, f"expected one row for {msg_id}, got {rows}"
    names = ("status", "attempts", "locked_by", "lease_expires_at", "key", "payload", "parent_run_id",
             "finished_at")
    return dict(zip(names, rows[0]))


async def _failures(url: str, msg_id: str) -> list[tuple]:
    return await fetch(url, "SELECT attempt, code, message, at FROM oke_failures WHERE message_id = $1 "
                            "ORDER BY id", msg_id)


# --------------------------------------------------------------------------- retries and dead letters

@pytest.mark.parametrize("retries", [0, 2])
async def test_exhausted_message_is_dead_after_retries_plus_one_calls(db_url, retries):
    jobs = signal.once("jobs", retries=retries)
    calls: list[int] = []

    @on(jobs)
    @flow("workers.jobs")
    async def handler(payload, fx):
        calls.append(fx.attempt)
        raise PaymentDeclined(f"card declined on attempt {fx.attempt}")

    t0 = now_ms()
    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs, {"n": 1}, key="usr_1")
        await app.drain()
    t1 = now_ms()

    assert calls == list(range(1, retries + 2))
    row = await _row(db_url, msg_id)
    assert row["status"] == "dead"
    assert row["attempts"] == retries + 1
    assert row["locked_by"] is None and row["lease_expires_at"] is None
    failures = await _failures(db_url, msg_id)
    assert [(a, c, m) for a, c, m, _ in failures] == [
        (n, "E_DECLINED", f"card declined on attempt {n}") for n in range(1, retries + 2)]
    assert all(t0 <= at <= t1 for *_, at in failures)
    assert [at for *_, at in failures] == sorted(at for *_, at in failures)


@pytest.mark.parametrize("exc, code", [
    (PaymentDeclined("no"), "E_DECLINED"),
    (IntCoded("no"), "IntCoded"),          # a code that is not a string is ignored
    (ZeroDivisionError("no"), "ZeroDivisionError"),
    (KeyError("no"), "KeyError"),
])
async def test_failure_code_is_the_string_code_attribute_else_the_class_name(db_url, exc, code):
    jobs = signal.once("jobs", retries=0)

    @on(jobs)
    @flow("workers.jobs")
    async def handler(payload, fx):
        raise exc

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs)
        await app.drain()
    [(attempt, got_code, message, _at)] = await _failures(db_url, msg_id)
    assert (attempt, got_code, message) == (1, code, str(exc))


async def test_dead_letter_false_ends_delivered_with_its_failures_kept(db_url):
    jobs = signal.once("jobs", retries=1, dead_letter=False)
    calls = []

    @on(jobs)
    @flow("workers.jobs")
    def handler(payload, fx):
        calls.append(fx.attempt)
        raise RuntimeError("always")

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs, [1, 2, 3])
        await app.drain()
    assert calls == [1, 2]
    row = await _row(db_url, msg_id)
    assert (row["status"], row["attempts"]) == ("delivered", 2)
    assert row["finished_at"] is not None
    assert [(a, c) for a, c, *_ in await _failures(db_url, msg_id)] == [(1, "RuntimeError"), (2, "RuntimeError")]
    assert await scalar(db_url, "SELECT count(*) FROM oke_messages WHERE status = 'dead'") == 0


async def test_a_retry_that_succeeds_is_delivered_with_its_history(db_url):
    jobs = signal.once("jobs", retries=3)

    @on(jobs)
    @flow("workers.jobs")
    async def handler(payload, fx):
        if fx.attempt == 1:
            raise ValueError("flaky")

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs, {"a": 1})
        await app.drain()
    row = await _row(db_url, msg_id)
    assert (row["status"], row["attempts"]) == ("delivered", 2)
    assert [(a, c, m) for a, c, m, _ in await _failures(db_url, msg_id)] == [(1, "ValueError", "flaky")]
    runs = await fetch(db_url, "SELECT attempt, status, flow, signal, error FROM oke_runs "
                               "WHERE message_id = $1 ORDER BY attempt", msg_id)
    assert runs == [(1, "failed", "workers.jobs", "jobs", "ValueError: flaky"),
                    (2, "succeeded", "workers.jobs", "jobs", None)]


async def test_failed_attempt_is_pending_again_at_once(db_url):
    """After a failure the message is `pending`, unleased, and the very next claim takes it."""
    jobs = signal.once("jobs", retries=3)
    on(jobs, flow("workers.jobs", do=lambda p, fx: None))
    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs, {"a": 1})
        [claimed] = await app.store.claim(["jobs"], "w1", 60_000, 10)
        assert (claimed.id, claimed.attempts) == (msg_id, 1)
        row = await _row(db_url, msg_id)
        assert (row["status"], row["locked_by"], row["attempts"]) == ("inflight", "w1", 1)

        held = await app.store.settle("w1", [Outcome(claimed, "run_x", "workers.jobs", False, now_ms(),
                                                      now_ms(), "Boom", "boom")])
        assert held == [True]
        row = await _row(db_url, msg_id)
        assert (row["status"], row["locked_by"], row["lease_expires_at"], row["attempts"]) == \
            ("pending", None, None, 1)
        [again] = await app.store.claim(["jobs"], "w2", 60_000, 10)  # no back-off
        assert (again.id, again.attempts) == (msg_id, 2)


async def test_a_claimed_record_holds_each_column_of_its_row_under_the_same_name(db_url):
    """The claims' RETURNING lists (and a hand-off's read) follow Claimed's fields (sql/claim.py)."""
    jobs = signal.once("jobs")
    on(jobs, flow("workers.jobs", do=lambda p, fx: None))
    async with oke("t", database_url=db_url) as app:
        await app.emit(jobs, {"a": 1}, key="k-1", priority=7, parent_run_id="run_parent")
        [claimed] = await app.store.claim(["jobs"], "w1", 60_000, 10)
    [row] = await fetch(db_url, f"SELECT {', '.join(Claimed._fields)} FROM oke_messages WHERE id = $1", claimed.id)
    assert tuple(row) == tuple(claimed)
    assert (claimed.key, claimed.priority, claimed.parent_run_id, claimed.attempts) == ("k-1", 7, "run_parent", 1)


async def test_claim_leases_and_counts_the_attempt_before_the_handler_runs(db_url):
    jobs = signal.once("jobs")
    seen = {}

    @on(jobs)
    @flow("workers.jobs")
    async def handler(payload, fx):
        seen["start"] = now_ms()
        seen["row"] = await _row(db_url, fx.message_id)
        seen["attempt"] = fx.attempt

    async with oke("t", database_url=db_url, lease_ms=45_000, worker_id="box-1:pid-7") as app:
        msg_id = await app.emit(jobs, {"a": 1})
        before = now_ms()
        await app.drain()
    row = seen["row"]
    assert row["status"] == "inflight"
    assert row["locked_by"] == "box-1:pid-7"
    assert row["attempts"] == seen["attempt"] == 1
    assert before + 45_000 <= row["lease_expires_at"] <= seen["start"] + 45_000
    final = await _row(db_url, msg_id)
    assert (final["status"], final["attempts"]) == ("delivered", 1)


# --------------------------------------------------------------------------- emit checks

async def test_emit_without_a_subscriber_is_oke1240_and_stores_nothing(db_url):
    lonely = signal.once("lonely")
    async with oke("shop", database_url=db_url) as app:
        with pytest.raises(OkeError) as err:
            await app.emit(lonely, {"a": 1})
        assert err.value.code == 1240
        assert str(err.value) == ('OKE1240: Flow "shop" emits signal "lonely" with no subscriber. Fix: Bind a '
                                  "flow with on(signal, ...) or declare the signal with optional=True.")
    assert (await table_counts(db_url))["oke_messages"] == 0


async def test_optional_signal_may_be_emitted_without_a_subscriber(db_url):
    maybe = signal.once("maybe", optional=True)
    async with oke("shop", database_url=db_url) as app:
        msg_id = await app.emit(maybe, {"a": 1}, key="k")
        await app.drain()  # no worker for it: it waits
    row = await _row(db_url, msg_id)
    assert (row["status"], row["attempts"], row["key"], json.loads(row["payload"])) == \
        ("pending", 0, "k", {"a": 1})


@pytest.mark.parametrize("schema, bad, detail", [
    (Email, {"to": "not-an-email", "body": "x"}, "to: value is not a valid email address"),
    (Email, {"to": "a@b.co"}, "body: Field required"),
    (TypeAdapter(list[int]), ["x"], "0: Input should be a valid integer"),
    (lambda v: v if isinstance(v, dict) else (_ for _ in ()).throw(ValueError("want a dict")), [1],
     "ValueError: want a dict"),
])
async def test_schema_failure_is_oke1250_and_stores_nothing(db_url, schema, bad, detail):
    jobs = signal.once("tasks.email", schema=schema)
    on(jobs, flow("workers.email", do=lambda p, fx: None))
    async with oke("shop", database_url=db_url) as app:
        with pytest.raises(OkeError) as err:
            await app.emit(jobs, bad)
    assert err.value.code == 1250
    assert str(err.value).startswith('OKE1250: "tasks.email": ')
    assert detail in str(err.value)
    assert (await table_counts(db_url))["oke_messages"] == 0


async def test_handler_gets_a_model_for_a_pydantic_schema_else_decoded_json(db_url):
    email = signal.once("tasks.email", schema=Email)
    numbers = signal.once("numbers", schema=TypeAdapter(list[int]))
    plain = signal.once("plain")
    got: dict[str, object] = {}
    on(email, flow("w.email", do=lambda p, fx: got.__setitem__("email", p)))
    on(numbers, flow("w.numbers", do=lambda p, fx: got.__setitem__("numbers", p)))
    on(plain, flow("w.plain", do=lambda p, fx: got.setdefault("plain", []).append(p)))
    async with oke("t", database_url=db_url) as app:
        await app.emit(email, Email(to="a@b.co", body="hi"))
        await app.emit(numbers, ["1", 2])        # the adapter coerces; the JSON is stored
        await app.emit(plain, {"nested": [1, {"x": None}], "s": "é\u0000"})
        await app.drain()
        await app.emit(plain.name)               # by name, no payload
        await app.drain()
    assert isinstance(got["email"], Email) and got["email"] == Email(to="a@b.co", body="hi")
    assert got["numbers"] == [1, 2]
    assert got["plain"] == [{"nested": [1, {"x": None}], "s": "é\u0000"}, None]
    assert await scalar(db_url, "SELECT count(*) FROM oke_messages WHERE status = 'delivered'") == 4


class Aliased(BaseModel):
    user_id: int = Field(alias="userId")
    when: datetime.date
    tags: tuple[str, ...] = ()


async def test_a_model_with_aliases_round_trips_to_the_handler(db_url):
    """The stored JSON is what the schema accepts again: the handler gets the model, not a failure."""
    jobs = signal.once("jobs", schema=Aliased, retries=0)
    adapted = signal.once("adapted", schema=TypeAdapter(Aliased), retries=0)
    got = []
    on(jobs, flow("w", do=lambda p, fx: got.append(p)))
    on(adapted, flow("w.adapted", do=lambda p, fx: got.append(p)))
    async with oke("t", database_url=db_url) as app:
        first = await app.emit(jobs, {"userId": 7, "when": "2026-01-31", "tags": ["a"]})
        await app.emit(jobs, Aliased(userId=8, when=datetime.date(2026, 2, 1)))
        await app.drain()
        await app.emit(adapted, {"userId": 9, "when": "2026-03-01"})
        await app.drain()
    assert got == [Aliased(userId=7, when=datetime.date(2026, 1, 31), tags=("a",)),
                   Aliased(userId=8, when=datetime.date(2026, 2, 1)),
                   {"userId": 9, "when": "2026-03-01", "tags": []}]
    assert json.loads((await _row(db_url, first))["payload"]) == {"userId": 7, "when": "2026-01-31", "tags": ["a"]}
    assert await scalar(db_url, "SELECT count(*) FROM oke_messages WHERE status = 'delivered'") == 3


class Strict(BaseModel):
    model_config = ConfigDict(strict=True)
    when: datetime.date
    amount: decimal.Decimal
    n: int


async def test_a_strict_model_round_trips_to_the_handler(db_url):
    """Stored JSON is re-validated as JSON: a strict model's date and Decimal come back from strings."""
    jobs = signal.once("jobs", schema=Strict, retries=0)
    got = []
    on(jobs, flow("w", do=lambda p, fx: got.append(p)))
    sent = Strict(when=datetime.date(2026, 1, 31), amount=decimal.Decimal("12.50"), n=3)
    async with oke("t", database_url=db_url) as app:
        await app.emit(jobs, sent)
        await app.emit(jobs, {"when": datetime.date(2026, 2, 1), "amount": decimal.Decimal("1"), "n": 4})
        await app.drain()
    assert got == [sent, Strict(when=datetime.date(2026, 2, 1), amount=decimal.Decimal("1"), n=4)]
    assert await scalar(db_url, "SELECT count(*) FROM oke_messages WHERE status = 'delivered'") == 2


async def test_payload_round_trips_byte_for_byte(db_url):
    jobs = signal.once("jobs")
    got = []
    on(jobs, flow("w", do=lambda p, fx: got.append(p)))
    payload = {"nul": "a\u0000b", "emoji": "🦀", "big": 2**62, "neg": -1.5, "list": [True, False, None],
               "quote": "\"'\\", "nl": "\n\r\t"}
    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs, payload)
        await app.drain()
    assert got == [payload]
    assert json.loads((await _row(db_url, msg_id))["payload"]) == payload


# --------------------------------------------------------------------------- handlers

async def test_sync_handlers_run_in_a_thread_and_do_not_block_the_loop(db_url):
    jobs = signal.once("jobs")
    release = threading.Event()
    started = threading.Event()
    seen = {}

    def handler(payload, fx):
        seen["thread"] = threading.current_thread()
        started.set()
        seen["released"] = release.wait(20)  # only the event loop can set it

    on(jobs, flow("w", do=handler))

    async def releaser():
        while not started.is_set():
            await asyncio.sleep(0.01)
        release.set()

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs)
        await asyncio.gather(app.drain(), releaser())
    assert seen["thread"] is not threading.main_thread()
    assert seen["released"] is True
    assert (await _row(db_url, msg_id))["status"] == "delivered"


async def test_sync_handler_exception_is_a_failure(db_url):
    jobs = signal.once("jobs", retries=0)

    def handler(payload, fx):
        raise PaymentDeclined("sync no")

    on(jobs, flow("w", do=handler))
    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs)
        await app.drain()
    assert (await _row(db_url, msg_id))["status"] == "dead"
    assert [(c, m) for _, c, m, _ in await _failures(db_url, msg_id)] == [("E_DECLINED", "sync no")]


async def test_a_handler_that_raises_cancelled_error_itself_is_a_failure(db_url):
    """Only the worker's own cancellation (stop) leaves a message inflight; a CancelledError out of
    the handler's code (it awaited a task someone cancelled) is a failure like any other."""
    jobs = signal.once("jobs", retries=1)

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        if fx.attempt == 1:
            inner = asyncio.ensure_future(asyncio.sleep(10))
            inner.cancel()
            await inner

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs)
        await app.drain()
    row = await _row(db_url, msg_id)
    assert (row["status"], row["attempts"]) == ("delivered", 2)
    assert [(a, c) for a, c, *_ in await _failures(db_url, msg_id)] == [(1, "CancelledError")]


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("str() of this exception fails")


class BadCode(Exception):
    @property
    def code(self):
        raise RuntimeError("so does its code")


@pytest.mark.parametrize("exc, code", [(Unprintable(), "Unprintable"), (BadCode("x"), "BadCode")])
async def test_an_exception_that_cannot_describe_itself_is_still_a_failure(db_url, exc, code):
    jobs = signal.once("jobs", retries=0)

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        raise exc

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs)
        await app.drain()
    assert (await _row(db_url, msg_id))["status"] == "dead"
    [(attempt, got, message, _)] = await _failures(db_url, msg_id)
    assert (attempt, got) == (1, code)
    assert message


async def test_stop_leaves_a_running_handler_reclaimable(db_url):
    """Handlers still running after the stop grace are cancelled; their message waits for its lease."""
    jobs = signal.once("jobs")
    started = asyncio.Event()
    calls = []

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        calls.append(fx.attempt)
        started.set()
        if fx.attempt == 1:
            await asyncio.sleep(3600)

    async with oke("t", database_url=db_url, lease_ms=400, stop_grace_s=0.05) as app:
        msg_id = await app.emit(jobs)
        running = asyncio.create_task(app.run())
        await asyncio.wait_for(started.wait(), 20)
        await app.stop()
        await asyncio.wait_for(running, 20)
        row = await _row(db_url, msg_id)
        assert (row["status"], row["attempts"]) == ("inflight", 1)
        assert await _failures(db_url, msg_id) == []

        async def lease_expired():
            return now_ms() > row["lease_expires_at"] + 5

        while not await lease_expired():
            await asyncio.sleep(0.05)
        await app.drain()
    assert calls == [1, 2]
    row = await _row(db_url, msg_id)
    assert (row["status"], row["attempts"]) == ("delivered", 2)


@pytest.mark.parametrize("how", ["drain", "run"])
async def test_cancelling_drain_or_run_returns_promptly_and_keeps_finished_outcomes(db_url, how):
    """`asyncio.timeout()` around drain() (or cancelling the task running run()) while one handler
    never returns: the cancel ends it within a second, not when the handler ends (never). The
    stuck message stays inflight for its lease; the ones that finished are settled."""
    jobs = signal.once("jobs")
    stuck_started = asyncio.Event()

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        if payload == "stuck":
            stuck_started.set()
            await asyncio.sleep(3600)

    async with oke("t", database_url=db_url, stop_grace_s=30) as app:
        stuck = await app.emit(jobs, "stuck")
        quick = [await app.emit(jobs, n) for n in range(3)]
        began = asyncio.get_running_loop().time()
        if how == "drain":
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await app.drain()
        else:
            running = asyncio.create_task(app.run())
            await asyncio.wait_for(stuck_started.wait(), 20)
            await asyncio.sleep(0.3)
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(running, 20)
        assert asyncio.get_running_loop().time() - began < 5
        assert (await _row(db_url, stuck))["status"] == "inflight"
        assert [(await _row(db_url, m))["status"] for m in quick] == ["delivered"] * 3


async def test_a_handler_that_swallows_the_cancel_does_not_hold_up_a_cancelled_drain(db_url):
    """The stuck handler catches the cancel and runs on for another 3 s: the drain still ends
    after the stop grace (0.2 s), leaving that message inflight."""
    jobs = signal.once("jobs")
    swallowed = asyncio.Event()

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.set()
            await asyncio.sleep(3)

    async with oke("t", database_url=db_url, stop_grace_s=0.2) as app:
        msg_id = await app.emit(jobs)
        began = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await app.drain()
        took = asyncio.get_running_loop().time() - began
        assert swallowed.is_set()
        assert took < 2.0, took  # well before the handler's own 3 s
        assert (await _row(db_url, msg_id))["status"] == "inflight"
        await asyncio.sleep(3)  # let it end before the app closes


async def test_status_path_is_pending_inflight_delivered_or_dead_only(db_url):
    jobs = signal.once("jobs", retries=1)

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        if payload["fail"]:
            raise RuntimeError("no")

    async with oke("t", database_url=db_url) as app:
        for i in range(20):
            await app.emit(jobs, {"fail": i % 3 == 0}, key=f"k{i % 4}" if i % 2 else None)
        await app.drain()
    statuses = dict(await fetch(db_url, "SELECT status, count(*) FROM oke_messages GROUP BY status"))
    assert statuses == {"delivered": 13, "dead": 7}
    run_statuses = {s for (s,) in await fetch(db_url, "SELECT DISTINCT status FROM oke_runs")}
    assert run_statuses == {"succeeded", "failed"}


# --------------------------------------------------------------------------- per-key order

async def test_a_failing_head_blocks_its_key_until_it_is_dead(db_url):
    jobs = signal.once("jobs", retries=2)
    order: list[tuple[str, int]] = []

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        order.append((payload["name"], fx.attempt))
        await asyncio.sleep(0.005)
        if payload["name"] == "first":
            raise RuntimeError("head fails")

    async with oke("t", database_url=db_url) as app:
        for name in ("first", "second", "third"):
            await app.emit(jobs, {"name": name}, key="same")
        await app.drain(concurrency=8)
    assert order == [("first", 1), ("first", 2), ("first", 3), ("second", 1), ("third", 1)]


async def test_keys_are_fifo_and_never_two_in_flight_in_one_process(db_url):
    jobs = signal.once("jobs", retries=3)
    inflight: dict[str, int] = {}
    overlap = []
    handled: dict[str, list[int]] = {}

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        key = payload["key"]
        inflight[key] = inflight.get(key, 0) + 1
        if inflight[key] > 1:
            overlap.append(key)
        try:
            await asyncio.sleep(0.001 * (payload["n"] % 3))
            if payload["n"] % 7 == 0 and fx.attempt == 1:
                raise RuntimeError("retry me")  # a retried head must still come first
            handled.setdefault(key, []).append(payload["n"])
        finally:
            inflight[key] -= 1

    keys = [f"key-{i}" for i in range(6)]
    async with oke("t", database_url=db_url) as app:
        for n in range(120):
            await app.emit(jobs, {"key": keys[n % 6], "n": n}, key=keys[n % 6])
        await app.drain(concurrency=8)
    assert overlap == []
    for i, key in enumerate(keys):
        assert handled[key] == list(range(i, 120, 6))


async def test_different_keys_and_unkeyed_messages_run_in_parallel(db_url):
    """Three messages each wait for the other two to have started: only parallel runs finish."""
    jobs = signal.once("jobs", retries=0)
    arrived: list[str] = []
    everyone = asyncio.Event()

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        arrived.append(payload)
        if len(arrived) == 3:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), 20)

    async with oke("t", database_url=db_url) as app:
        await app.emit(jobs, "a", key="a")
        await app.emit(jobs, "b", key="b")
        await app.emit(jobs, "none")
        await app.drain(concurrency=4)
    assert sorted(arrived) == ["a", "b", "none"]
    assert await scalar(db_url, "SELECT count(*) FROM oke_messages WHERE status = 'delivered'") == 3


async def test_same_key_on_different_signals_does_not_block(db_url):
    one = signal.once("one", retries=0)
    two = signal.once("two", retries=0)
    both = asyncio.Event()
    seen = []

    async def handler(payload, fx):
        seen.append(fx.signal)
        if len(seen) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 20)

    on(one, flow("w.one", do=handler))
    on(two, flow("w.two", do=handler))
    async with oke("t", database_url=db_url) as app:
        await app.emit(one, key="usr_1")
        await app.emit(two, key="usr_1")
        await app.drain()
    assert sorted(seen) == ["one", "two"]
    assert await scalar(db_url, "SELECT count(*) FROM oke_messages WHERE status = 'delivered'") == 2


async def test_drain_returns_when_nothing_is_eligible(db_url):
    jobs = signal.once("jobs")
    count = 0

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        nonlocal count
        count += 1
        if payload < 3:
            await fx.emit(jobs, payload + 1)  # children emitted while draining are drained too

    async with oke("t", database_url=db_url) as app:
        await app.emit(jobs, 0)
        await app.drain()
    assert count == 4


async def test_sqlite_settles_each_outcome_with_the_next_claim(sqlite_url):
    """On SQLite the claim after a batch carries that batch's outcomes: one transaction (one fsync)
    per claim cycle instead of two, with retries, dead letters and runs exactly as before."""
    jobs = signal.once("t.cycle", retries=1)
    calls: list[tuple[int, int]] = []

    @on(jobs)
    @flow("w.cycle")
    async def handle(payload, fx):
        calls.append((payload, fx.attempt))
        if payload % 10 == 0:
            raise RuntimeError("every tenth fails")

    async with oke("t", database_url=sqlite_url) as app:
        ids = [await app.emit(jobs, n) for n in range(100)]
        store = app.store
        counted = {"claim": 0, "settle": 0, "settle_and_claim": 0}
        carried = {"settle": 0, "settle_and_claim": 0}  # outcomes each way
        for name in counted:
            method = getattr(store, name)

            async def counting(*args, _name=name, _method=method, **kwargs):
                counted[_name] += 1
                if _name in carried:
                    carried[_name] += len(args[1])
                return await _method(*args, **kwargs)
            setattr(store, name, counting)
        await app.drain(concurrency=1)
        # Nearly every outcome went with the next claim (of 110). A few settle alone when a retry's
        # back-off leaves nothing to claim, more of them on a loaded machine; without the carrying,
        # every one of the ~100 cycles would settle alone.
        assert carried["settle_and_claim"] >= 95, carried
        assert counted["claim"] + counted["settle"] <= 10, counted
        rows = await fetch(sqlite_url, "SELECT status, attempts FROM oke_messages ORDER BY seq")
        runs = await fetch(sqlite_url, "SELECT status, count(*) FROM oke_runs GROUP BY status")
        failures = await scalar(sqlite_url, "SELECT count(*) FROM oke_failures")
    assert [r[0] for r in rows] == ["dead" if n % 10 == 0 else "delivered" for n in range(100)]
    assert [r[1] for r in rows] == [2 if n % 10 == 0 else 1 for n in range(100)]
    assert dict(runs) == {"succeeded": 90, "failed": 20}
    assert failures == 20
    assert sorted(calls) == sorted([(n, 1) for n in range(100)] + [(n, 2) for n in range(0, 100, 10)])
    assert len(ids) == 100
