"""`okconsole tail`: follow a live tape from the store or over SSE, like `tail -f`.

By default the last 10 retained events, then every new one. A drop resumes
after the last id printed; a cursor the tape cannot honour (410 / a gap in the
store) is reported on stderr and the tail restarts from the oldest retained
event. Output is `<id>  <json>` per event, or NDJSON `{"id", "data"}` with --json.

Over SSE every network call is bounded (10 s, env OKE_NETWORK_TIMEOUT overrides it):
the server is asked for `/_oke/exposures` first, so a URL that is not an okengine server, refuses
the token or never answers is reported as that (exit 1), not as an unknown signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, TextIO

import httpx

from engine import ops
from engine.client import Client, ClientError, LiveResumeGap, StreamDropped
from engine.display import inert, json_text, one_line

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
    def __init__(self, signal: str, known: list[str], where: str = "live signals", hint: str = "") -> None:
        listed = ", ".join(known) if known else "none"
        super().__init__(f'unknown live signal "{signal}" ({where}: {listed}){hint}')


class TailFailed(RuntimeError):
    """The source cannot be followed (server refused, unreachable at start)."""


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
            self.out.write(json_text({"id": event_id, "data": data}) + "\n")
        else:
            self.out.write(f"{inert(event_id)}  {json_text(data)}\n")
        self.out.flush()
        self.printed += 1

    def warn(self, text: str) -> None:
        self.err.write(f"okconsole: {one_line(text)}\n")
        self.err.flush()


async def _store_start(data: StoreAdapter, opts: TailOptions, printer: Printer) -> str | None:
    """Check the tape exists, print the backlog the options ask for; the cursor to follow from."""
    info = await data.call(ops.tape_info, opts.signal)
    if info is None:
        raise UnknownTape(opts.signal, await data.call(ops.live_signals))
    if opts.after:
        return opts.after
    if opts.from_start:
        return None
    if opts.from_end:
        return info.head_id
    backlog = await data.call(ops.tape_last, opts.signal, DEFAULT_BACKLOG)
    for entry in backlog:
        printer.event(entry.id, entry.data)
    return backlog[-1].id if backlog else info.head_id


def _gap_warning(opts: TailOptions, cursor: str | None, gap: Any) -> str:
    return (
        f'cursor "{cursor}" cannot be resumed on "{opts.signal}" ({gap.reason}'
        f"{f', {gap.missed} missed' if gap.missed else ''}); restarting from the oldest "
        f"retained event {gap.first_id or '(tape empty)'}"
    )


class _StoreFollower:
    """Polls the tape after a cursor, printing each entry; says once when the store goes and comes back."""

    def __init__(self, data: StoreAdapter, opts: TailOptions, printer: Printer, cursor: str | None) -> None:
        self.data, self.opts, self.printer, self.cursor = data, opts, printer, cursor
        self.down = False

    async def run(self) -> None:
        while not self.printer.done:
            try:
                entries, gap = await self.data.call(ops.tape_after, self.opts.signal, self.cursor)
            except StoreDown as err:
                self._went_down(err)
                await asyncio.sleep(1.0)
                continue
            self._came_back()
            if gap is not None:
                self.printer.warn(_gap_warning(self.opts, self.cursor, gap))
                self.cursor = None
                continue
            self._print(entries)
            if not entries:
                await asyncio.sleep(STORE_POLL_S)

    def _went_down(self, err: StoreDown) -> None:
        if not self.down:
            self.printer.warn(f"store unreachable ({err}); retrying, will resume after {self.cursor or 'the start'}")
        self.down = True

    def _came_back(self) -> None:
        if self.down:
            self.printer.warn("store reachable again; resuming")
            self.down = False

    def _print(self, entries: list[ops.TapeEntry]) -> None:
        for entry in entries:
            self.printer.event(entry.id, entry.data)
            self.cursor = entry.id
            if self.printer.done:
                return


async def tail_store(database_url: str, opts: TailOptions, printer: Printer) -> None:
    """Follow a tape by reading the store directly."""
    data = StoreAdapter(database_url)
    try:
        cursor = await _store_start(data, opts, printer)
        await _StoreFollower(data, opts, printer, cursor).run()
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
    except (httpx.TimeoutException, TimeoutError):
        raise TailFailed(f"no answer from {base_url} within {bound:g} s") from None
    except httpx.HTTPError as err:
        raise TailFailed(f"cannot reach {base_url}: {type(err).__name__}: {err}") from None
    if response.status_code in (401, 403):
        raise TailFailed(f"{base_url} refused the request (HTTP {response.status_code}): pass --token")
    try:
        exposures = response.json()["data"]
        exposed = sorted({str(e["signal"]) for e in exposures})
    except (ValueError, KeyError, TypeError) as err:
        raise TailFailed(
            f"{base_url} is not an okengine server (GET /_oke/exposures: HTTP "
            f"{response.status_code}, no list of exposures)"
        ) from err
    if response.status_code >= 400:
        raise TailFailed(f"{base_url} answered HTTP {response.status_code} to GET /_oke/exposures")
    if signal not in exposed:
        # the server lists only the exposures the caller's gates let through
        hint = "pass the --token its gate accepts" if token is None else "this --token does not pass its gate"
        raise UnknownTape(signal, exposed, f"exposed at {base_url}", f"; if it is gated, {hint}")


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


def _sse_start(opts: TailOptions, printer: Printer) -> tuple[str | None, int | None]:
    """The first stream's Last-Event-ID and `tail` count from the options."""
    cursor = opts.after
    tail: int | None = None
    if not opts.after and not opts.from_start:
        tail = 0 if opts.from_end else DEFAULT_BACKLOG
    if cursor is not None and not (cursor.isascii() and cursor.isprintable()):
        # it cannot travel in a Last-Event-ID header; the server would call it malformed (410)
        printer.warn(
            f'cursor {ascii(cursor)} cannot be resumed on "{opts.signal}" (malformed); '
            f"restarting from the oldest retained event"
        )
        return None, None
    return cursor, tail


class _SseFollower:
    """Streams the tape, reopening after a drop (resuming after the last id printed) or a gap (from the
    oldest retained event); the first opening must happen within the network bound."""

    def __init__(self, base_url: str, token: str | None, opts: TailOptions, printer: Printer, bound: float) -> None:
        self.base_url, self.opts, self.printer, self.bound = base_url, opts, printer, bound
        self.client = Client(base_url, token=token, timeout=bound)
        self.cursor, self.tail = _sse_start(opts, printer)
        self.connected_once = False
        self.dropped = False  # since the last warning of a drop, no stream has opened

    async def run(self) -> None:
        while not self.printer.done:
            try:
                await self._stream_once()
                return
            except LiveResumeGap as gap:
                self.printer.warn(
                    f'cursor "{gap.after_id}" cannot be resumed on "{self.opts.signal}" '
                    f"({gap.reason}); restarting from the oldest retained event "
                    f"{gap.first_id or '(tape empty)'}"
                )
                self.cursor, self.tail = None, None
            except ClientError as err:
                if err.status == 404 or "exposure" in str(err):
                    raise UnknownTape(self.opts.signal, []) from err
                raise TailFailed(str(err)) from err
            except ValueError as err:  # no exposure of that signal on this server
                raise UnknownTape(self.opts.signal, []) from err
            except (httpx.HTTPError, StreamDropped) as err:
                if not self.connected_once:
                    raise TailFailed(f"cannot reach {self.base_url}: {err.__cause__ or err}") from err
                if not self.dropped:  # once per outage: the retries that follow say nothing new
                    self.printer.warn(f"stream dropped ({err.__cause__ or err}); resuming after {self.cursor}")
                self.dropped = True
                await asyncio.sleep(1.0)

    async def _stream_once(self) -> None:
        opened = asyncio.Event()

        def on_open() -> None:
            opened.set()
            self.dropped = False

        # auto_resubscribe=False: a drop comes back here (warned once, reopened after the last id
        # printed) and a gap too (warned, restarted from the oldest retained event)
        stream = self.client.stream(self.opts.signal, {}, last_event_id=self.cursor, tail=self.tail, on_open=on_open)
        async with contextlib.aclosing(stream):
            pumping = asyncio.ensure_future(self._pump(stream))
            if not self.connected_once:
                await _opened_within(pumping, opened, self.bound, self.base_url)
                self.connected_once = True
            await pumping

    async def _pump(self, stream: Any) -> None:
        async for event in stream:
            self.connected_once = True
            self.printer.event(event.id, event.data)
            self.cursor = event.id
            if self.printer.done:
                return


async def tail_sse(base_url: str, token: str | None, opts: TailOptions, printer: Printer) -> None:
    """Follow a tape over SSE, resuming by id after drops; the first connection is bounded in time."""
    bound = network_timeout_s()
    await probe_server(base_url, token, opts.signal, bound)
    await _SseFollower(base_url, token, opts, printer, bound).run()
