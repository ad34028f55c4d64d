"""engine.http.limits: the body budget of one request and the max_connections check."""

from __future__ import annotations

import pytest

from engine.http.limits import BODY_SLACK_BYTES, BodyLimit, PayloadTooLarge, check_max_connections


def scope(*headers: tuple[bytes, bytes]) -> dict:
    return {"type": "http", "headers": list(headers)}


def test_the_limit_is_the_payload_limit_plus_64_kib() -> None:
    assert BodyLimit(1000).limit == 1000 + BODY_SLACK_BYTES == 1000 + 65536


@pytest.mark.parametrize(
    ("value", "over"),
    [
        (b"0", False),
        (b"66536", False),  # exactly the limit
        (b"66537", True),
        (b" 66537 ", True),
        (b"100000000", True),
        (b"9" * 30, True),  # more digits than any int the server would parse into memory
        (b"00000000000000000000066536", False),  # leading zeros: still the limit
        (b"00000000000000000000066537", True),
        (b"-5", False),  # not a length: left to the parser and to the counting
        (b"1e9", False),
        (b"\xef\xbc\x91", False),  # a full-width digit is not a digit here
    ],
)
def test_a_declared_length_over_the_limit_is_refused_up_front(value: bytes, over: bool) -> None:
    assert BodyLimit(1000).declared_over(scope((b"content-length", value))) is over


def test_no_length_is_not_over() -> None:
    assert BodyLimit(1000).declared_over(scope((b"transfer-encoding", b"chunked"))) is False
    assert BodyLimit(1000).declared_over({"type": "http"}) is False


async def test_a_streamed_body_is_counted_and_refused_once_past_the_limit() -> None:
    chunks = [b"x" * 40_000, b"x" * 26_536, b"", b"x"]  # 66,536 bytes, an empty one, then one more
    sent: list[dict] = []

    async def receive() -> dict:
        chunk = chunks.pop(0)
        message = {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
        sent.append(message)
        return message

    counted = BodyLimit(1000).counting(receive)
    for _ in range(3):
        assert (await counted())["type"] == "http.request"  # up to the limit: handed on
    with pytest.raises(PayloadTooLarge) as refused:
        await counted()
    assert (refused.value.status, refused.value.code) == (413, "PayloadTooLarge")
    assert str(refused.value) == "the request body is over 66536 bytes (max_payload_bytes + 65536)"


async def test_a_disconnect_is_handed_on_uncounted() -> None:
    async def receive() -> dict:
        return {"type": "http.disconnect"}

    assert await BodyLimit(0).counting(receive)() == {"type": "http.disconnect"}


@pytest.mark.parametrize("bad", [0, -1, 1.5, "10", None, True, False])
def test_max_connections_is_an_int_of_at_least_1(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^oke\(max_connections=\.\.\.\): an int ≥ 1 "):
        check_max_connections(bad)


def test_max_connections_accepts_an_int() -> None:
    assert check_max_connections(1) == 1
    assert check_max_connections(10_000) == 10_000
