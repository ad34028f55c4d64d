"""Hostile input over HTTP, generated with hypothesis (issue #5, item 3), on SQLite and PostgreSQL.

Requests go byte for byte over a socket to a real uvicorn on 127.0.0.1 (no client normalises `..`,
`//` or `%xx` on the way), except where the Python client itself is the subject.

- SSE cursors: any string in `?lastEventId=` and any bytes in `Last-Event-ID` get a stream or a
  410 envelope whose reason an independent model of the tape predicts; never a 500, never a hang.
- URL paths: generated from spellings of the real segments (each character percent-encoded or not,
  in either case), dot segments, encoded slashes, double encoding, NUL, invalid UTF-8 and overlong
  paths. A model of the routing rules predicts every status, with and without credentials, so a
  gate reached through any spelling still asks for its token.
- Live signal names with slashes, dots, percent signs and unicode are served at their
  encodeURIComponent path and followed by the Python client; payloads holding NUL, U+2028 and
  the like arrive exactly as emitted.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import select
import socket
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator
from urllib.parse import quote, unquote

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import Forbidden, Unauthorized, flow, gate, http, oke, on, signal
from engine.client import Client, ClientError, LiveResumeGap
from engine.http.routes import live_path
from livekit import serving
from test_hostile_input import few, json_values, name_chars, normalised, same_json

TOKEN = "Bearer s3cret"
AUTH = {"Authorization": TOKEN}
ADMIN = {**AUTH, "X-Role": "admin"}
ORDER_EVENTS = 8
RETAINED = 5  # order-status keeps the newest 5: pruned through 3
ODD_NAMES = [".", "..", "...", "a/b", "a/../b", "100%", "%2e%2e", "%", "é ü", "日本語/注文", "🦆", "?#&=+",
             "'\"\\", " ", "a b", "_oke", "live", "x" * 180, "\ufffd", "ﬃ", "(*)!~"]
# (longer names: see test_a_live_signal_with_a_200_character_name_boots)


def encode_uri_component(text: str) -> str:
    """JavaScript's encodeURIComponent."""
    return quote(text, safe="-_.!~*'()")


# ------------------------------------------------------------------------------ the server

def bearer(request):
    if request.headers.get("authorization") != TOKEN:
        raise Unauthorized("missing or wrong token")
    return {"user": "ops"}


def admin_only(request):
    if request.headers.get("x-role") != "admin":
        raise Forbidden("admins only")
    return {"role": "admin"}


@dataclass
class Served:
    app: Any
    base: str
    port: int
    epoch: str
    head: int
    pruned_through: int
    firehoses: dict[str, bool] = field(default_factory=dict)  # name -> public


@contextlib.asynccontextmanager
async def shop_server(db_url: str, odd_names: list[str] = ODD_NAMES) -> AsyncIterator[Served]:
    member = gate("member", bearer)
    admin = gate("admin", admin_only)
    status = signal.live("order-status", retention={"max_count": RETAINED})
    public = signal.live("public")
    on(http.live(status).gate(member))
    on(http.get("/orders/:orderId/events").gate(member).live(status))
    on(http.live(public).public())
    on(http.get("/admin/stats").gate(member, admin), flow("admin.stats", do=lambda v, fx: {"s": "TOP-SECRET"}))
    on(http.get("/pub/:page").public(), flow("pages", do=lambda v, fx: {"page": v["page"]}))
    odd = {name: signal.live(name) for name in odd_names if name not in ("order-status", "public")}
    for handle in odd.values():
        on(http.live(handle).gate(member))
    app = oke("hostile-http", database_url=db_url)
    async with app, serving(app) as base:
        ids = [await app.emit(status, {"orderId": "o1", "n": n, "secret": "TOP-SECRET"}) for n in range(ORDER_EVENTS)]
        await app.emit(public, {"tape": "public"})
        for name, handle in odd.items():
            await app.emit(handle, {"name": name, "secret": "TOP-SECRET"})
        epoch = ids[0].split(".")[0]
        served = Served(app, base, int(base.rsplit(":", 1)[1]), epoch, ORDER_EVENTS, ORDER_EVENTS - RETAINED,
                        {"order-status": False, "public": True, **{n: False for n in odd}})
        yield served


@pytest.fixture
async def served(db_url):
    async with shop_server(db_url) as s:
        yield s


# ------------------------------------------------------------------------------ raw HTTP

@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    frame: bytes | None = None  # the first SSE frame of a stream, when asked for

    @property
    def is_stream(self) -> bool:
        return self.headers.get("content-type", "").startswith("text/event-stream")

    def json(self) -> Any:
        return json.loads(self.body)


async def exchange(port: int, target: bytes, headers: list[tuple[bytes, bytes]] = (), *, method: bytes = b"GET",
                   first_frame: bool = False, timeout: float = 5.0) -> Reply:
    """One request written byte for byte; the head, then the body (or a stream's first frame)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = [method + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close"]
        head += [k + b": " + v for k, v in headers]
        writer.write(b"\r\n".join(head) + b"\r\n\r\n")
        await writer.drain()
        async with asyncio.timeout(timeout):  # never a hang: the head comes at once
            raw = await reader.readuntil(b"\r\n\r\n")
        status_line, *lines = raw.decode("latin-1").split("\r\n")
        found = {}
        for line in lines:
            if ":" in line:
                k, _, v = line.partition(":")
                found[k.strip().lower()] = v.strip()
        reply = Reply(int(status_line.split(" ")[1]), found, b"")
        async with asyncio.timeout(timeout):
            if reply.is_stream:
                if first_frame:
                    reply.frame = await _first_frame(reader)
            elif method == b"HEAD" or reply.status in (204, 304):
                pass
            elif "content-length" in found:
                reply.body = await reader.readexactly(int(found["content-length"]))
            else:
                reply.body = await reader.read()
        return reply
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _first_frame(reader: asyncio.StreamReader) -> bytes:
    """De-chunk the body until one SSE frame (ending in a blank line) is complete."""
    data = b""
    while b"\n\n" not in data:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        if size == 0:
            break
        data += await reader.readexactly(size)
        await reader.readexactly(2)
    return data.split(b"\n\n", 1)[0] + b"\n\n"


def frame_data(frame: bytes | None) -> Any:
    assert frame is not None
    for line in frame.split(b"\n"):
        if line.startswith(b"data: "):
            return json.loads(line[6:].decode("utf-8"))
    return None


def assert_gap_envelope(reply: Reply, signal_name: str, cursor: str) -> str:
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert body["data"] is None
    error = body["error"]
    assert (error["code"], error["oke"]) == ("LiveResumeGap", 1210)
    quoted = cursor[:128]  # a 410 quotes at most 128 characters of the cursor
    assert error["message"] == f'Cursor "{quoted}" missing on "{signal_name}".'
    assert error["data"]["signal"] == signal_name and error["data"]["afterId"] == quoted
    assert error["data"]["reason"] in ("malformed", "reset", "unknown", "pruned")
    return error["data"]["reason"]


# ------------------------------------------------------------------------------ cursors

def cursor_verdict(s: Served, cursor: str) -> tuple[int, str | None, int | None]:
    """(status, 410 reason, seq to resume after) for a cursor on order-status, from."""
    if cursor == "":
        return 200, None, None  # an empty cursor is no cursor
    found = re.fullmatch(r"([0-9a-z]{1,40})\.(0|[1-9][0-9]{0,17})", cursor)
    if found is None:
        return 410, "malformed", None
    if found.group(1) != s.epoch:
        return 410, "reset", None
    seq = int(found.group(2))
    if seq > s.head:
        return 410, "unknown", None
    if seq < s.pruned_through:
        return 410, "pruned", None
    return 200, None, seq


def cursors(epoch: str) -> st.SearchStrategy[str]:
    seqs = st.one_of(st.integers(-3, ORDER_EVENTS + 3).map(str), st.integers(0, 10**25).map(str),
                     st.sampled_from(["", "00", "01", "1.0", "1e3", "٣", "３", " 4", "4 ", "4\n", "+4", "0x4"]))
    epochs = st.sampled_from([epoch, epoch.upper(), epoch + "0", epoch[:-1], "", "zzzz", "0" * 41, epoch + " "])
    return st.one_of(
        st.text(max_size=30),
        st.builds(lambda e, n: f"{e}.{n}", epochs, seqs),
        st.builds(lambda e, n, extra: f"{e}.{n}{extra}", st.just(epoch), seqs,
                  st.sampled_from(["\n", "\r\n", "\x00", ".", "/", "%", "é", "\t"])),
        st.sampled_from(["..", ".", "../../etc/passwd", "%00", "\x00", "null", "undefined", "NaN", "[DONE]",
                         "x" * 10_000]),
    )


@few(40)
@given(data=st.data())
async def test_any_query_cursor_is_a_stream_or_the_predicted_410(served, data):
    cursor = data.draw(cursors(served.epoch))
    target = b"/_oke/live/order-status?lastEventId=" + quote(cursor, safe="").encode()
    status, reason, after = cursor_verdict(served, cursor)
    replays = after is not None and after < served.head  # else no frame comes before a heartbeat
    reply = await exchange(served.port, target, [(b"Authorization", TOKEN.encode())], first_frame=replays)
    assert reply.status == status, (cursor, reply.status, reply.body[:200])
    if status == 410:
        assert assert_gap_envelope(reply, "order-status", cursor) == reason
        return
    assert reply.is_stream and reply.headers["cache-control"] == "no-cache"
    if replays:
        assert reply.frame is not None and reply.frame.startswith(f"id: {served.epoch}.{after + 1}\n".encode())


header_bytes = st.one_of(
    st.binary(max_size=40).filter(lambda b: b"\r" not in b and b"\n" not in b),
    st.sampled_from([b"\xff\xfe", b"\xc3\xa9", b"\xe2\x80\xa8", b"a\x00b", b"\x7f", b"\t4", b" ", b"a" * 8000]),
)


@few(40)
@given(data=st.data())
async def test_any_last_event_id_bytes_are_a_stream_a_410_or_a_400(served, data):
    value = data.draw(st.one_of(header_bytes, cursors(served.epoch).map(lambda c: c.encode("utf-8"))))
    assume_frameable = b"\r" not in value and b"\n" not in value
    if not assume_frameable:
        return  # a CR or LF ends the header: another request, not this question
    reply = await exchange(served.port, b"/_oke/live/order-status",
                           [(b"Authorization", TOKEN.encode()), (b"Last-Event-ID", value)])
    controls = any(b < 0x20 and b != 0x09 or b == 0x7F for b in value)
    if controls:  # the HTTP parser refuses a control byte in a header before any app sees it
        assert reply.status in (400, 200, 410), (value, reply.status)
        assert reply.status != 500
        return
    cursor = value.decode("latin-1").strip(" \t")  # ASGI headers are latin-1; the parser trims
    status, reason, _after = cursor_verdict(served, cursor)
    assert reply.status == status, (value, cursor, reply.status, reply.body[:200])
    if status == 410:
        assert assert_gap_envelope(reply, "order-status", cursor) == reason


async def test_the_header_wins_over_the_query_whatever_they_hold(served):
    good = f"{served.epoch}.{served.head - 1}"
    port = served.port
    target = b"/_oke/live/order-status?lastEventId=garbage"
    reply = await exchange(port, target, [(b"Authorization", TOKEN.encode()), (b"Last-Event-ID", good.encode())],
                           first_frame=True)
    assert reply.status == 200 and reply.frame.startswith(f"id: {served.epoch}.{served.head}\n".encode())
    target = f"/_oke/live/order-status?lastEventId={good}".encode()
    reply = await exchange(port, target, [(b"Authorization", TOKEN.encode()), (b"Last-Event-ID", b"\xff")])
    assert reply.status == 410 and assert_gap_envelope(reply, "order-status", "ÿ") == "malformed"
    # two Last-Event-ID headers: the first one counts
    reply = await exchange(port, b"/_oke/live/order-status", [(b"Authorization", TOKEN.encode()),
                                                              (b"Last-Event-ID", b"nope"),
                                                              (b"Last-Event-ID", good.encode())])
    assert reply.status == 410 and assert_gap_envelope(reply, "order-status", "nope") == "malformed"
    # a cursor with a trailing newline (only a query can carry one) is malformed, not seq 7
    reply = await exchange(port, f"/_oke/live/order-status?lastEventId={good}%0A".encode(),
                           [(b"Authorization", TOKEN.encode())])
    assert reply.status == 410 and assert_gap_envelope(reply, "order-status", good + "\n") == "malformed"


async def test_a_bad_cursor_on_a_gated_route_is_401_before_410(served):
    reply = await exchange(served.port, b"/_oke/live/order-status", [(b"Last-Event-ID", b"garbage")])
    assert reply.status == 401
    reply = await exchange(served.port, b"/orders/o1/events?lastEventId=%ff", [])
    assert reply.status == 401


@few(30)
@given(tail=st.one_of(st.text(max_size=12), st.integers(-5, 20_000).map(str),
                      st.sampled_from(["²", "١٢", "３", "1" * 5000, "+1", " 1", "1e3", "0x1", "-0", ""])))
async def test_any_tail_is_a_stream_or_400(served, tail):
    reply = await exchange(served.port, b"/_oke/live/public?tail=" + quote(tail, safe="").encode(),
                           first_frame=False)
    if re.fullmatch(r"[0-9]{1,9}", tail) and int(tail) <= 10_000:
        assert reply.status == 200 and reply.is_stream
    else:
        assert reply.status == 400, (tail, reply.status)
        assert reply.json()["error"] == {"code": "BadRequest", "message": "tail must be an integer from 0 to 10000"}


# ------------------------------------------------------------------------------ paths

@dataclass(frozen=True)
class Route:
    kind: str  # firehose | orders | admin | pub | exposures
    name: str | None = None


def decode_path(raw: str) -> list[str] | None | str:
    """The model of live routing: segments percent-decoded once; "400" for invalid UTF-8;
    None where no route may match (empty or dot segments, NUL; an encoded dot only as a live name)."""
    raw = raw.split("?", 1)[0]
    parts = raw[1:].split("/")
    try:
        segments = [unquote(p, errors="strict") for p in parts]
    except UnicodeDecodeError:
        return "400"
    if raw == "/":
        return segments
    live_name = len(segments) == 3 and segments[:2] == ["_oke", "live"]
    for i, (spelled, seg) in enumerate(zip(parts, segments)):
        if seg == "" or "\x00" in seg or spelled in (".", ".."):
            return None
        if seg in (".", "..") and not (live_name and i == 2):
            return None
    return segments


def predict(s: Served, raw: str, *, member: bool, admin: bool) -> tuple[int, Route | None]:
    segments = decode_path(raw)
    if segments == "400":
        return 400, None
    if segments is None:
        return 404, None
    if len(segments) == 3 and segments[:2] == ["_oke", "live"]:
        name = segments[2]
        if name not in s.firehoses:
            return 404, None
        if s.firehoses[name] or member:
            return 200, Route("firehose", name)
        return 401, None
    if segments == ["_oke", "exposures"]:
        return 200, Route("exposures")
    if segments[0] == "_oke":
        return 404, None
    if segments == ["admin", "stats"]:
        return (200, Route("admin")) if member and admin else (403 if member else 401, None)
    if len(segments) == 2 and segments[0] == "pub":
        return 200, Route("pub", segments[1])
    if len(segments) == 3 and segments[0] == "orders" and segments[2] == "events":
        return (200, Route("orders", segments[1])) if member else (401, None)
    return 404, None


def spellings(text: str) -> st.SearchStrategy[str]:
    """`text` with any of its characters percent-encoded (UTF-8), in upper or lower case hex."""
    def spell(choices: list[int]) -> str:
        out = []
        for ch, how in zip(text, choices):
            if how == 0 and ch not in "%/?#" and ord(ch) > 0x20 and ch.isascii():
                out.append(ch)
            else:
                hexes = "".join(f"%{b:02X}" for b in ch.encode("utf-8"))
                out.append(hexes.lower() if how == 2 else hexes)
        return "".join(out)
    return st.lists(st.integers(0, 2), min_size=len(text), max_size=len(text)).map(spell)


WORDS = ["_oke", "live", "exposures", "admin", "stats", "pub", "orders", "o1", "events", "order-status",
         "public", "x"]
HOSTILE_SEGMENTS = ["", ".", "..", "%2e", "%2E", "%2e%2e", "%2E%2e", ".%2e", "%2F", "%2f..", "..%2F", "%00", "%ff",
                    "%c3", "%c3%28", "%", "%g1", "%252e%252e", "%25", "%20", "+", ";x", "a%2Fb", "%5C..",
                    "\\..", "x" * 300, "%F0%9F%A6%86", "%EF%BF%BD", "%ED%A0%80", "%C0%AE%C0%AE"]
segment = st.one_of(
    st.sampled_from(WORDS).flatmap(spellings),
    st.sampled_from(ODD_NAMES).flatmap(spellings),
    st.sampled_from(HOSTILE_SEGMENTS),
    st.text(name_chars, max_size=6).map(lambda t: quote(t, safe="")),
)
paths = st.one_of(
    st.lists(segment, min_size=1, max_size=5).map(lambda segs: "/" + "/".join(segs)),
    st.tuples(st.sampled_from(["/_oke/live/", "/_oke//live/", "/_oke/live/./", "/_oke/live/x/../", "/pub/",
                               "/admin/", "/orders/o1/"]), segment).map("".join),
)
queries = st.sampled_from(["", "?", "?tail=1", "?lastEventId=", "?x=%ff", "?x=/../admin", "?#frag"])


@few(60)
@given(path=paths, query=queries)
async def test_every_spelling_of_a_path_gets_the_predicted_answer(served, path, query):
    target = (path + query).encode("ascii")
    for member, admin in ((False, False), (True, False), (True, True)):
        headers = [(b"Authorization", TOKEN.encode())] if member else []
        if admin:
            headers.append((b"X-Role", b"admin"))
        status, route = predict(served, path + query, member=member, admin=admin)
        firehose = route is not None and route.kind == "firehose"  # a filtered stream may stay silent
        reply = await exchange(served.port, target, headers, first_frame=firehose)
        assert reply.status == status, (path + query, member, admin, reply.status, reply.body[:200])
        if status != 200:
            assert b"TOP-SECRET" not in reply.body
            if status in (401, 403):
                assert reply.json()["error"]["code"] in ("Unauthorized", "Forbidden")
            continue
        assert route is not None
        if route.kind == "firehose":
            assert reply.is_stream
            data = frame_data(reply.frame)
            if route.name == "order-status":
                assert data["n"] == ORDER_EVENTS - RETAINED  # the oldest retained event
            elif route.name == "public":
                assert data == {"tape": "public"}
            else:
                assert data["name"] == route.name
        elif route.kind == "orders":
            assert reply.is_stream
        elif route.kind == "admin":
            assert reply.json() == {"data": {"s": "TOP-SECRET"}, "error": None}
        elif route.kind == "pub":
            assert reply.json() == {"data": {"page": route.name}, "error": None}
        else:
            assert reply.json()["error"] is None


OVERLONG = [b"/" + b"a" * 10_000, b"/_oke/live/" + b"x" * 10_000, b"/" + b"a/" * 5_000,
            b"/_oke/live/" + b"%41" * 5_000, b"/pub/" + b"%2e" * 3_000,
            b"/_oke/live/order-status?lastEventId=" + b"9" * 60_000]
RAW_TARGETS = [b"/_oke/live/order-status\x00", b"/_oke/live/\xc3\xa9", b"/_oke/live/pub lic", b"*",
               b"http://127.0.0.1/_oke/live/order-status", b"//127.0.0.1/admin/stats", b"/_oke/live/order-status#x",
               b"\\_oke\\live\\order-status", b"/_oke/live/order-status\t", b"/admin/stats\xff"]
METHODS = [b"POST", b"PUT", b"DELETE", b"PATCH", b"HEAD", b"OPTIONS", b"FOO", b"get"]
METHOD_TARGETS = [b"/_oke/live/order-status", b"/admin/stats", b"/pub/x", b"/_oke/exposures", b"/orders/o1/events",
                  b"/nowhere"]


async def test_overlong_paths_are_refused_quickly(served):
    for target in OVERLONG:
        reply = await exchange(served.port, target, [(b"Authorization", TOKEN.encode())])
        if target.startswith(b"/pub/"):  # 3,000 dots are a page name like any other
            assert reply.status in (200, 400, 414, 431), reply.status
        else:
            assert reply.status in (400, 404, 410, 414, 431), (target[:40], reply.status)


async def test_raw_bytes_in_the_request_target_never_pass_a_gate(served):
    for target in RAW_TARGETS:
        reply = await exchange(served.port, target, [])
        assert reply.status in (400, 401, 404), (target, reply.status)
        assert b"TOP-SECRET" not in reply.body and not reply.is_stream


async def test_other_methods_never_serve_a_gated_body(served):
    for method in METHODS:
        for target in METHOD_TARGETS:
            reply = await exchange(served.port, target, [], method=method)
            assert reply.status in (400, 401, 404, 405), (method, target, reply.status)
            assert b"TOP-SECRET" not in reply.body and not reply.is_stream


# ------------------------------------------------------------------------------ odd live names

async def _first_event(client: Client, name: str, timeout: float = 10.0) -> Any:
    async with asyncio.timeout(timeout):
        stream = client.stream(name, {})
        async with contextlib.aclosing(stream):
            async for event in stream:
                return event.data
    return None


async def check_names_served(s: Served, names: list[str]) -> None:
    async with httpx.AsyncClient() as c:  # gated exposures are listed to callers passing their gates
        exposures = (await c.get(s.base + "/_oke/exposures", headers=AUTH)).json()["data"]
    paths = {e["signal"]: e["path"] for e in exposures if not e["custom"] and e["path"].startswith("/_oke/live/")}
    client = Client(s.base, token="s3cret")
    for name in names:
        assert paths[name] == live_path(name), name
        advertised = await exchange(s.port, paths[name].encode("ascii"), [(b"Authorization", TOKEN.encode())],
                                    first_frame=True)
        assert advertised.status == 200, (name, paths[name])
        assert frame_data(advertised.frame)["name"] == name
        as_js = "/_oke/live/" + encode_uri_component(name)  # what a browser's code would build
        reply = await exchange(s.port, as_js.encode("ascii"), [(b"Authorization", TOKEN.encode())], first_frame=True)
        if name in (".", ".."):
            assert reply.status == 404  # a bare dot segment: every client normalises it away; %2E works
        else:
            assert reply.status == 200 and frame_data(reply.frame)["name"] == name, (name, as_js)
        denied = await exchange(s.port, paths[name].encode("ascii"), [])
        assert denied.status == 401, name
        data = await _first_event(client, name)
        assert data == {"name": name, "secret": "TOP-SECRET"}, name


async def test_odd_live_names_are_served_and_followed(served):
    await check_names_served(served, ODD_NAMES)


# at most 14 characters: "http GET /_oke/live/" + 14 four-byte characters percent-encoded fits 200
live_names = st.one_of(st.text(name_chars, min_size=1, max_size=14), st.sampled_from(ODD_NAMES))


@few(3)
@given(names=st.lists(live_names, min_size=3, max_size=5, unique=True))
async def test_generated_live_names_are_served_and_followed(db_url, names):
    import engine

    engine.reset()
    names = [n for n in names if n not in ("order-status", "public")]
    async with shop_server(db_url, names) as s:
        await check_names_served(s, names)
    engine.reset()


# ------------------------------------------------------------------------------ payloads over SSE

@few(15)
@given(values=st.lists(json_values, min_size=1, max_size=5))
async def test_payloads_arrive_over_sse_exactly(served, values):
    """What the Python client yields equals the emitted value after JSON; the raw data line is the
    stored JSON text byte for byte, on one line whatever the payload holds."""
    app = served.app
    before = await app.emit("public", {"tape": "public"})
    ids = [await app.emit("public", v) for v in values]
    client = Client(served.base)
    got = []
    async with asyncio.timeout(10):
        stream = client.stream("public", {}, last_event_id=before)
        async with contextlib.aclosing(stream):
            async for event in stream:
                got.append(event)
                if len(got) == len(values):
                    break
    assert [e.id for e in got] == ids
    for event, value in zip(got, values):
        assert same_json(event.data, normalised(value)), (value, event.data)
    reply = await exchange(served.port, b"/_oke/live/public", [(b"Last-Event-ID", before.encode())], first_frame=True)
    id_line, data_line, blank, _rest = reply.frame.split(b"\n", 3)
    assert id_line == f"id: {ids[0]}".encode() and blank == b""
    expected = json.dumps(values[0], ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    assert data_line == b"data: " + expected.encode("utf-8")


async def test_a_cursor_of_a_gone_tape_is_a_410_not_a_500(served):
    client = Client(served.base, token="s3cret")
    with pytest.raises(LiveResumeGap) as gap:
        async with asyncio.timeout(10):
            async for _event in client.stream("order-status", {}, last_event_id=f"{served.epoch}.1"):
                break
    assert gap.value.reason == "pruned" and gap.value.missed == served.pruned_through - 1


@pytest.mark.parametrize("name", ["x" * 200, "🦆" * 200, "é" * 60], ids=["200-ascii", "200-astral", "60-latin"])
async def test_a_live_signal_with_a_200_character_name_boots(db_url, name):
    """A name may have 200 characters; the boot records each live exposure in oke_bindings (a
    200-character column) under a label that fits, however long the percent-encoded path."""
    tape = signal.live(name)
    on(http.live(tape).public())
    app = oke("long", database_url=db_url)
    async with app, serving(app) as base:
        await app.emit(tape, {"n": 1})
        assert await _first_event(Client(base), name) == {"n": 1}


# ------------------------------------------------------------------------------ what a request may cost

LIMIT = 1_048_576 + 64 * 1024  # the default max_payload_bytes, plus 64 KiB for the JSON around a payload
HEADER_TIMEOUT_S = 10.0  # the promise; the test waits it out rather than shorten it


def counting_gate(name: str, calls: list[str], allowed: set[str]):
    """A gate passing requests whose bearer token is in `allowed`; records each time it is asked."""
    def check(request):
        calls.append(name)
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        if token not in allowed:
            raise Unauthorized(f"{name}: missing or wrong token")
        return {"gate": name}
    return gate(name, check)


@contextlib.asynccontextmanager
async def limits_server(url: str, **options: Any) -> AsyncIterator[Served]:
    feed = signal.live("feed")
    on(http.live(feed).public())
    on(http.post("/echo").public(), flow("echo", do=lambda v, fx: {"blob": len(v["blob"])}))
    on(http.post("/vault").gate(gate("member", bearer)), flow("vault", do=lambda v, fx: {"ok": True}))
    app = oke("limits", database_url=url, **options)
    async with app, serving(app) as base:
        yield Served(app, base, int(base.rsplit(":", 1)[1]), "", 0, 0)


async def read_reply(reader: asyncio.StreamReader, timeout: float = 10.0) -> Reply:
    """One response: the head, then a body of its Content-Length."""
    async with asyncio.timeout(timeout):
        raw = await reader.readuntil(b"\r\n\r\n")
        status_line, *lines = raw.decode("latin-1").split("\r\n")
        found = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if ":" in line)}
        body = await reader.readexactly(int(found.get("content-length", "0")))
    return Reply(int(status_line.split(" ")[1]), found, body)


async def closed_by_server(reader: asyncio.StreamReader, timeout: float) -> bool:
    """True when the server ends the connection (EOF or reset) within `timeout` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while await reader.read(65536):
                pass
        return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def rss_kb(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def reset_peak_rss() -> None:
    """Start this process's VmHWM (peak RSS) over from its current RSS (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def too_large_envelope() -> dict:
    return {"data": None, "error": {"code": "PayloadTooLarge",
                                    "message": f"the request body is over {LIMIT} bytes (max_payload_bytes + 65536)"}}


async def test_a_body_declared_over_the_limit_is_413_before_it_is_read(sqlite_url):
    """Content-Length claims 100 MB and a little body follows: 413 at once, on a public route, a gated
    one (before its gate) and no route at all, then the connection is closed; nothing waits for the
    rest. An `Expect: 100-continue` client is refused without being told to send."""
    async with limits_server(sqlite_url) as s:
        reset_peak_rss()
        before = rss_kb()
        for target, extra in ((b"/echo", b""), (b"/vault", b""), (b"/nowhere", b""),
                              (b"/echo", b"Expect: 100-continue\r\n")):
            t0 = time.monotonic()
            reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
            try:
                writer.write(b"POST " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 100000000\r\n" + extra + b"\r\n" + b'{"blob": "' + b"x" * 4000)
                await writer.drain()
                reply = await read_reply(reader)
                assert time.monotonic() - t0 < 5, target
                assert (reply.status, reply.headers["connection"]) == (413, "close"), (target, reply.status)
                assert reply.json() == too_large_envelope()
                assert await closed_by_server(reader, 5), target
            finally:
                writer.close()
        assert rss_kb("VmHWM") - before < 30 * 1024
        # the limit itself: max_payload_bytes + 64 KiB is served, one byte more is not
        for size, status in ((LIMIT, 200), (LIMIT + 1, 413)):
            blob = b"x" * (size - len(b'{"blob": ""}'))
            reply = await raw_post(s.port, b'{"blob": "' + blob + b'"}')
            assert reply.status == status, size
            assert reply.json() == ({"data": {"blob": len(blob)}, "error": None} if status == 200
                                    else too_large_envelope())


async def raw_post(port: int, body: bytes) -> Reply:
    head = b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    reply, _sent = await asyncio.to_thread(upload, port, head + b"Content-Length: %d\r\n\r\n" % len(body), [body])
    return reply


async def chunked_post(port: int, target: bytes, parts: Any, header: bytes = b"X-Nothing: 0") -> tuple[Reply, int]:
    """POST a body in chunks without a length, stopping when the server answers; (reply, bytes sent)."""
    head = (b"POST " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n" + header + b"\r\n\r\n")
    framed = (b"%x\r\n" % len(part) + part + b"\r\n" for part in parts)
    return await asyncio.to_thread(upload, port, head, itertools.chain(framed, [b"0\r\n\r\n"]))


def upload(port: int, head: bytes, body: Any, timeout: float = 60.0) -> tuple[Reply, int]:
    """Send `head` then the body's pieces on a plain blocking socket (in a thread) until they run
    out or the server answers, then read the answer; (reply, body bytes sent).

    A plain socket, because a server that refuses a body closes the connection with the rest of it
    unread, and the kernel then resets it: an asyncio transport whose write hits that reset drops
    the answer already received, while recv() still returns it (Linux keeps it queued)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(ConnectionError):
            sock.sendall(head)
            for piece in body:
                if select.select([sock], [], [], 0)[0]:
                    break  # the server answered before the body ended
                sock.sendall(piece)
                sent += len(piece)
        data = b""
        with contextlib.suppress(ConnectionError):
            while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _content_length(data):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    raw, _, content = data.partition(b"\r\n\r\n")
    status_line, *lines = raw.decode("latin-1").split("\r\n")
    found = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if ":" in line)}
    return Reply(int(status_line.split(" ")[1]), found, content), sent


def _content_length(data: bytes) -> int:
    found = re.search(rb"\r\ncontent-length: *([0-9]+)", data.split(b"\r\n\r\n", 1)[0], re.IGNORECASE)
    return int(found.group(1)) if found else 0


def json_blob(size: int, chunk: int = 64 * 1024) -> Any:
    """A JSON object {"blob": "xxx…"} of `size` bytes, made chunk by chunk (never held whole)."""
    inner = size - len(b'{"blob": ""}')
    yield b'{"blob": "'
    block = b"x" * chunk
    for _ in range(inner // chunk):
        yield block
    yield b"x" * (inner % chunk) + b'"}'


async def test_a_streamed_body_is_counted_and_refused_at_the_limit(sqlite_url):
    """A chunked body (no Content-Length) within the limit is served; one of 100 MB is answered 413
    once it passes the limit, the connection closed, and the process's peak RSS stays small."""
    async with limits_server(sqlite_url) as s:
        reply, _sent = await chunked_post(s.port, b"/echo", json_blob(LIMIT))
        assert reply.json() == {"data": {"blob": LIMIT - len(b'{"blob": ""}')}, "error": None}
        reset_peak_rss()
        before = rss_kb()
        t0 = time.monotonic()
        reply, sent = await chunked_post(s.port, b"/echo", json_blob(100_000_000))
        elapsed = time.monotonic() - t0
        growth_kb = rss_kb("VmHWM") - before
        assert (reply.status, reply.headers["connection"]) == (413, "close"), reply.status
        assert reply.json() == too_large_envelope()
        assert sent < 40_000_000, sent  # the limit, and what the sockets' buffers took before the answer
        assert growth_kb < 30 * 1024, f"peak RSS grew {growth_kb / 1024:.0f} MB"
        assert elapsed < 15, elapsed
        # a gated route: refused by its gate before the body is read, or counted once the gate passes
        reply, _sent = await chunked_post(s.port, b"/vault", json_blob(100_000_000))
        assert reply.status == 401
        reply, sent = await chunked_post(s.port, b"/vault", json_blob(100_000_000), b"Authorization: " + TOKEN.encode())
        assert (reply.status, reply.json()) == (413, too_large_envelope()) and sent < 40_000_000


@pytest.mark.long
async def test_headers_not_complete_within_10_s_end_the_connection(sqlite_url):
    """Slowloris, three ways, at once: 50 connections that send a request line and a header but
    never the blank line, 10 that send nothing, and a keep-alive connection whose second request
    trickles in a byte a second (each byte inside uvicorn's 5 s keep-alive). Each is closed 10 s
    after its request was due; a complete request is served meanwhile."""
    async with limits_server(sqlite_url) as s:
        opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

        async def watch(reader: asyncio.StreamReader, since: float) -> float:
            assert await closed_by_server(reader, HEADER_TIMEOUT_S + 20)
            return time.monotonic() - since

        async def half_sent(head: bytes) -> float:
            t0 = time.monotonic()
            reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
            opened.append((reader, writer))
            writer.write(head)
            await writer.drain()
            return await watch(reader, t0)

        async def trickling() -> float:
            reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
            opened.append((reader, writer))
            writer.write(b"GET /_oke/exposures HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert (await read_reply(reader)).status == 200
            t0 = time.monotonic()
            closed = asyncio.create_task(watch(reader, t0))
            with contextlib.suppress(ConnectionError):
                for byte in b"GET /_oke/exposures HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"z" * 100:
                    await asyncio.sleep(1.0)
                    if closed.done():
                        break
                    writer.write(bytes([byte]))
                    await writer.drain()
            return await closed

        try:
            waits = [half_sent(b"GET /_oke/exposures HTTP/1.1\r\nHost: 127.0.0.1\r\n") for _ in range(50)]
            waits += [half_sent(b"") for _ in range(10)]
            waits.append(trickling())
            everyone = asyncio.gather(*waits)
            await asyncio.sleep(1.0)
            served = await exchange(s.port, b"/_oke/exposures")  # the server still serves
            assert served.status == 200
            closed_after = await everyone
        finally:
            for _reader, writer in opened:
                writer.close()
        assert min(closed_after) >= HEADER_TIMEOUT_S - 0.5, min(closed_after)
        assert max(closed_after) < HEADER_TIMEOUT_S + 15, max(closed_after)


async def open_stream(port: int, target: bytes = b"/_oke/live/feed") -> tuple[int, asyncio.StreamWriter]:
    """Open a request on its own connection; (status, writer): a 200 stream stays open until closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
    return int(head.split(b" ")[1]), writer


async def test_max_connections_counts_sse_streams_and_the_one_over_gets_503(sqlite_url):
    async with limits_server(sqlite_url, max_connections=3) as s:
        streams = [await open_stream(s.port) for _ in range(3)]
        assert [status for status, _w in streams] == [200, 200, 200]
        refused = await exchange(s.port, b"/_oke/live/feed")  # a fourth connection: over the limit
        assert refused.status == 503
        assert (await exchange(s.port, b"/_oke/exposures")).status == 503  # whatever it asks
        status, writer = streams.pop()
        writer.close()  # one stream ends: its place is free again
        async with asyncio.timeout(10):
            while True:
                status, writer = await open_stream(s.port)
                if status == 200:
                    break
                writer.close()
                await asyncio.sleep(0.05)
        streams.append((status, writer))
        assert (await exchange(s.port, b"/_oke/live/feed")).status == 503
        for _status, writer in streams:
            writer.close()


async def test_exposures_list_only_what_the_callers_gates_let_through(sqlite_url):
    calls: list[str] = []
    member = counting_gate("member", calls, {"m-token", "a-token"})
    admin = counting_gate("admin", calls, {"a-token"})
    status = signal.live("order-status")
    news = signal.live("news")
    on(http.live(status).gate(member))
    on(http.get("/orders/:orderId/events").gate(member).live(status))
    on(http.get("/admin/feed").gate(member, admin).live(status))
    on(http.live(news).public())
    on(http.get("/news/top").public().live(news), flow("news.top", do=lambda v, fx: fx.live(news)))
    app = oke("gated", database_url=sqlite_url)
    async with app, serving(app) as base, httpx.AsyncClient() as c:
        await app.emit(status, {"orderId": "o1"})

        async def listed(token: str | None) -> tuple[set[str], bytes]:
            calls.clear()
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            response = await c.get(base + "/_oke/exposures", headers=headers)
            assert response.status_code == 200
            assert sorted(calls) == sorted(set(calls)), calls  # each gate asked at most once a listing
            return {e["path"] for e in response.json()["data"]}, response.content

        public = {"/_oke/live/news", "/news/top"}
        for anonymous in (None, "wrong"):
            paths, raw = await listed(anonymous)
            assert paths == public
            for secret in (b"order-status", b"/orders", b"/admin", b"member", b"admin"):
                assert secret not in raw, secret  # nothing of a gated route, not even its gate's name
        assert (await listed("m-token"))[0] == public | {"/_oke/live/order-status", "/orders/:orderId/events"}
        assert (await listed("a-token"))[0] == public | {"/_oke/live/order-status", "/orders/:orderId/events",
                                                         "/admin/feed"}
        # the Python client finds the gated exposure with its token; without one the server says 401
        assert await _first_event(Client(base, token="m-token"), "order-status") == {"orderId": "o1"}
        with pytest.raises(ClientError) as refused:
            await _first_event(Client(base, token="wrong"), "order-status")
        assert refused.value.status == 401


async def test_a_410_quotes_at_most_128_characters_of_the_cursor(served):
    long_cursor = "z" * 100 + "ü" * 50 + "\u202e" * 10 + "9" * 8000
    for headers, target in (([(b"Authorization", TOKEN.encode()), (b"Last-Event-ID", long_cursor.encode())],
                             b"/_oke/live/order-status"),
                            ([(b"Authorization", TOKEN.encode())],
                             b"/_oke/live/order-status?lastEventId=" + quote(long_cursor).encode())):
        reply = await exchange(served.port, target, headers)
        assert reply.status == 410
        error = reply.json()["error"]
        cursor = long_cursor if b"?" in target else long_cursor.encode().decode("latin-1")
        assert error["data"]["afterId"] == cursor[:128] and len(error["data"]["afterId"]) == 128
        assert error["message"] == f'Cursor "{cursor[:128]}" missing on "order-status".'
        assert len(reply.body) < 1024, len(reply.body)
