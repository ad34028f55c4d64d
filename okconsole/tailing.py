"""`okconsole tail`: follow a live tape from the store or over SSE, like `tail -f`.

By default the last 10 retained events, then every new one. A drop resumes
after the last id printed; a cursor the tape cannot honour (410 / a gap in the
store) is reported on stderr and the tail restarts from the oldest retained
event. Output is `<id>  <json>` per event, or NDJSON `{"id", "data"}` with --json.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
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


@dataclass
class TailOptions:
    signal: str
    after: str | None = None
    from_start: bool = False
    from_end: bool = False
    count: int | None = None
    as_json: bool = False


class UnknownTape(LookupError):
    def __init__(self, signal: str, known: list[str]) -> None:
        listed = ", ".join(known) if known else "none"
        super().__init__(f'unknown live signal "{signal}" (live signals: {listed})')


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


async def tail_sse(base_url: str, token: str | None, opts: TailOptions, printer: Printer) -> None:
    """Follow a tape over SSE, resuming by id after drops."""
    client = Client(base_url, token=token)
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
            stream = client.stream(opts.signal, {}, last_event_id=cursor, tail=tail, retry_first=connected_once)
            async with contextlib.aclosing(stream):
                async for event in stream:
                    connected_once = True
                    printer.event(event.id, event.data)
                    cursor = event.id
                    if printer.done:
                        return
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
