"""fx: the per-run context on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from engine import OkeError, flow, oke, on, signal
from engine.fx import Fx
from engine.ids import now_ms
from engine.ops.records import DeadLetter, Failure
from workers.db import fetch, scalar


class Declined(Exception):
    code = "E_DECLINED"


async def test_fx_emit_stamps_the_parent_run_and_returns_the_stored_id(db_url):
    orders = signal.once("orders")
    receipts = signal.once("receipts")
    seen: dict[str, object] = {}

    @on(orders)
    @flow("w.orders")
    async def place(payload, fx):
        seen["order_run"] = fx.run_id
        seen["order_parent"] = fx.parent_run_id
        seen["child_id"] = await fx.emit(receipts, {"order": payload["id"]}, key=payload["id"])

    @on(receipts)
    @flow("w.receipts")
    async def receipt(payload, fx):
        seen["receipt_parent"] = fx.parent_run_id
        seen["receipt_payload"] = payload
        seen["receipt_message"] = fx.message_id

    async with oke("t", database_url=db_url) as app:
        root_id = await app.emit(orders, {"id": "ord_1"})
        await app.drain()

    assert seen["order_parent"] is None
    assert seen["receipt_parent"] == seen["order_run"]
    assert seen["receipt_payload"] == {"order": "ord_1"}
    assert seen["receipt_message"] == seen["child_id"]
    rows = await fetch(db_url, "SELECT id, parent_run_id, key, status FROM oke_messages ORDER BY seq")
    assert rows == [(root_id, None, None, "delivered"),
                    (seen["child_id"], seen["order_run"], "ord_1", "delivered")]
    runs = await fetch(db_url, "SELECT run_id, message_id, parent_run_id, flow FROM oke_runs ORDER BY started_at")
    assert (seen["order_run"], root_id, None, "w.orders") in runs
    assert any(r[1] == seen["child_id"] and r[2] == seen["order_run"] and r[3] == "w.receipts" for r in runs)


async def test_a_lambda_handler_may_return_fx_emit(db_url):
    """A sync handler runs in a thread; the awaitable it returns is awaited on the loop."""
    orders = signal.once("orders")
    receipts = signal.once("receipts", optional=True)
    on(orders, flow("w.orders", do=lambda payload, fx: fx.emit(receipts, {"for": payload}, key="k")))
    async with oke("t", database_url=db_url) as app:
        await app.emit(orders, 42)
        await app.drain()
    rows = await fetch(db_url, "SELECT signal, payload, key, status FROM oke_messages ORDER BY seq")
    assert rows == [("orders", "42", None, "delivered"), ("receipts", '{"for":42}', "k", "pending")]
    [(parent,)] = await fetch(db_url, "SELECT parent_run_id FROM oke_messages WHERE signal = 'receipts'")
    assert await fetch(db_url, "SELECT flow FROM oke_runs WHERE run_id = $1", parent) == [("w.orders",)]


async def test_fx_emit_is_checked_like_app_emit(db_url):
    orders = signal.once("orders", retries=0)
    lonely = signal.once("lonely")
    strict = signal.once("strict", schema=lambda v: v if isinstance(v, int) else int("x"))
    errors = []

    @on(orders)
    @flow("w.orders")
    async def place(payload, fx):
        for target, value in ((lonely, 1), (strict, "nope")):
            try:
                await fx.emit(target, value)
            except OkeError as err:
                errors.append(err)

    on(strict, flow("w.strict", do=lambda p, fx: None))
    async with oke("t", database_url=db_url) as app:
        await app.emit(orders)
        await app.drain()
    assert [e.code for e in errors] == [1240, 1250]
    assert str(errors[0]).startswith('OKE1240: Flow "w.orders" emits signal "lonely" with no subscriber.')
    assert await scalar(db_url, "SELECT count(*) FROM oke_messages") == 1


async def test_fx_attempt_and_run_id_per_attempt(db_url):
    jobs = signal.once("jobs", retries=2)
    seen: list[tuple[int, str, str]] = []

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        seen.append((fx.attempt, fx.run_id, fx.message_id))
        raise RuntimeError(f"attempt {fx.attempt}")

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs)
        await app.drain()
    assert [a for a, _, _ in seen] == [1, 2, 3]
    assert len({r for _, r, _ in seen}) == 3
    assert {m for _, _, m in seen} == {msg_id}
    runs = await fetch(db_url, "SELECT run_id, attempt, status FROM oke_runs WHERE message_id = $1 "
                               "ORDER BY attempt", msg_id)
    assert runs == [(r, a, "failed") for a, r, _ in seen]
    failure_runs = await fetch(db_url, "SELECT run_id FROM oke_failures WHERE message_id = $1 ORDER BY id",
                               msg_id)
    assert [r for (r,) in failure_runs] == [r for _, r, _ in seen]


async def test_fx_id_is_unique_and_time_ordered(db_url):
    jobs = signal.once("jobs")
    ids = []

    @on(jobs)
    @flow("w")
    def handler(payload, fx):
        ids.extend(fx.id() for _ in range(1000))

    async with oke("t", database_url=db_url) as app:
        await app.emit(jobs)
        await app.drain()
    assert len(set(ids)) == 1000
    assert all(isinstance(i, str) and i for i in ids)
    stamps = [i[:10] for i in ids]
    assert stamps == sorted(stamps)


# --------------------------------------------------------------------------- dead letters

async def test_fx_dead_letters_with_the_read_declared(db_url):
    jobs = signal.once("tasks.email", retries=1)
    audit = signal.once("audit")
    got: list[list[DeadLetter]] = []

    @on(jobs)
    @flow("w.email")
    async def send(payload, fx):
        raise Declined(f"no {payload['n']}")

    @on(audit)
    @flow("w.audit", effects={"reads": ["signal:tasks.email"]})
    async def check(payload, fx):
        got.append(await fx.dead_letters(jobs))
        got.append(await fx.dead_letters("tasks.email"))

    t0 = now_ms()
    async with oke("t", database_url=db_url) as app:
        first = await app.emit(jobs, {"n": 1}, key="usr_1")
        second = await app.emit(jobs, {"n": 2})
        await app.drain()
        t1 = now_ms()
        await app.emit(audit)
        await app.drain()

    by_handle, by_name = got
    assert by_handle == by_name
    assert [d.id for d in by_handle] == [second, first]  # newest first
    dead = by_handle[1]
    assert dead.signal == "tasks.email" and dead.key == "usr_1" and dead.payload == {"n": 1}
    assert dead.attempts == 2 and dead.status == "dead" and dead.parent_run_id is None
    assert t0 <= dead.created_at <= t1
    assert [(f.code, f.message, f.attempt) for f in dead.failures] == [("E_DECLINED", "no 1", 1),
                                                                       ("E_DECLINED", "no 1", 2)]
    assert all(isinstance(f, Failure) and t0 <= f.at <= t1 for f in dead.failures)


async def test_a_dead_letter_keeps_the_run_that_emitted_it(db_url):
    orders = signal.once("orders")
    emails = signal.once("emails", retries=0)
    seen = {}

    @on(orders)
    @flow("w.orders")
    async def place(payload, fx):
        seen["run"] = fx.run_id
        seen["child"] = await fx.emit(emails, {"to": "a@b.co"}, key="usr_9")

    @on(emails)
    @flow("w.emails")
    async def send(payload, fx):
        raise Declined("mailbox full")

    async with oke("t", database_url=db_url) as app:
        await app.emit(orders)
        await app.drain()
        from engine import ops
        [dead] = await ops.dead_letters(app.store, "emails")
    assert (dead.id, dead.parent_run_id, dead.key, dead.payload, dead.attempts) == \
        (seen["child"], seen["run"], "usr_9", {"to": "a@b.co"}, 1)
    assert ops.to_json(dead)["failures"][0]["code"] == "E_DECLINED"
    assert set(ops.to_json(dead)) >= {"id", "signal", "key", "payload", "attempts", "failures", "created_at",
                                      "parent_run_id", "status"}


async def test_fx_dead_letters_without_the_read_is_oke1001(db_url):
    jobs = signal.once("tasks.email", retries=0)
    audit = signal.once("audit", retries=0)
    errors = []
    on(jobs, flow("w.email", do=lambda p, fx: None))

    @on(audit)
    @flow("w.audit", effects={"reads": ["signal:other"]})
    async def check(payload, fx):
        try:
            await fx.dead_letters(jobs)
        except OkeError as err:
            errors.append(err)
            raise

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(audit)
        await app.drain()
    [err] = errors
    assert err.code == 1001
    assert str(err).startswith('OKE1001: Flow "w.audit" reads "signal:tasks.email" without declaring it.')
    # the OKE1001 the handler raised is the run's failure
    [(code, message)] = await fetch(db_url, "SELECT code, message FROM oke_failures WHERE message_id = $1",
                                    msg_id)
    assert message == str(err)
    assert code in ("OKE1001", "OkeError")


async def test_fx_dead_letters_without_a_bound_runtime():
    jobs = signal.once("tasks.email")
    fx = Fx(None, flow("w.audit", do=lambda p, fx: None, effects={"reads": ["signal:tasks.email"]}))
    with pytest.raises(RuntimeError) as err:
        await fx.dead_letters(jobs)
    assert str(err.value) == "fx.dead_letters requires a bound signal runtime"


async def test_fx_dead_letters_of_a_started_then_closed_app(sqlite_url):
    jobs = signal.once("tasks.email")
    bound = flow("w.audit", do=lambda p, fx: None, effects={"reads": ["signal:tasks.email"]})
    app = oke("t", database_url=sqlite_url, bindings=[])
    async with app:
        pass
    with pytest.raises(RuntimeError, match="fx.dead_letters requires a bound signal runtime"):
        await Fx(app, bound).dead_letters(jobs)


# --------------------------------------------------------------------------- durable steps

async def test_a_finished_step_is_not_run_again_on_retry(db_url):
    jobs = signal.once("jobs", retries=2)
    body_runs = []
    results = []

    @on(jobs)
    @flow("w", durable=True)
    async def handler(payload, fx):
        async def charge():
            body_runs.append(fx.attempt)
            return {"charge": "ch_1", "attempt": fx.attempt}

        results.append(await fx.step("charge", charge))
        second = await fx.step("sync-step", lambda: fx.attempt * 10)
        results.append(second)
        if fx.attempt == 1:
            raise RuntimeError("after the steps")

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs)
        await app.drain()
    assert body_runs == [1]
    assert results == [{"charge": "ch_1", "attempt": 1}, 10, {"charge": "ch_1", "attempt": 1}, 10]
    row = await fetch(db_url, "SELECT status, attempts FROM oke_messages WHERE id = $1", msg_id)
    assert row == [("delivered", 2)]
    steps = await fetch(db_url, "SELECT name FROM oke_steps WHERE message_id = $1 ORDER BY name", msg_id)
    assert steps == [("charge",), ("sync-step",)]


async def test_a_step_returns_its_recorded_value_on_every_attempt(db_url):
    """What the first attempt gets is what a retry gets: the recorded JSON, not the raw object."""
    jobs = signal.once("jobs", retries=1)
    seen = []

    @on(jobs)
    @flow("w", durable=True)
    async def handler(payload, fx):
        seen.append(await fx.step("shape", lambda: {1: ("a", "b"), "n": 1.5}))
        if fx.attempt == 1:
            raise RuntimeError("retry")

    async with oke("t", database_url=db_url) as app:
        await app.emit(jobs)
        await app.drain()
    assert seen == [{"1": ["a", "b"], "n": 1.5}] * 2


async def test_a_step_whose_result_is_not_json_fails_the_attempt(db_url):
    jobs = signal.once("jobs", retries=0)

    @on(jobs)
    @flow("w", durable=True)
    async def handler(payload, fx):
        await fx.step("bad", lambda: {1, 2})

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs)
        await app.drain()
    [(code, message)] = await fetch(db_url, "SELECT code, message FROM oke_failures WHERE message_id = $1",
                                    msg_id)
    assert code == "TypeError" and 'fx.step("bad")' in message
    assert await fetch(db_url, "SELECT count(*) FROM oke_steps") == [(0,)]


async def test_a_step_that_raises_is_run_again_on_retry(db_url):
    jobs = signal.once("jobs", retries=1)
    body_runs = []

    @on(jobs)
    @flow("w", durable=True)
    async def handler(payload, fx):
        def flaky():
            body_runs.append(fx.attempt)
            if fx.attempt == 1:
                raise RuntimeError("step failed")
            return "ok"

        assert await fx.step("flaky", flaky) == "ok"

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs)
        await app.drain()
    assert body_runs == [1, 2]
    assert await fetch(db_url, "SELECT status FROM oke_messages WHERE id = $1", msg_id) == [("delivered",)]


async def test_steps_are_per_message(db_url):
    jobs = signal.once("jobs")
    body_runs = []

    @on(jobs)
    @flow("w", durable=True)
    async def handler(payload, fx):
        await fx.step("s", lambda: body_runs.append(payload) or payload)

    async with oke("t", database_url=db_url) as app:
        for n in range(3):
            await app.emit(jobs, n)
        await app.drain()
    assert sorted(body_runs) == [0, 1, 2]


async def test_step_in_a_flow_that_is_not_durable_fails_the_attempt(db_url):
    jobs = signal.once("jobs", retries=0)
    body_runs = []

    @on(jobs)
    @flow("w")
    async def handler(payload, fx):
        await fx.step("s", lambda: body_runs.append(1))

    async with oke("t", database_url=db_url) as app:
        msg_id = await app.emit(jobs)
        await app.drain()
    assert body_runs == []
    [(code, message)] = await fetch(db_url, "SELECT code, message FROM oke_failures WHERE message_id = $1",
                                    msg_id)
    assert code == "RuntimeError" and "not durable" in message
