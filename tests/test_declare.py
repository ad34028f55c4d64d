"""Declaring signals and binding flows: option checks, error texts, boot checks."""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel, EmailStr, TypeAdapter

import engine
from engine import OkeError, flow, oke, on, signal
from engine.errors import CATALOGUE


class Email(BaseModel):
    to: EmailStr
    body: str


async def _handler(payload, fx):
    return None


# --------------------------------------------------------------------------- signal options

def test_signal_handles_expose_their_options():
    once = signal.once("tasks.email", schema=Email, retries=5, dead_letter=False, optional=True,
                       description="send e-mail")
    assert (once.name, once.kind, once.retries, once.dead_letter, once.optional) == \
        ("tasks.email", "once", 5, False, True)
    assert once.description == "send e-mail"
    assert once.retention is None

    bc = signal.broadcast("catalog.changed")
    assert (bc.kind, bc.retries, bc.dead_letter, bc.optional, bc.description) == \
        ("broadcast", 3, True, False, "catalog.changed")

    live = signal.live("order-status", optional=True, retention={"max_age": "7d", "max_count": 10_000})
    assert live.kind == "live"
    assert live.retention == {"max_age": "7d", "max_count": 10_000}
    assert live.description == "order-status"


@pytest.mark.parametrize("kind", ["once", "broadcast"])
@pytest.mark.parametrize("retention", [{"max_age": "24h"}, {"max_count": 10}, {}, None])
def test_retention_is_only_valid_on_live(kind, retention):
    declare = getattr(signal, kind)
    with pytest.raises(TypeError) as err:
        declare("jobs.x", retention=retention)
    assert str(err.value) == f'signal.{kind}("jobs.x"): retention is only valid with signal.live'


@pytest.mark.parametrize("max_age, ms", [("30s", 30_000), ("24h", 86_400_000), ("7d", 604_800_000),
                                         ("1ms", 1), ("15m", 900_000)])
def test_retention_max_age_accepts_the_grammar(max_age, ms):
    live = signal.live("tape", retention={"max_age": max_age})
    assert live.retention == {"max_age": max_age}
    assert live.retention_rule.max_age_ms == ms


@pytest.mark.parametrize("max_age", ["0s", "0ms", "1.5h", "1h30m", "24", "h", "", " 24h", "24h ", "24h\n",
                                     "-1s", "1w", "24H", "1 h", 24, 1.5, None.__class__, "1e3s", "٣s"])
def test_retention_max_age_rejects_everything_else(max_age):
    with pytest.raises(ValueError) as err:
        signal.live("tape", retention={"max_age": max_age})
    assert str(err.value) == 'signal.live("tape"): retention.max_age must be a duration like "24h" or "30s"'


@pytest.mark.parametrize("max_count", [0, -1, 1.5, "10", True, False, [1]])
def test_retention_max_count_must_be_an_int_at_least_one(max_count):
    with pytest.raises(ValueError) as err:
        signal.live("tape", retention={"max_count": max_count})
    assert str(err.value) == 'signal.live("tape"): retention.max_count must be an integer ≥ 1'


def test_retention_max_count_of_one_is_fine():
    assert signal.live("tape", retention={"max_count": 1}).retention == {"max_count": 1}


def test_retention_unknown_key_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="max_size"):
        signal.live("tape", retention={"max_size": 10})


@pytest.mark.parametrize("name", ["a", "x" * 200, "tasks.email", "order-status", "ünïcode/名前", "a b"])
def test_good_names(name):
    assert signal.once(name).name == name


@pytest.mark.parametrize("name", ["", "x" * 201, "a\x00b", "a\nb", "tab\there", "\x7f", "a\x1fb",
                                  "bell\x07", "nl\u2028", "c1\x85"])
def test_bad_names_are_value_errors(name):
    for declare in (signal.once, signal.broadcast, signal.live):
        with pytest.raises(ValueError):
            declare(name)


def test_a_name_that_is_not_a_string_is_refused():
    with pytest.raises(TypeError):
        signal.once(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("retries", [0, 1, 3, 100])
def test_retries_int_at_least_zero(retries):
    assert signal.once("jobs", retries=retries).retries == retries


@pytest.mark.parametrize("retries", [-1, 1.0, "3", True, None])
def test_retries_must_be_an_int_at_least_zero(retries):
    with pytest.raises(TypeError, match="retries"):
        signal.once("jobs", retries=retries)


def test_dead_letter_as_a_queue_name_is_a_type_error():
    with pytest.raises(TypeError, match="dead_letter"):
        signal.once("jobs", dead_letter="jobs.dlq")
    with pytest.raises(TypeError, match="dead_letter"):
        signal.broadcast("jobs", dead_letter=1)


@pytest.mark.parametrize("optional", ["yes", 1, None])
def test_optional_must_be_a_bool(optional):
    with pytest.raises(TypeError, match="optional"):
        signal.once("jobs", optional=optional)


@pytest.mark.parametrize("option", ["lease_ms", "retry", "deadLetter", "max_age", "key"])
def test_unknown_option_is_a_type_error_naming_it(option):
    for declare in (signal.once, signal.broadcast, signal.live):
        with pytest.raises(TypeError) as err:
            declare("jobs", **{option: 1})
        assert option in str(err.value)


def _callable_schema(value):
    if not isinstance(value, dict):
        raise ValueError("expected an object")
    return value


@pytest.mark.parametrize("schema", [Email, TypeAdapter(list[int]), _callable_schema, lambda v: v, None])
def test_schema_forms_accepted(schema):
    assert signal.once("jobs", schema=schema).schema is schema


class NotAModel:
    pass


@pytest.mark.parametrize("schema", ["Email", {"to": str}, 42, Email(to="a@b.co", body="x"), NotAModel])
def test_schema_must_be_a_model_an_adapter_or_a_callable(schema):
    with pytest.raises(TypeError, match="schema"):
        signal.once("jobs", schema=schema)


def test_description_must_be_a_string():
    with pytest.raises(TypeError, match="description"):
        signal.once("jobs", description=3)


# --------------------------------------------------------------------------- flow() and on()

def test_flow_decorator_and_call_forms_bind_the_same_way():
    jobs = signal.once("jobs")
    other = signal.broadcast("other")

    @on(jobs)
    @flow("workers.jobs", effects={"reads": ["signal:jobs"]})
    async def process(payload, fx):
        return payload

    plain = on(other, flow("workers.other", do=_handler, durable=True))

    assert isinstance(process, engine.flows.Flow)
    assert process.name == "workers.jobs" and process.reads == frozenset({"signal:jobs"})
    assert plain.name == "workers.other" and plain.durable and plain.do is _handler
    bindings = engine.flows.current_bindings()
    assert [(b.trigger, b.flow) for b in bindings] == [(jobs, process), (other, plain)]


def test_on_by_name_binds_to_the_declared_signal():
    jobs = signal.once("tasks.email")
    bound = on("tasks.email", flow("workers.email", do=_handler))
    [binding] = engine.flows.current_bindings()
    assert binding.trigger is jobs and binding.flow is bound


async def test_on_a_name_never_declared_fails_at_boot(sqlite_url):
    on("nope", flow("w", do=_handler))  # declarations may still follow: nothing to say yet
    with pytest.raises(LookupError, match=r'on\("nope"\): no signal of that name is declared .*looked up at boot'):
        async with oke("t", database_url=sqlite_url):
            pass


@pytest.mark.parametrize("bad, exc", [("", ValueError), ("a\nb", ValueError), (42, TypeError)])
def test_on_a_name_no_signal_could_have_fails_at_once(bad, exc):
    with pytest.raises(exc):
        on(bad, flow("w", do=_handler))


async def test_on_by_name_before_the_declaration_binds_at_boot(sqlite_url):
    got = []
    bound = on("tasks.email", flow("workers.email", do=lambda p, fx: got.append(p)))  # any order
    jobs = signal.once("tasks.email")
    async with oke("t", database_url=sqlite_url) as app:
        assert app.manifest.signal_flows["tasks.email"] == [bound]
        await app.emit(jobs, {"to": "a@example.com"})
        await app.drain()
    assert got == [{"to": "a@example.com"}]


async def test_on_by_name_before_a_live_declaration_is_refused_at_boot_like_on_signal(sqlite_url):
    on("order-status", flow("workers.status", do=_handler))
    signal.live("order-status")
    with pytest.raises(TypeError, match="a live signal is a tape, not a queue"):
        async with oke("t", database_url=sqlite_url):
            pass


def test_on_a_bare_function_makes_a_nameless_flow():
    jobs = signal.once("jobs")
    bound = on(jobs, _handler)
    assert bound.name is None and bound.do is _handler


@pytest.mark.parametrize("bad", [dict(name=""), dict(name=3), dict(durable="yes"),
                                 dict(effects={"writes": []}), dict(effects={"reads": "signal:x"}),
                                 dict(effects=["signal:x"]), dict(do=42)])
def test_flow_option_checks(bad):
    with pytest.raises(TypeError):
        flow(**({"name": "w"} | bad))


@pytest.mark.parametrize("name", ["x" * 201, "a\nb", "nul\x00", "\x7f"])
def test_flow_names_follow_the_signal_name_rules(name):
    with pytest.raises(ValueError):
        flow(name, do=_handler)
    with pytest.raises(ValueError):
        flow(name)


def test_a_200_character_flow_name_is_fine():
    assert flow("f" * 200, do=_handler).name == "f" * 200


def test_bare_flow_decorator_is_refused():
    with pytest.raises(TypeError):
        @flow
        async def handler(payload, fx):
            return None


# --------------------------------------------------------------------------- boot checks

async def test_two_flows_on_one_once_signal_fail_at_boot_with_oke1071(sqlite_url):
    jobs = signal.once("jobs")
    on(jobs, flow("workers.a", do=_handler))
    on(jobs, flow("workers.b", do=_handler))
    with pytest.raises(OkeError) as err:
        async with oke("t", database_url=sqlite_url):
            pass
    assert err.value.code == 1071
    assert str(err.value).startswith('OKE1071: Once signal "jobs" is bound to more than one Flow (')
    assert '"workers.a"' in str(err.value) and '"workers.b"' in str(err.value)


async def test_oke1071_names_every_flow_bound_to_the_once_signal(sqlite_url):
    jobs = signal.once("jobs")
    for name in ("workers.a", "workers.b", "workers.c"):
        on(jobs, flow(name, do=_handler))
    with pytest.raises(OkeError) as err:
        async with oke("t", database_url=sqlite_url):
            pass
    assert str(err.value).startswith(
        'OKE1071: Once signal "jobs" is bound to more than one Flow ("workers.a", "workers.b", "workers.c").')


OKE1071_FIX = ("Use signal.broadcast if each flow should independently receive this event, or bind only one "
               "flow if these should compete for the same work.")


def test_oke1071_fix_text_is_the_seeds_sentence():
    assert OkeError.of(1071, signal="jobs", flows='"a", "b"').fix == OKE1071_FIX


async def _other_handler(payload, fx):
    return None


async def test_two_handlers_under_one_flow_name_on_a_once_signal_fail_at_boot_with_oke1071(sqlite_url):
    jobs = signal.once("jobs")
    on(jobs, flow("workers.a", do=_handler))
    on(jobs, flow("workers.a", do=_other_handler))  # same name, another handler: not one flow
    with pytest.raises(OkeError) as err:
        async with oke("t", database_url=sqlite_url):
            pass
    assert err.value.code == 1071
    assert str(err.value) == (f'OKE1071: Once signal "jobs" is bound to more than one Flow ("workers.a", '
                              f'"workers.a"). Fix: {OKE1071_FIX}')


async def test_two_handlers_under_one_flow_name_on_a_broadcast_signal_are_a_value_error(sqlite_url):
    news = signal.broadcast("news")
    on(news, flow("workers.n", do=_handler))
    on(news, flow("workers.n", do=_other_handler))
    with pytest.raises(ValueError, match=r'flow "workers.n" is bound twice with different handlers '
                                         r"\(_handler and _other_handler\)"):
        async with oke("t", database_url=sqlite_url):
            pass


async def test_one_handler_wrapped_twice_under_its_name_is_still_one_flow(sqlite_url):
    news = signal.broadcast("news")
    on(news, flow("workers.n", do=_handler))
    on(news, flow("workers.n", do=_handler))
    async with oke("t", database_url=sqlite_url) as app:
        assert [f.name for f in app.manifest.signal_flows["news"]] == ["workers.n"]


async def test_one_flow_bound_twice_and_broadcast_fan_out_boot_fine(sqlite_url):
    jobs = signal.once("jobs")
    news = signal.broadcast("news")
    worker = flow("workers.a", do=_handler)
    on(jobs, worker)
    on(jobs, worker)
    on(news, flow("workers.n1", do=_handler))
    on(news, flow("workers.n2", do=_handler))
    async with oke("t", database_url=sqlite_url) as app:
        assert [f.name for f in app.manifest.signal_flows["jobs"]] == ["workers.a"]
        assert sorted(f.name for f in app.manifest.signal_flows["news"]) == ["workers.n1", "workers.n2"]


async def test_two_apps_with_the_same_once_flow_share_the_queue(sqlite_url):
    """The same flow on many processes is load balancing, not OKE1071 (here: two apps)."""
    jobs = signal.once("jobs")
    on(jobs, flow("workers.a", do=_handler))
    async with oke("one", database_url=sqlite_url), oke("two", database_url=sqlite_url):
        pass


@pytest.mark.parametrize("kind", ["once", "broadcast"])
async def test_nameless_signal_flow_fails_at_boot_with_oke1072(sqlite_url, kind):
    sig = getattr(signal, kind)("jobs")
    on(sig, flow(do=_handler))
    with pytest.raises(OkeError) as err:
        async with oke("t", database_url=sqlite_url):
            pass
    assert err.value.code == 1072
    assert str(err.value).startswith('OKE1072: A signal flow on "jobs" has no name.')


async def test_nameless_decorated_flow_fails_at_boot_with_oke1072(sqlite_url):
    jobs = signal.once("jobs")

    @on(jobs)
    async def handler(payload, fx):
        return None

    with pytest.raises(OkeError, match=r"^OKE1072"):
        async with oke("t", database_url=sqlite_url):
            pass


async def test_live_signal_bound_to_a_worker_is_rejected_at_boot(sqlite_url):
    tape = signal.live("order-status")
    on(tape, flow("workers.tape", do=_handler))  # declaring is fine; booting is not
    with pytest.raises(TypeError, match="live"):
        async with oke("t", database_url=sqlite_url):
            pass


async def test_explicit_bindings_replace_the_process_registry(sqlite_url):
    jobs = signal.once("jobs")
    on(jobs, flow("workers.a", do=_handler))
    on(jobs, flow("workers.b", do=_handler))  # would be OKE1071 if adopted
    only = engine.flows.Binding(jobs, flow("workers.c", do=_handler))
    async with oke("t", database_url=sqlite_url, bindings=[only]) as app:
        assert [f.name for f in app.manifest.signal_flows["jobs"]] == ["workers.c"]


def test_reset_forgets_bindings_and_declarations():
    on(signal.once("jobs"), flow("w", do=_handler))
    engine.reset()
    assert engine.flows.current_bindings() == []
    assert engine.signals.declared("jobs") is None


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("code", sorted(CATALOGUE))
def test_every_catalogued_error_text_starts_with_its_code(code):
    fields = {k: "x" for k in re.findall(r"{(\w+)}", CATALOGUE[code][0] + CATALOGUE[code][1])}
    err = OkeError.of(code, **fields)
    assert str(err).startswith(f"OKE{code}: ")
    assert err.code == code
    assert isinstance(err, Exception)


def test_oke_error_constructor():
    err = OkeError(1234, "something broke.", "do this.")
    assert str(err).startswith("OKE1234")
    assert (err.code, err.cause, err.fix) == (1234, "something broke.", "do this.")
    assert "something broke." in str(err)
