"""Hostile input at every entry point (issue #5, item 3), generated with hypothesis.

Declarations, emit payloads and keys on SQLite and PostgreSQL, and the console's arguments. The
HTTP side (SSE cursors, URL paths, gates, odd signal names over the wire) is in
tests/test_hostile_http.py. The rules: nothing crashes a worker or the server, nothing is stored
half-written, and each bad input gets a clear one-line error (an OKE code where one exists).

Examples are few and derandomized (the same inputs on every run), so a failure reproduces and the
file stays well under a minute; HYPOTHESIS_PROFILE=hostile-long runs ten times as many.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from typer.testing import CliRunner

from engine import OkeError, flow, oke, on, signal
from engine.durations import MAX_DURATION_MS, parse_duration_ms
from engine.payloads import DEFAULT_MAX_PAYLOAD_BYTES, MAX_DEPTH, loads_stored
from okconsole.cli import app as cli_app
from workers.db import fetch, table_counts

settings.register_profile("hostile", max_examples=40, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                 HealthCheck.data_too_large, HealthCheck.large_base_example])
settings.register_profile("hostile-long", parent=settings.get_profile("hostile"), max_examples=400)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "hostile")
if PROFILE not in ("hostile", "hostile-long"):
    PROFILE = "hostile"
base = settings.get_profile(PROFILE)


def few(n: int) -> settings:
    """`n` examples (ten times as many under hostile-long)."""
    return settings(base, max_examples=n * (10 if PROFILE == "hostile-long" else 1))


# ------------------------------------------------------------------------------ strategies

BAD_NAME_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")
# what a signal name may hold: anything but control, format, surrogate and line/paragraph separators
name_chars = st.characters(blacklist_categories=BAD_NAME_CATEGORIES)
odd_names = st.one_of(
    st.text(name_chars, min_size=1, max_size=200),
    st.sampled_from([".", "..", "...", "a/b", "a/../b", "100%", "%2e%2e", "%00", "é ü", "日本語/注文",
                     "🦆", "x" * 200, "🦆" * 200, " ", "a b", "?#&=+", "'\"\\", "<script>", "\ufffd", "\uffff",
                     "\U0010fffd", "ﬃ", "İ", "_oke", "live"]),
)
control = st.characters(whitelist_categories=BAD_NAME_CATEGORIES)
names_with_a_control = st.tuples(st.text(name_chars, max_size=20), control, st.text(name_chars, max_size=20)) \
    .map("".join)

SPECIAL_TEXT = ["\x00", "a\x00b", "\u2028", "\u2029", "\x85", "\r\n", "\r", "\n\ndata: x\n\n", "id: 1\n",
                "\ufeff", "\U0001F600", "\\u0000", "\x7f", "\x1b[31m", "</script>", '"', "\\", ""]
json_text = st.one_of(st.text(), st.sampled_from(SPECIAL_TEXT))
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.0, -0.0, 1e308, 5e-324, 2**53 + 1]),
    json_text,
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.lists(children, max_size=4).map(tuple),  # JSON carries it as a list
        st.dictionaries(json_text, children, max_size=6),
    ),
    max_leaves=25,
)


def normalised(value: Any) -> Any:
    """What any reader gets back: the value after one trip through JSON."""
    return json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False))


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON text (so -0.0 differs from 0.0, 1 from 1.0 and order counts)."""
    return json.dumps(a, ensure_ascii=False) == json.dumps(b, ensure_ascii=False)


def _deep(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def _circular() -> Any:
    d: dict[str, Any] = {"a": [1]}
    d["a"].append(d)
    return d


def _expanding() -> Any:
    """2^60 leaves once expanded: json.dumps alone would never return."""
    value: Any = ["x"]
    for _ in range(60):
        value = [value, value]
    return value


class Opaque:
    pass


POISONS: dict[str, Any] = {
    "set": lambda: {1, 2},
    "frozenset": lambda: frozenset({"a"}),
    "bytes": lambda: b"raw",
    "bytearray": lambda: bytearray(b"raw"),
    "object": lambda: object(),
    "instance": lambda: Opaque(),
    "complex": lambda: 1j,
    "function": lambda: print,
    "nan": lambda: float("nan"),
    "inf": lambda: float("inf"),
    "-inf": lambda: float("-inf"),
    "tuple key": lambda: {(1, 2): "x"},
    "int key": lambda: {1: "a"},
    "int and str key": lambda: {1: "a", "1": "b"},
    "bool key": lambda: {True: 1},
    "none key": lambda: {None: 1},
    "float key": lambda: {1.5: 1},
    "nan key": lambda: {float("nan"): 1},
    "bytes key": lambda: {b"k": 1},
    "lone surrogate": lambda: "\ud800",
    "low surrogate in text": lambda: "ok\udfffok",
    "surrogate key": lambda: {"\udc80": 1},
    "too deep": lambda: _deep(MAX_DEPTH + 1),
    "far too deep": lambda: _deep(50_000),
    "circular": _circular,
    "expanding": _expanding,
    "huge": lambda: "x" * DEFAULT_MAX_PAYLOAD_BYTES,
    "huge in utf-8": lambda: "é" * (DEFAULT_MAX_PAYLOAD_BYTES // 2),
    "one string many times": lambda: ["y" * 100_000] * 11,
}
WRAPPERS = [
    lambda bad, ok: bad,
    lambda bad, ok: {"bad": bad},
    lambda bad, ok: [ok, bad],
    lambda bad, ok: {"ok": ok, "deeper": [{"x": bad}]},
    lambda bad, ok: (ok, (bad,)),
]
bad_payload_wrappers = st.builds(lambda wrap, ok: (lambda bad: wrap(bad, ok)), st.sampled_from(WRAPPERS), json_values)

# keys
non_str_keys = st.one_of(st.integers(), st.floats(), st.binary(max_size=8), st.booleans(),
                         st.lists(st.text(max_size=3), max_size=2), st.tuples(st.text(max_size=3)),
                         st.builds(object))
key_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
bad_text_keys = st.one_of(
    st.just(""),
    st.tuples(st.text(key_chars, max_size=10), st.sampled_from(["\x00", "\ud800", "\udbff", "\udc00", "\udfff"]),
              st.text(key_chars, max_size=10)).map("".join),
    st.text(key_chars, min_size=1001, max_size=1010),                                   # characters
    st.text(st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF), min_size=251, max_size=400),  # bytes
)
good_keys = st.one_of(st.text(key_chars, min_size=1, max_size=120),
                      st.sampled_from(["k" * 1000, "🦆" * 250, " ", "\x1f", "a\x1fb", "%_", "'", "\\"]))


# ------------------------------------------------------------------------------ declarations

KINDS = ("once", "broadcast", "live")


@few(60)
@given(kind=st.sampled_from(KINDS), name=odd_names)
def test_valid_odd_names_declare_and_keep_their_name(kind, name):
    declared = getattr(signal, kind)(name, optional=True)
    assert declared.name == name and declared.kind == kind and declared.description == name


@few(60)
@given(kind=st.sampled_from(KINDS), name=names_with_a_control)
def test_a_control_character_in_a_name_is_a_value_error(kind, name):
    with pytest.raises(ValueError, match="control characters") as err:
        getattr(signal, kind)(name)
    assert f"signal.{kind}" in str(err.value)
    _one_line(err.value)


@few(30)
@given(kind=st.sampled_from(KINDS), name=st.one_of(st.just(""), st.text(name_chars, min_size=201, max_size=400)))
def test_empty_or_overlong_names_are_value_errors(kind, name):
    with pytest.raises(ValueError, match="1 to 200 characters") as err:
        getattr(signal, kind)(name)
    assert f"has {len(name)}" in str(err.value)


@few(30)
@given(kind=st.sampled_from(KINDS), name=st.one_of(st.integers(), st.none(), st.binary(), st.floats(),
                                                   st.lists(st.text()), st.builds(object), st.booleans()))
def test_names_that_are_not_strings_are_type_errors(kind, name):
    with pytest.raises(TypeError, match="the name must be a string") as err:
        getattr(signal, kind)(name)
    _one_line(err.value)


@few(80)
@given(text=st.one_of(st.text(max_size=30), st.from_regex(r"\A[0-9]{1,20}(ms|s|m|h|d|S|H|D)\Z"),
                      st.from_regex(r"\A[0-9]{1,4}(ms|s|m|h|d)[0-9]*\s*\Z"), st.integers(), st.floats(),
                      st.none(), st.binary(max_size=6)))
def test_retention_max_age_is_a_duration_or_the_spec_error(text):
    ms = parse_duration_ms(text)
    if ms is not None:
        assert isinstance(text, str) and re.fullmatch(r"[1-9][0-9]*(ms|s|m|h|d)", text)
        assert 1 <= ms <= MAX_DURATION_MS
        assert signal.live("tape", retention={"max_age": text}).retention_rule.max_age_ms == ms
        return
    if text is None:
        return  # None means unbounded
    with pytest.raises(ValueError) as err:
        signal.live("tape", retention={"max_age": text})
    assert str(err.value) == 'signal.live("tape"): retention.max_age must be a duration like "24h" or "30s"'


def test_durations_beyond_2_to_53_ms_are_refused():
    assert parse_duration_ms("104249991d") is not None  # 104,249,991 days < 2^53 ms
    for text in ("104249992d", "9999999999999999d", "9999999999999999h", "9007199254740992ms"):
        assert parse_duration_ms(text) is None, text
        with pytest.raises(ValueError, match="retention.max_age must be a duration"):
            signal.live("tape", retention={"max_age": text})
    assert parse_duration_ms("9007199254740991ms") == MAX_DURATION_MS


@few(40)
@given(count=st.one_of(st.integers(max_value=0), st.floats(), st.text(max_size=4), st.booleans(),
                       st.integers(min_value=1, max_value=2**80)))
def test_retention_max_count(count):
    if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
        assert signal.live("tape", retention={"max_count": count}).retention_rule.max_count == count
        return
    with pytest.raises(ValueError, match="max_count must be an integer ≥ 1"):
        signal.live("tape", retention={"max_count": count})


# ------------------------------------------------------------------------------ emit: payloads

def _one_line(err: BaseException) -> str:
    text = str(err)
    assert text and "\n" not in text and "\r" not in text, f"expected one line, got {text!r}"
    return text


class Doc(BaseModel):
    text: str
    extra: dict[str, Any] = {}


@pytest.fixture
async def shop(db_url):
    """An app on db_url with a once, a broadcast (two flows), a live and a schema'd signal; the
    handlers record (message id, payload as received)."""
    got: dict[str, list[tuple[str, Any]]] = {"jobs": [], "fan.a": [], "fan.b": [], "docs": []}
    jobs = signal.once("jobs", retries=0)
    fan = signal.broadcast("fan", retries=0)
    docs = signal.once("docs", schema=Doc, retries=0)
    tape = signal.live("tape", optional=True)
    on(jobs, flow("workers.jobs", do=lambda p, fx: got["jobs"].append((fx.message_id, p))))
    on(fan, flow("fan.a", do=lambda p, fx: got["fan.a"].append((fx.message_id, p))))
    on(fan, flow("fan.b", do=lambda p, fx: got["fan.b"].append((fx.message_id, p))))
    on(docs, flow("workers.docs", do=lambda p, fx: got["docs"].append((fx.message_id, p))))
    async with oke("hostile", database_url=db_url) as app:
        app.got = got  # type: ignore[attr-defined]
        app.handles = {"jobs": jobs, "fan": fan, "docs": docs, "tape": tape}  # type: ignore[attr-defined]
        yield app


async def _rows(db_url: str) -> dict[str, int]:
    counts = await table_counts(db_url)
    return {k: counts[k] for k in ("oke_messages", "oke_tape_events")}


def _loaded(text: str) -> tuple[str, str]:
    try:
        return "value", json.dumps(json.loads(text), ensure_ascii=False)
    except Exception as err:
        return type(err).__name__, str(err)


def _loaded_stored(text: str) -> tuple[str, str]:
    try:
        return "value", json.dumps(loads_stored(text), ensure_ascii=False)
    except Exception as err:
        return type(err).__name__, str(err)


_blank = st.sampled_from(["", " ", "\n", "\t ", "\r\n"])


@settings(base, max_examples=300)
@given(value=json_values, indent=st.sampled_from([None, 1]), before=_blank, after=_blank,
       tail=st.sampled_from(["", "x", "]", ",1", "}", "0"]))
def test_a_stored_payload_decodes_as_json_loads_would(value, indent, before, after, tail):
    """The worker's fast decode of a stored payload gives json.loads's value (compact or not,
    whitespace around it) and, for text that is not one JSON value, json.loads's own error."""
    text = before + json.dumps(value, ensure_ascii=False, indent=indent) + after + tail
    assert _loaded_stored(text) == _loaded(text)


@pytest.mark.parametrize("text", ["", " ", "nul", "{", '{"a":}', '"\\x"', "NaN", "-Infinity", "1e999", "[1,]", '"\ud800"'])
def test_odd_stored_payload_texts_decode_as_json_loads_would(text):
    assert _loaded_stored(text) == _loaded(text)


@few(25)
@given(values=st.lists(json_values, min_size=1, max_size=6))
async def test_valid_payloads_reach_the_handler_exactly(shop, values):
    """Unicode, NUL, U+2028, huge integers, -0.0, tuples: the handler gets the JSON of the value."""
    for got in shop.got.values():
        got.clear()
    ids = [await shop.emit("jobs", v) for v in values]
    fan_ids = [await shop.emit("fan", v) for v in values]
    await shop.drain()
    received = dict(shop.got["jobs"])
    assert sorted(received) == sorted(ids)
    for msg_id, value in zip(ids, values):
        assert same_json(received[msg_id], normalised(value)), (value, received[msg_id])
    assert len(fan_ids) == len(values)  # each broadcast copy has its own id: compare the payloads
    expected = sorted(json.dumps(normalised(v), ensure_ascii=False) for v in values)
    for flow_name in ("fan.a", "fan.b"):
        assert sorted(json.dumps(p, ensure_ascii=False) for _, p in shop.got[flow_name]) == expected


@few(15)
@given(values=st.lists(json_values, min_size=1, max_size=5))
async def test_valid_payloads_are_stored_as_their_exact_json_text(shop, db_url, values):
    ids = [await shop.emit("jobs", v) for v in values]
    rows = dict(await fetch(db_url, "SELECT id, payload FROM oke_messages"))
    for msg_id, value in zip(ids, values):
        assert json.loads(rows[msg_id]) == normalised(value)
        assert same_json(json.loads(rows[msg_id]), normalised(value))
        assert "\x00" not in rows[msg_id]  # a NUL travels escaped (PostgreSQL text cannot hold one)
    await shop.drain()


@few(20)
@given(text=json_text, extra=st.dictionaries(json_text, json_values, max_size=4))
async def test_schema_payloads_round_trip_through_the_model(shop, text, extra):
    shop.got["docs"].clear()
    msg_id = await shop.emit("docs", {"text": text, "extra": extra})
    await shop.drain()
    [(got_id, doc)] = shop.got["docs"]
    assert got_id == msg_id and isinstance(doc, Doc)
    assert doc.text == text and same_json(doc.extra, normalised(extra))


@few(12)
@given(wrap=bad_payload_wrappers, target=st.sampled_from(["jobs", "fan", "tape"]))
async def test_payloads_json_cannot_carry_are_oke1250_and_store_nothing(shop, db_url, wrap, target):
    """Every poison, planted somewhere in a generated valid payload. (A signal with a schema is its
    own contract: pydantic's JSON mode turns a set into a list, so "docs" is not a target here.)"""
    before = await _rows(db_url)
    for name in sorted(POISONS):
        with pytest.raises(OkeError) as err:
            await shop.emit(target, wrap(POISONS[name]()))
        assert err.value.code == 1250, (name, err.value)
        assert str(err.value).startswith(f'OKE1250: "{target}": ')
        _one_line(err.value)
        assert len(str(err.value)) < 600, "a message names the problem; it does not echo the payload"
    assert await _rows(db_url) == before


async def test_each_poison_names_its_problem(shop):
    expect = {
        "int key": "has a key that is not a string (int 1)",
        "int and str key": "has a key that is not a string",
        "tuple key": "has a key that is not a string (tuple (1, 2))",
        "too deep": f"nests deeper than {MAX_DEPTH} levels",
        "far too deep": f"nests deeper than {MAX_DEPTH} levels",
        "circular": "contains itself",
        "expanding": "the limit is 1048576 bytes",
        "huge": f"payload is {DEFAULT_MAX_PAYLOAD_BYTES + 14} bytes; the limit is {DEFAULT_MAX_PAYLOAD_BYTES} bytes",
        "lone surrogate": "lone surrogate",
        "surrogate key": "lone surrogate",
        "nan": "Out of range float values are not JSON compliant",
        "set": "Object of type set is not JSON serializable",
    }
    for name, fragment in expect.items():
        with pytest.raises(OkeError) as err:
            await shop.emit("jobs", {"outer": [POISONS[name]()]})
        assert fragment in str(err.value), (name, str(err.value))
    with pytest.raises(OkeError, match=r"payload\['a'\]\[0\]\['b'\] has a key"):
        await shop.emit("jobs", {"a": [{"b": {3: 4}}]})


async def test_a_value_shared_many_times_counts_wherever_it_appears(shop):
    """One list held in many places is fine while its copies fit; reused deeper than the limit
    allows it is refused there (the check remembers sizes and heights, it does not expand)."""
    shared = _deep(100)
    await shop.emit("jobs", {"a": shared, "b": [shared, shared]})
    deeper = shared
    for _ in range(MAX_DEPTH - 100 + 1):
        deeper = [deeper]
    with pytest.raises(OkeError, match=rf"payload\['b'\]\[0\]\[0\].*nests deeper than {MAX_DEPTH} levels"):
        await shop.emit("jobs", {"a": shared, "b": deeper})
    with pytest.raises(OkeError, match="the limit is 1048576 bytes"):
        await shop.emit("jobs", [["z" * 1000] * 100] * 100)  # 10 MB once expanded
    # one string under many keys of a flat object: refused by the count, before it is encoded
    with pytest.raises(OkeError, match="payload is more than 8388608 bytes; the limit is 1048576 bytes"):
        await shop.emit("jobs", {f"k{i}": "z" * 1000 for i in range(10_000)})
    await shop.drain()


async def test_the_deepest_allowed_payload_is_delivered(shop):
    shop.got["jobs"].clear()
    await shop.emit("jobs", _deep(MAX_DEPTH))
    await shop.emit("tape", {"d": _deep(MAX_DEPTH - 1)})
    await shop.drain()
    [(_id, value)] = shop.got["jobs"]
    assert value == _deep(MAX_DEPTH)


async def test_a_poisoned_emit_leaves_the_workers_running(shop, db_url):
    """Between rejected emits, good ones are still delivered, in order, by the same app."""
    shop.got["jobs"].clear()
    sent = []
    for i, name in enumerate(sorted(POISONS)):
        with pytest.raises(OkeError):
            await shop.emit("jobs", POISONS[name]())
        sent.append({"i": i, "after": name})
        await shop.emit("jobs", sent[-1])
    await shop.drain()
    assert sorted((p for _, p in shop.got["jobs"]), key=lambda p: p["i"]) == sent
    assert (await _rows(db_url))["oke_messages"] == len(sent)


# ------------------------------------------------------------------------------ emit: keys

@few(30)
@given(key=non_str_keys, target=st.sampled_from(["jobs", "fan", "tape"]))
async def test_keys_that_are_not_strings_are_type_errors(shop, db_url, key, target):
    before = await _rows(db_url)
    with pytest.raises(TypeError, match="key") as err:
        await shop.emit(target, {"a": 1}, key=key)
    _one_line(err.value)
    assert await _rows(db_url) == before


@few(30)
@given(key=bad_text_keys, target=st.sampled_from(["jobs", "fan"]))
async def test_bad_text_keys_are_value_errors_and_store_nothing(shop, db_url, key, target):
    before = await _rows(db_url)
    with pytest.raises(ValueError, match="key") as err:
        await shop.emit(target, {"a": 1}, key=key)
    _one_line(err.value)
    assert await _rows(db_url) == before


@few(20)
@given(keys=st.lists(good_keys, min_size=1, max_size=5))
async def test_valid_keys_are_stored_exactly(shop, db_url, keys):
    ids = [await shop.emit("jobs", {"n": n}, key=k) for n, k in enumerate(keys)]
    stored = dict(await fetch(db_url, "SELECT id, key FROM oke_messages"))
    assert [stored[i] for i in ids] == keys
    await shop.drain()


@pytest.mark.parametrize("key", ["a\x00b", "\ud800", "🦆" * 300], ids=["nul", "surrogate", "1200-bytes"])
async def test_a_bad_key_on_a_live_emit_is_refused_too(sqlite_url, key):
    tape = signal.live("tape", optional=True)
    async with oke("hostile", database_url=sqlite_url) as app:
        with pytest.raises(ValueError, match="key"):
            await app.emit(tape, {"a": 1}, key=key)


# ------------------------------------------------------------------------------ emit: names

@few(30)
@given(name=st.one_of(names_with_a_control, st.just(""), st.text(name_chars, min_size=201, max_size=300)))
async def test_bad_names_at_emit_are_value_errors(shop, name):
    with pytest.raises(ValueError) as err:
        await shop.emit(name, {"a": 1})
    _one_line(err.value)


async def test_odd_names_work_end_to_end(db_url):
    """Declare, emit, drain under names with slashes, dots, percent signs, unicode and spaces."""
    names = [".", "..", "a/b", "a/../b", "100%", "%2e%2e", "é ü", "日本語/注文", "🦆" * 200, "'\"\\", " lead",
             "trail ", "_oke", "x" * 200, "\uffff", "ﬃ"]
    got: list[tuple[str, Any]] = []
    handles = []
    for i, name in enumerate(names):
        handle = signal.once(name, retries=0)
        on(handle, flow(f"w{i}", do=lambda p, fx: got.append((fx.signal, p))))
        handles.append(handle)
    async with oke("odd", database_url=db_url) as app:
        for name in names:
            await app.emit(name, {"name": name})  # by name, not handle: the lookup is exact
        await app.drain()
        assert sorted(got) == sorted((n, {"name": n}) for n in names)
        from engine import ops

        known = await ops.known_signals(app.store)
        assert set(names) <= set(known)
        for name in names:
            assert (await ops.signal_info(app.store, name)) is not None, name


# ------------------------------------------------------------------------------ the console

runner = CliRunner()
FAILURE_TEXTS = ["it broke 100% _under_ 'quotes' \"dq\"", "back\\slash", "Plain failure", "percent % only",
                 "underscore_only", "ünïcode fäilure"]


class Flaky(Exception):
    code = "E_FLAKY"


@pytest.fixture(scope="module")
def console_store(tmp_path_factory):
    """A SQLite store with dead letters whose failure messages hold %, _, quotes and backslashes,
    a live tape of three events and an odd signal name. Module-scoped: the CLI only reads it
    (every replay and purge below is a --dry-run)."""
    import engine

    engine.reset()
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('console') / 'oke.db'}"

    async def fill() -> None:
        texts = iter(FAILURE_TEXTS)

        def fail(payload, fx):
            raise Flaky(payload["why"])

        jobs = signal.once("jobs", retries=0)
        odd = signal.once("odd name/é %_..", retries=0)
        tape = signal.live("tape é", optional=True)
        on(jobs, flow("workers.jobs", do=fail))
        on(odd, flow("workers.odd", do=fail))
        async with oke("console", database_url=url) as app:
            for i, why in enumerate(texts):
                await app.emit(jobs, {"why": why}, key=f"k{i % 2}")
            await app.emit(odd, {"why": "odd"})
            for n in range(3):
                await app.emit(tape, {"n": n, "text": "\u2028\x00"})
            await app.drain()

    asyncio.run(fill())
    engine.reset()
    return url


def cli(*args: str):
    return runner.invoke(cli_app, list(args), catch_exceptions=True)


def assert_clean_exit(result, allowed=(0, 1, 2)):
    """An exit code in `allowed`; on failure exactly one line on stderr; never a traceback."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"the CLI raised {type(result.exception).__name__}: {result.exception}") \
            from result.exception
    assert result.exit_code in allowed, (result.exit_code, result.stderr)
    assert "Traceback" not in result.stderr
    if result.exit_code != 0:
        lines = result.stderr.strip("\n").split("\n")
        if not lines[-1].startswith("Error: "):  # click's own usage errors end with one "Error:" line
            assert len(lines) == 1 and lines[0].startswith("okconsole: "), result.stderr
        assert result.stdout == "" or result.exit_code == 2 and "Usage" in result.stderr


def ndjson_lines(text: str) -> list[str]:
    """NDJSON lines, also as str.splitlines() would see them: U+2028 in a payload must not split."""
    lines = text.split("\n")
    assert lines[-1] == "", "NDJSON ends with a newline"
    assert text.splitlines() == lines[:-1], "a line break other than \\n in NDJSON output"
    return lines[:-1]


def dry_run_count(result) -> int:
    assert_clean_exit(result, (0,))
    return json.loads(result.stdout)["would_replay"]


durations = st.one_of(st.text(max_size=12), st.from_regex(r"\A[0-9]{1,18}(ms|s|m|h|d)\Z"),
                      st.sampled_from(["9999999999999999d", "0s", "1.5h", "1h30m", "30s\n", " 30s", "-5m",
                                       "٣s", "３s", "1e3s", "0x10s", "104249991d", "104249992d"]))


@few(40)
@given(text=durations, command=st.sampled_from(["replay", "purge"]))
def test_older_than_is_a_duration_or_exit_2(console_store, text, command):
    args = (["replay", "jobs", "--all"] if command == "replay" else ["purge", "jobs", "--status", "dead"])
    result = cli("--db", console_store, *args, "--older-than", text, "--dry-run", "--json")
    valid = parse_duration_ms(text) is not None
    if "\x00" in text:
        valid = False
    assert_clean_exit(result, (0,) if valid else (2,))
    if not valid and "\x00" not in text:
        assert "--older-than" in result.stderr


@few(40)
@given(text=st.one_of(st.text(max_size=10), st.from_regex(r"\A[0-9]{1,400}(\.[0-9]{1,3})?(/(s|m|h|min|sec))?\Z"),
                      st.sampled_from(["inf", "nan", "1e9999", "0", "0/s", "-1/s", "1/d", "١/s"])))
def test_rate_is_a_rate_or_exit_2(console_store, text):
    result = cli("--db", console_store, "replay", "jobs", "--all", "--rate", text, "--dry-run", "--json")
    assert_clean_exit(result, (0, 2))
    if result.exit_code == 2 and "\x00" not in text:
        assert "--rate" in result.stderr


@few(40)
@given(value=st.one_of(st.integers(), st.integers(min_value=2**62, max_value=2**200).map(str),
                       st.text(max_size=8)),
       command=st.sampled_from(["messages", "dlq", "audit", "tail"]))
def test_limits_and_counts_never_crash(console_store, value, command):
    value = str(value)
    try:
        number: int | None = int(value)  # what the option parser accepts: " 7", "+7", "1_000", "٣"
    except ValueError:
        number = None
    positive = number is not None and number >= 1
    if command == "tail" and positive and number > 3:
        return  # --count beyond the tape waits for more events: not a hostile-input question
    args = {
        "messages": ["messages", "jobs", "--limit", value],
        "dlq": ["dlq", "jobs", "--json", "--limit", value],
        "audit": ["audit", "--limit", value],
        "tail": ["tail", "tape é", "--from-start", "--json", "--count", value],
    }[command]
    result = cli("--db", console_store, *args)
    assert_clean_exit(result, (0,) if positive else (2,))
    if command == "tail" and positive:
        assert len(ndjson_lines(result.stdout)) == number


match_text = st.text(st.sampled_from(list("%_\\'\"ab -ünïcodePlainitbroke")), max_size=8)


@few(50)
@given(text=match_text)
def test_match_takes_percent_underscore_and_quotes_literally(console_store, text):
    result = cli("--db", console_store, "replay", "jobs", "--all", "--match", text, "--dry-run", "--json")
    expected = sum(1 for why in FAILURE_TEXTS if text.lower() in why.lower())
    assert dry_run_count(result) == expected, (text, result.stdout)


arbitrary_args = st.one_of(st.text(max_size=30), st.sampled_from(["\x00", "a\x00b", "\udcff", "x" * 5000, "--",
                                                                  "-x", "%", "_", "'", "..", "/"]))


@few(60)
@given(value=arbitrary_args,
       command=st.sampled_from(["messages", "show", "dlq", "failures", "trace", "replay-id", "replay-signal",
                                "replay-key", "replay-code", "messages-key", "purge", "tail-store"]))
def test_arbitrary_names_ids_and_filters_exit_cleanly(console_store, value, command):
    assume(not value.startswith("-"))  # an option, not a value: click's own usage errors cover those
    args = {
        "messages": ["messages", value],
        "show": ["show", value],
        "dlq": ["dlq", value],
        "failures": ["failures", value],
        "trace": ["trace", value],
        "replay-id": ["replay", "jobs", value, "--dry-run", "--json"],
        "replay-signal": ["replay", value, "--all", "--dry-run", "--json"],
        "replay-key": ["replay", "jobs", "--all", "--key", value, "--dry-run", "--json"],
        "replay-code": ["replay", "jobs", "--all", "--code", value, "--dry-run", "--json"],
        "messages-key": ["messages", "jobs", "--key", value, "--json"],
        "purge": ["purge", value, "--status", "dead", "--dry-run", "--json"],
        "tail-store": ["tail", value, "--count", "1", "--from-start"],
    }[command]
    result = cli("--db", console_store, *args)
    assert_clean_exit(result, (0, 2))
    if "\x00" in value or "\udcff" in value:
        assert result.exit_code == 2
        assert "NUL" in result.stderr or "not valid UTF-8" in result.stderr


@few(30)
@given(after=st.one_of(st.text(max_size=40), st.sampled_from(["\x00", "\udcff", "é", "a\nb", "zz.1", ""])))
def test_tail_after_any_cursor_from_the_store(console_store, after):
    """A cursor the tape cannot honour warns and restarts from the oldest retained event."""
    result = cli("--db", console_store, "tail", "tape é", "--after", after, "--count", "1", "--json")
    if "\x00" in after or "\udcff" in after:
        assert_clean_exit(result, (2,))
        return
    assert_clean_exit(result, (0,))
    [line] = ndjson_lines(result.stdout)
    event = json.loads(line)
    assert event["data"] == {"n": 0, "text": "\u2028\x00"}
    if after:
        assert "cannot be resumed" in result.stderr


def test_the_names_and_payloads_of_the_store_print_exactly(console_store):
    result = cli("--db", console_store, "messages", "odd name/é %_..", "--json")
    assert_clean_exit(result, (0,))
    assert len(json.loads(result.stdout)) == 1
    result = cli("--db", console_store, "tail", "tape é", "--from-start", "--count", "3", "--json")
    assert_clean_exit(result, (0,))
    assert [json.loads(line)["data"] for line in ndjson_lines(result.stdout)] == \
        [{"n": n, "text": "\u2028\x00"} for n in range(3)]


@few(40)
@given(url=st.one_of(st.text(max_size=40),
                     st.sampled_from(["", "://", "garbage", "foo://x", "mysql+aiomysql://u@h/db",
                                      "postgresql+asyncpg://u@h:notaport/db", "postgresql+asyncpg://u@[::1/db",
                                      "postgresql+psycopg://u@127.0.0.1/db", "sqlite+pysqlite:///nope.db",
                                      "sqlite+aiosqlite:///" + "a" * 5000, "sqlite+aiosqlite:////proc/nope.db",
                                      "sqlite+aiosqlite:////tmp/\x00.db", "sqlite+aiosqlite:////tmp/\udcff.db",
                                      "sqlite+aiosqlite:////etc/passwd", "sqlite+aiosqlite:////tmp"])))
def test_bad_db_urls_exit_1_or_2_with_one_line(tmp_path_factory, url):
    assume(not re.search(r"postgres|:\d", url) or "127.0.0.1" in url or "notaport" in url or "[::1" in url)
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))  # a relative sqlite path must not find or create a store
    try:
        result = cli("--db", url, "stats", "--json")
    finally:
        os.chdir(cwd)
    if url == "":
        return  # an empty --db is no --db: the default store (absent here)
    assert_clean_exit(result, (1, 2))


UNREACHABLE = ["postgresql+asyncpg://postgres@127.0.0.1:1/nope", "postgresql+asyncpg://u@no-such-host.invalid/db"]


@pytest.mark.parametrize("url", UNREACHABLE)
def test_unreachable_stores_exit_1_with_one_line(url):
    result = cli("--db", url, "stats")
    assert_clean_exit(result, (1,))
    assert "cannot reach" in result.stderr


@pytest.mark.parametrize("args, fragment", [
    (["serve", "cli_apps.served:app", "--host", "\x00"], "--host"),
    (["serve", "cli_apps.served:app", "--host", "no-such-host.invalid", "--port", "6599"], "--host"),
    (["serve", "cli_apps.served:app", "--port", "99999999999999999999"], "--port"),
    (["serve", "cli_apps.served:__class__"], "raised TypeError"),
    (["serve", "..:x"], "serve:"),
    (["serve", "\udcff:x"], "serve:"),
    (["demo", "--headless", "--seconds", "nan"], "--seconds"),
    (["demo", "--headless", "--seconds", "inf"], "--seconds"),
    (["demo", "--headless", "--seconds", "-1"], "--seconds"),
    (["tail", "tape é", "--url", "http://[::1"], "--url"),
    (["tail", "tape é", "--url", "garbage"], "--url"),
    (["tail", "tape é", "--url", "ftp://127.0.0.1/"], "--url"),
    (["tail", "tape é", "--url", "http://127.0.0.1:1", "--token", "é"], "--token"),
    (["tail", "tape é", "--url", "http://127.0.0.1:1", "--token", "a\nb"], "--token"),
    (["tail", "tape é", "--from-start", "--from-end"], "choose one"),
])
def test_long_running_commands_refuse_bad_arguments_before_starting(console_store, monkeypatch, args, fragment):
    monkeypatch.setenv("OKE_DATABASE_URL", console_store)
    monkeypatch.chdir(os.path.dirname(__file__))
    result = cli("--db", console_store, *args)
    assert_clean_exit(result, (2,))
    assert fragment in result.stderr


# ------------------------------------------------------------------------------ real processes

def _okconsole(*args: str | bytes, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "okconsole", *args], capture_output=True, timeout=60,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args, code", [
    ([b"messages", b"\xff\xfe"], 2),                                   # argv that is not UTF-8
    ([b"replay", b"jobs", b"--all", b"--older-than", b"9999999999999999d", b"--dry-run"], 2),
    ([b"messages", b"jobs", b"--limit", b"99999999999999999999"], 0),
    ([b"--db", b"postgresql+asyncpg://u@h:notaport/db", b"stats"], 2),  # a bad --db URL: bad usage
    ([b"--db", b"garbage", b"stats"], 1),
])
def test_subprocess_exits_cleanly(console_store, args, code):
    done = _okconsole("--db", console_store, *args)
    assert done.returncode == code, done.stderr
    assert b"Traceback" not in done.stderr
    if code:
        assert len(done.stderr.strip().split(b"\n")) == 1 and done.stderr.startswith(b"okconsole: ")


def test_subprocess_tail_after_a_cursor_that_is_not_utf8(console_store):
    done = _okconsole("--db", console_store, "tail", "tape é", "--after", b"\xff", "--count", "1")
    assert done.returncode == 2 and b"--after" in done.stderr and b"Traceback" not in done.stderr

