"""okconsole.web_gate's rules on their own: which Host and Origin pass, the token and its cookie,
the session slots; and the console's store adapter, which gives every write its session's source."""

from __future__ import annotations

import asyncio

import pytest

from okconsole.commands.web import SOURCE_ENV, WEB_DRIVER, web_source
from okconsole.data import StoreAdapter
from okconsole.web_gate import AllowedHosts, SessionSlots, TokenCheck, check_token, new_token, same_origin


def test_the_default_hosts_are_the_bound_one_localhost_and_127_0_0_1_with_the_port() -> None:
    hosts = AllowedHosts("127.0.0.1", 8000)
    for host in ("127.0.0.1:8000", "localhost:8000", "LOCALHOST:8000"):
        assert hosts.allows(host), host
    for host in (
        "evil.example:8000",
        "127.0.0.1:8001",
        "localhost",
        "127.0.0.1",
        "",
        " ",
        "a b:8000",
        "localhost:8000@evil.example",
        "localhost:8000/x",
        "[::1]:8000",
    ):
        assert not hosts.allows(host), host
    assert AllowedHosts("::1", 8000).allows("[::1]:8000")
    assert AllowedHosts("0.0.0.0", 8000).allows("localhost:8000")


def test_an_allowed_host_takes_the_served_port_unless_it_names_one() -> None:
    hosts = AllowedHosts("127.0.0.1", 8000, ["console.test", "ops.example.com:443", "[fd00::1]"])
    assert hosts.allows("console.test:8000") and not hosts.allows("console.test:9000")
    assert hosts.allows("ops.example.com:443")
    assert hosts.allows("ops.example.com")  # a browser leaves out the default port of https
    assert not hosts.allows("ops.example.com:8000") and not hosts.allows("console.test")
    assert hosts.allows("[fd00::1]:8000")
    # the page's own URLs: https only where a browser left out the port of a name allowed at 443
    assert hosts.https("ops.example.com") and not hosts.https("ops.example.com:443")
    assert not hosts.https("console.test:8000") and not hosts.https("127.0.0.1:8000") and not hosts.https("x y")


@pytest.mark.parametrize(
    "entry", ["", "evil/x", "a b", "user@host", "a.test:0", "a.test:70000", "a.test:x", "http://a"]
)
def test_a_bad_allowed_host_is_refused(entry: str) -> None:
    with pytest.raises(ValueError):
        AllowedHosts("127.0.0.1", 8000, [entry])


def test_the_origin_must_be_the_host_the_request_was_sent_to() -> None:
    assert same_origin("http://127.0.0.1:8000", "127.0.0.1:8000")
    assert same_origin("https://ops.example.com", "ops.example.com")
    for origin in (
        None,
        "",
        "null",
        "http://127.0.0.1:8001",
        "http://localhost:8000",
        "ws://127.0.0.1:8000",
        "http://127.0.0.1:8000.evil.example",
        "file://127.0.0.1:8000",
    ):
        assert not same_origin(origin, "127.0.0.1:8000"), origin


def test_a_token_must_not_be_empty_and_a_made_one_is_long_and_url_safe() -> None:
    for bad in ("", " ", "\t\n"):
        with pytest.raises(ValueError, match="empty"):
            check_token(bad)
    with pytest.raises(ValueError, match="UTF-8"):
        check_token("bad\udcff")  # undecodable bytes in OKE_WEB_TOKEN
    assert check_token("x") == "x"
    made = {new_token() for _ in range(20)}
    assert len(made) == 20 and all(len(t) >= 40 and t.replace("-", "").replace("_", "").isalnum() for t in made)


def test_the_cookie_reveals_nothing_of_the_token_and_changes_with_each_start() -> None:
    first, second = TokenCheck("s3cret", 8000), TokenCheck("s3cret", 8000)
    assert "s3cret" not in first.cookie_value and len(first.cookie_value) == 64
    assert first.cookie_value != second.cookie_value
    assert first.cookie_name == "okconsole-web-8000"


def test_session_slots_hold_their_limit_and_come_back() -> None:
    slots = SessionSlots(2)
    assert slots.take() and slots.take() and not slots.take()
    slots.give_back()
    assert slots.take() and not slots.take()
    for bad in (0, -1):
        with pytest.raises(ValueError):
            SessionSlots(bad)


def test_a_web_session_reads_its_source_only_under_the_web_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SOURCE_ENV, "web 192.0.2.7:5000")
    monkeypatch.delenv("TEXTUAL_DRIVER", raising=False)
    assert web_source() is None  # a stray variable in a terminal labels nothing
    monkeypatch.setenv("TEXTUAL_DRIVER", WEB_DRIVER)
    assert web_source() == "web 192.0.2.7:5000"


def test_the_console_adapter_gives_each_write_its_source_and_reads_none() -> None:
    calls: list[dict] = []

    async def op(_store: object, *args: object, **kwargs: object) -> str:
        calls.append(kwargs)
        return "done"

    adapter = StoreAdapter("sqlite+aiosqlite:////nonexistent/x.db", source="web 192.0.2.7:5000")
    adapter.store = object()  # already open: no database is touched
    asyncio.run(adapter.call(op, "sig", actor="ann", reason="r"))
    asyncio.run(adapter.call(op, "sig", limit=5))
    assert calls == [{"actor": "ann", "reason": "r", "source": "web 192.0.2.7:5000"}, {"limit": 5}]
    plain = StoreAdapter("sqlite+aiosqlite:////nonexistent/x.db")
    plain.store = object()
    asyncio.run(plain.call(op, "sig", actor="ann", reason="r"))
    assert calls[-1] == {"actor": "ann", "reason": "r"}
