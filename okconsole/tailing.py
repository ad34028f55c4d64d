"""`okconsole tail`: follow a live tape from the store or over SSE, like `tail -f`.

By default the last 10 retained events, then every new one. A drop resumes
after the last id printed; a cursor the tape cannot honour (410 / a gap in the
store) is reported on stderr and the tail restarts from the oldest retained
event. Output is `<id>  <json>` per event, or NDJSON `{"id", "data"}` with --json.

Over SSE every network call is bounded (SPEC §10b: 10 s, env OKE_NETWORK_TIMEOUT overrides it):
the server is asked for `/_oke/exposures` first, so a URL that is not an okengine server, refuses
the token or never answers is reported as that (exit 1), not as an unknown signal.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, TextIO

import httpx

from engine.client import Client, ClientError, LiveResumeGap
from engine.ops import tapes
from engine.store import make_store

from .data import StoreAdapter, StoreDown

DEFAULT_BACKLOG = 10
STORE_POLL_S = 0.2
NETWORK_TIMEOUT_S = 10.0
TIMEOUT_ENV = "OKE_NETWORK_TIMEOUT"


def network_timeout_s() -> float:
    """Seconds a network call may take before the console gives up (env OKE_NETWORK_TIMEOUT, else 10)."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, ""))
    except ValueError:
        return NETWORK_TIMEOUT_S
    return value if 0 < value and math.isfinite(value) else NETWORK_TIMEOUT_S


@dataclass
class TailOptions:
    signal: str
    after: str | None = None
    from_start: bool = False
    from_end: bool = False
    count: int | None = None
    as_json: bool = False


class UnknownTape(LookupError):
    def __init__(self, signal: str, known: list[str], where: str = "live signals") -> None:
        listed = ", ".join(known) if known else "none"
        super().__init__(f'unknown live signal "{signal}" ({where}: {listed})')


class TailFailed(RuntimeError):
    """The source cannot be followed (server refused, unreachable at start)."""


_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def _one_line_json(value: Any) -> str:
    """JSON on one line for every reader: json.dumps leaves U+2028, U+2029 and NEL raw (valid JSON),
    but str.splitlines() and some terminals break lines there; escaped, they decode the same."""
    return json.dumps(value, ensure_ascii=False).translate(_LINE_BREAKS)


class Printer:
    def __init__(self, opts: TailOptions, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.opts = opts
        # looked up now, not bound at import: a default of sys.stdout would keep whatever stream
        # was current when this module was first imported (a closed one, under CliRunner)
        self.out = out if out is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self.printed = 0

    @property
    def done(self) -> bool:
        return self.opts.count is not None and self.printed >= self.opts.count

    def event(self, event_id: str, data: Any) -> None:
        if self.done:
            return
        if self.opts.as_json:
            self.out.write(_one_line_json({"id": event_id, "data": data}) + "\n")
        else:
            self.out.write(f"{event_id}  {_one_line_json(data)}\n")
        self.out.flush()
        self.printed += 1

    def warn(self, text: str) -> None:
        self.err.write(f"okconsole: {text}\n")
        self.err.flush()


async def tail_store(database_url: str, opts: TailOptions, printer: Printer) -> None:
    """Follow a tape by reading the store directly."""
    data = StoreAdapter(database_url)
    try:
        info = await data.call(tapes.tape_info, opts.signal)
        if info is None:
            raise UnknownTape(opts.signal, await data.call(tapes.live_signals))
        cursor: str | None
        if opts.after:
            cursor = opts.after
        elif opts.from_start:
            cursor = None
        elif opts.from_end:
            cursor = info.head_id
        else:
            backlog = await data.call(tapes.tape_last, opts.signal, DEFAULT_BACKLOG)
            for entry in backlog:
                printer.event(entry.id, entry.data)
            cursor = backlog[-1].id if backlog else info.head_id
        down = False
        while not printer.done:
            try:
                entries, gap = await data.call(tapes.tape_after, opts.signal, cursor)
            except StoreDown as err:
                if not down:
                    printer.warn(f"store unreachable ({err}); retrying, will resume after {cursor or 'the start'}")
                down = True
                await asyncio.sleep(1.0)
                continue
            if down:
                printer.warn("store reachable again; resuming")
                down = False
            if gap is not None:
                printer.warn(f'cursor "{cursor}" cannot be resumed on "{opts.signal}" ({gap.reason}'
                             f"{f', {gap.missed} missed' if gap.missed else ''}); restarting from the oldest "
                             f"retained event {gap.first_id or '(tape empty)'}")
                cursor = None
                continue
            for entry in entries:
                printer.event(entry.id, entry.data)
                cursor = entry.id
                if printer.done:
                    return
            if not entries:
                await asyncio.sleep(STORE_POLL_S)
    finally:
        await data.close()


async def probe_server(base_url: str, token: str | None, signal: str, bound: float) -> None:
    """Ask `/_oke/exposures` within `bound` seconds: TailFailed when the server does not answer, refuses,
    errs or is not okengine at all; UnknownTape (naming what it exposes) when it does not expose `signal`."""
    url = f"{base_url.rstrip('/')}/_oke/exposures"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(bound)) as http:
            response = await asyncio.wait_for(http.get(url, headers=headers), bound)
    except (httpx.TimeoutException, asyncio.TimeoutError):
        raise TailFailed(f"no answer from {base_url} within {bound:g} s") from None
    except httpx.HTTPError as err:
        raise TailFailed(f"cannot reach {base_url}: {type(err).__name__}: {err}") from None
    if response.status_code in (401, 403):
        raise TailFailed(f"{base_url} refused the request (HTTP {response.status_code}): pass --token")
    try:
        exposures = response.json()["data"]
        exposed = sorted({str(e["signal"]) for e in exposures})
    except (ValueError, KeyError, TypeError) as err:
        raise TailFailed(f"{base_url} is not an okengine server (GET /_oke/exposures: HTTP "
                         f"{response.status_code}, no list of exposures)") from err
    if response.status_code >= 400:
        raise TailFailed(f"{base_url} answered HTTP {response.status_code} to GET /_oke/exposures")
    if signal not in exposed:
        raise UnknownTape(signal, exposed, f"exposed at {base_url}")


async def _opened_within(pump: asyncio.Future[None], opened: asyncio.Event, bound: float, base_url: str) -> None:
    """Wait until the stream opens (or the pump ends by itself); cancel it if neither happens in time."""
    opener = asyncio.ensure_future(opened.wait())
    try:
        await asyncio.wait({pump, opener}, timeout=bound, return_when=asyncio.FIRST_COMPLETED)
    finally:
        opener.cancel()
    if not opened.is_set() and not pump.done():
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump
        raise TailFailed(f"no answer from {base_url} within {bound:g} s: the stream did not open")


async def tail_sse(base_url: str, token: str | None, opts: TailOptions, printer: Printer) -> None:
    """Follow a tape over SSE, resuming by id after drops; the first connection is bounded in time."""
    bound = network_timeout_s()
    await probe_server(base_url, token, opts.signal, bound)
    client = Client(base_url, token=token, timeout=bound)
    cursor = opts.after
    tail: int | None = None
    if not opts.after and not opts.from_start:
        tail = 0 if opts.from_end else DEFAULT_BACKLOG
    connected_once = False
    if cursor is not None and not (cursor.isascii() and cursor.isprintable()):
        # it cannot travel in a Last-Event-ID header; the server would call it malformed (410)
        printer.warn(f'cursor {ascii(cursor)} cannot be resumed on "{opts.signal}" (malformed); '
                     f"restarting from the oldest retained event")
        cursor, tail = None, None
    while not printer.done:
        try:
            opened = asyncio.Event()
            stream = client.stream(opts.signal, {}, last_event_id=cursor, tail=tail, retry_first=connected_once,
                                   on_open=opened.set)

            async def pump() -> None:
                nonlocal cursor, connected_once
                async for event in stream:
                    connected_once = True
                    printer.event(event.id, event.data)
                    cursor = event.id
                    if printer.done:
                        return

            async with contextlib.aclosing(stream):
                pumping = asyncio.ensure_future(pump())
                if not connected_once:
                    await _opened_within(pumping, opened, bound, base_url)
                    connected_once = True
                await pumping
            return
        except LiveResumeGap as gap:
            printer.warn(f'cursor "{gap.after_id}" cannot be resumed on "{opts.signal}" ({gap.reason}); '
                         f"restarting from the oldest retained event {gap.first_id or '(tape empty)'}")
            cursor, tail = None, None
        except ClientError as err:
            if err.status == 404 or "exposure" in str(err):
                raise UnknownTape(opts.signal, []) from err
            raise TailFailed(str(err)) from err
        except ValueError as err:  # no exposure of that signal on this server
            raise UnknownTape(opts.signal, []) from err
        except httpx.HTTPError as err:
            if not connected_once:
                raise TailFailed(f"cannot reach {base_url}: {err}") from err
            printer.warn(f"stream dropped ({err}); resuming after {cursor}")
            await asyncio.sleep(1.0)


def known_store_tapes(database_url: str) -> list[str]:
    async def read() -> list[str]:
        store = make_store(database_url)
        await store.open()
        try:
            return await tapes.live_signals(store)
        finally:
            await store.close()
    return asyncio.run(read())
