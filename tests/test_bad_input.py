"""Bad input gets a clear error and stores nothing; an unreachable store fails boot in one line."""

from __future__ import annotations

import os
import stat

import pytest

from engine import OkeError, StoreUnavailable, flow, oke, on, signal
from engine.payloads import DEFAULT_MAX_PAYLOAD_BYTES
from workers.db import table_counts


def _circular():
    d: dict = {}
    d["self"] = d
    return d


def _deep(n):
    value: list = []
    for _ in range(n):
        value = [value]
    return value


class Opaque:
    pass


NOT_JSON = {
    "set": {1, 2},
    "object": object(),
    "nan": float("nan"),
    "inf": float("inf"),
    "nested_nan": {"a": [1, float("-inf")]},
    "bytes": b"raw",
    "instance": Opaque(),
    "tuple_key": {(1, 2): "x"},
    "circular": _circular(),
    "too_deep": _deep(100_000),
    "lone_surrogate": {"s": "\ud800"},
    "function": print,
}


@pytest.fixture
async def app(db_url):
    jobs = signal.once("jobs")
    on(jobs, flow("workers.jobs", do=lambda p, fx: None))
    async with oke("t", database_url=db_url) as started:
        yield started
    assert await table_counts(db_url) == {"oke_messages": 0, "oke_failures": 0, "oke_runs": 0,
                                          "oke_tape_events": 0}, "bad input must store nothing"


@pytest.mark.parametrize("name", sorted(NOT_JSON))
async def test_non_json_payload_is_oke1250(app, name):
    with pytest.raises(OkeError) as err:
        await app.emit("jobs", NOT_JSON[name])
    assert err.value.code == 1250
    assert str(err.value).startswith('OKE1250: "jobs": ')
    assert "\n" not in str(err.value)


async def test_payload_over_the_limit_is_oke1250(app):
    huge = "x" * DEFAULT_MAX_PAYLOAD_BYTES  # its JSON has two quotes more
    with pytest.raises(OkeError) as err:
        await app.emit("jobs", huge)
    assert err.value.code == 1250
    assert f"payload is {DEFAULT_MAX_PAYLOAD_BYTES + 2} bytes; the limit is {DEFAULT_MAX_PAYLOAD_BYTES}" \
        in str(err.value)


async def test_payload_limit_counts_utf8_bytes(app):
    wide = "é" * (DEFAULT_MAX_PAYLOAD_BYTES // 2)  # 2 bytes each in UTF-8, plus quotes
    with pytest.raises(OkeError, match=r"^OKE1250"):
        await app.emit("jobs", {"s": wide})


async def test_payload_exactly_at_the_limit_is_stored(db_url):
    jobs = signal.once("jobs")
    got = []
    on(jobs, flow("workers.jobs", do=lambda p, fx: got.append(len(p))))
    async with oke("t", database_url=db_url, max_payload_bytes=1000) as app:
        await app.emit(jobs, "y" * 998)
        with pytest.raises(OkeError, match=r"^OKE1250.*1001 bytes; the limit is 1000 bytes"):
            await app.emit(jobs, "y" * 999)
        await app.drain()
    assert got == [998]
    assert (await table_counts(db_url))["oke_messages"] == 1


@pytest.mark.parametrize("name, exc", [
    ("", ValueError), ("x" * 201, ValueError), ("a\x00b", ValueError), ("a\nb", ValueError),
    (42, TypeError), (None, TypeError), (b"jobs", TypeError), ("undeclared", LookupError),
])
async def test_bad_signal_names_at_emit(app, name, exc):
    with pytest.raises(exc):
        await app.emit(name, {"a": 1})


@pytest.mark.parametrize("key, exc", [
    (1, TypeError), (1.5, TypeError), (b"usr_1", TypeError), (("a",), TypeError), (["a"], TypeError),
    (True, TypeError), ("", ValueError), ("k" * 1001, ValueError),
    ("a\x00b", ValueError),   # PostgreSQL text cannot hold NUL: refused on both backends
    ("\ud800", ValueError),   # not encodable as UTF-8
])
async def test_bad_keys_at_emit(app, key, exc):
    with pytest.raises(exc) as err:
        await app.emit("jobs", {"a": 1}, key=key)
    assert "key" in str(err.value)


def _astral(count: int, seed: int = 7) -> str:
    """`count` random 4-byte UTF-8 characters (incompressible, unlike repeating one)."""
    import random

    rnd = random.Random(seed)
    return "".join(chr(rnd.randint(0x10000, 0x1F000)) for _ in range(count))


async def test_a_key_over_1000_utf8_bytes_is_refused(app):
    """700 astral characters are under the 1000-character limit but 2800 bytes: too big to index."""
    with pytest.raises(ValueError, match="key") as err:
        await app.emit("jobs", {"a": 1}, key=_astral(700))
    assert "bytes" in str(err.value)


async def test_the_largest_names_and_keys_are_stored_and_delivered(db_url):
    name = _astral(200, seed=1)
    jobs = signal.once(name)
    got = []
    worker = flow(_astral(200, seed=2), do=lambda p, fx: got.append((p, fx.signal)))
    on(jobs, worker)
    keys = ["k" * 1000, _astral(250, seed=3)]  # 1000 characters; 1000 bytes
    async with oke("t", database_url=db_url) as app:
        for key in keys:
            await app.emit(jobs, {"key": key}, key=key)
        await app.drain()
    assert got == [({"key": k}, name) for k in keys]
    assert (await table_counts(db_url))["oke_messages"] == 2


async def test_unknown_emit_option_is_a_type_error(app):
    with pytest.raises(TypeError):
        await app.emit("jobs", {"a": 1}, lease_ms=5)


# --------------------------------------------------------------------------- unreachable stores

def _one_line(err: BaseException) -> str:
    text = str(err)
    assert text and "\n" not in text, f"expected a one-line reason, got {text!r}"
    return text


async def test_unreachable_postgres_at_boot_is_store_unavailable():
    signal.once("jobs", optional=True)
    with pytest.raises(StoreUnavailable) as err:
        async with oke("t", database_url="postgresql+asyncpg://postgres@127.0.0.1:1/x"):
            pass
    text = _one_line(err.value)
    assert "127.0.0.1:1" in text


async def test_postgres_database_that_does_not_exist_is_store_unavailable(pg_cluster):
    url = pg_cluster.sqlalchemy_url("oke_no_such_database_here")
    with pytest.raises(StoreUnavailable) as err:
        async with oke("t", database_url=url):
            pass
    assert "oke_no_such_database_here" in _one_line(err.value)


@pytest.mark.parametrize("where", ["proc", "under_a_file", "readonly_dir"])
async def test_sqlite_in_a_non_writable_place_is_store_unavailable(tmp_path, where):
    if where == "proc":
        path = "/proc/oke-cannot-live-here.db"  # a directory nobody may create files in, root included
    elif where == "under_a_file":
        blocker = tmp_path / "a-file"
        blocker.write_text("not a directory")
        path = str(blocker / "oke.db")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes to read-only directories; /proc covers this case")
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
        path = str(ro / "oke.db")
    with pytest.raises(StoreUnavailable) as err:
        async with oke("t", database_url=f"sqlite+aiosqlite:///{path}"):
            pass
    assert path in _one_line(err.value)


@pytest.mark.parametrize("url", ["nonsense", "mysql+aiomysql://u@h/db", "sqlite+aiosqlite:///:memory:",
                                 "postgresql+psycopg://u@127.0.0.1/db"])
async def test_unusable_urls_are_store_unavailable(url):
    with pytest.raises(StoreUnavailable) as err:
        async with oke("t", database_url=url):
            pass
    _one_line(err.value)


def test_app_name_and_worker_id_fit_the_store():
    from engine import oke as make_app

    with pytest.raises(ValueError, match="at most 200"):
        make_app("a" * 201)
    with pytest.raises(ValueError, match="worker id"):
        make_app("ok", worker_id="w" * 201)
    assert make_app("a" * 200, worker_id="w" * 200).worker_id == "w" * 200
