"""The Python client for live tapes: `stream()` and `live()` with resume and back-off.

It asks the server which exposures a signal has (`/_oke/exposures`, which lists those the
caller's token passes; with none listed it asks the firehose, whose 401/403/404 says why), picks the
auto-match one whose path params are the largest subset of the input (a tie
needs `via`; a custom flow's exposure is used only when `via` names its flow or
path), and follows it: reconnects send `Last-Event-ID` from the last id received (an
id-only heartbeat frame counts), a 410 raises `LiveResumeGap` — or, with
`auto_resubscribe`, drops the cursor and replays the remaining tape after a
back-off of 500 ms doubling to 30 s. A stream silent for longer than `idle_s` (no
event, no heartbeat: a half-open connection, a stalled proxy) counts as a drop.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from .errors import OkeError
from .http.routes import fill_path, live_path
from .signals import Signal

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
# Three of the server's default 15 s heartbeats: a stream silent this long is taken as dropped.
DEFAULT_IDLE_S = 45.0


@dataclass(frozen=True)
class LiveEvent:
    id: str
    data: Any


class LiveResumeGap(OkeError):
    """The server cannot resume after the cursor (410): it was malformed, reset, unknown or pruned."""

    def __init__(
        self, signal: str, after_id: str, reason: str | None, first_id: str | None, missed: int | None
    ) -> None:
        super().__init__(
            1210,
            f'Cursor "{after_id}" missing on "{signal}".',
            "Reconnect without a cursor to replay the retained tape.",
            data={"signal": signal, "afterId": after_id, "reason": reason, "firstId": first_id, "missed": missed},
        )
        self.signal = signal
        self.after_id = after_id
        self.reason = reason
        self.first_id = first_id
        self.missed = missed


class ClientError(RuntimeError):
    """The server answered with an error other than 410 (401, 403, 404, 5xx)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code


class _Ended(Exception):
    """The server ended the stream with `data: [DONE]` (it is shutting down)."""


class _Unavailable(ClientError):
    """502/503/504: the server (or its database) is away for now; retried like a dropped stream."""


class _Resume:
    """Where a stream resumes (the last id received, or the tail to start at) and its back-off."""

    def __init__(self, cursor: str | None, tail: int | None) -> None:
        self.cursor = cursor
        self.tail = tail
        self.backoff = BACKOFF_MIN_S
        self.connected = False  # a connection was answered 200 at least once

    def opened(self) -> None:
        self.backoff = BACKOFF_MIN_S
        self.connected = True

    def forget(self) -> None:
        """After a 410 with auto_resubscribe: replay the remaining tape from its start."""
        self.cursor = None
        self.tail = None

    async def back_off(self) -> None:
        # jitter only lengthens the wait: the back-off stays within 500 ms … 30 s (SPEC §8)
        await asyncio.sleep(min(self.backoff * (1 + 0.25 * random.random()), BACKOFF_MAX_S))
        self.backoff = min(self.backoff * 2, BACKOFF_MAX_S)


def _signal_name(signal: Signal | str) -> str:
    return signal.name if isinstance(signal, Signal) else signal


class Client:
    def __init__(
        self, base_url: str, token: str | None = None, *, timeout: float = 10.0, idle_s: float | None = DEFAULT_IDLE_S
    ) -> None:
        """`idle_s`: how long a stream may stay silent before it is dropped and resumed (keep it
        above the server's `sse_heartbeat_s`; None waits forever)."""
        for name, value in (("timeout", timeout), ("idle_s", idle_s)):
            if value is None and name == "idle_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"Client({name}=...): seconds > 0, got {value!r}")
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.idle_s = idle_s
        self._exposures: list[dict[str, Any]] | None = None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def exposures(self, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        if self._exposures is None:
            response = await client.get(f"{self.base_url}/_oke/exposures", headers=self._headers())
            _raise_for_error(response, "")
            self._exposures = response.json()["data"]
        return self._exposures

    async def path_for(self, client: httpx.AsyncClient, signal: str, params: dict[str, Any], via: str | None) -> str:
        """The URL path of the exposure to follow (SPEC §8 choice rule)."""
        exposures = [e for e in await self.exposures(client) if e["signal"] == signal]
        if not exposures and via is None:
            # the server lists only what this caller's gates let through: with none listed, ask the
            # firehose's path and let the server say why (401/403 for a refused token, 404 for none)
            return live_path(signal)
        chosen = _named(exposures, signal, via) if via is not None else _best_fit(exposures, signal, params)
        missing = [name for name in chosen["params"] if name not in params]
        if missing:
            raise ValueError(f'"{signal}" at {chosen["path"]} needs the params {", ".join(missing)}')
        try:
            return fill_path(chosen["path"], params)
        except (TypeError, ValueError) as err:
            raise ValueError(f'"{signal}" at {chosen["path"]}: a param value JSON cannot write ({err})') from err

    async def stream(
        self,
        signal: Signal | str,
        params: dict[str, Any] | None = None,
        *,
        last_event_id: str | None = None,
        via: str | None = None,
        auto_resubscribe: bool = False,
        reconnect: bool = True,
        on_open: Callable[[], Any] | None = None,
        tail: int | None = None,
        retry_first: bool = True,
    ) -> AsyncIterator[LiveEvent]:
        """Events of a live tape, resuming by id across drops, until the caller stops iterating.

        `tail=N` starts a cursor-less stream at the last N retained events (0: only new ones);
        `retry_first=False` raises if the very first connection fails instead of retrying.
        """
        name = _signal_name(signal)
        params = dict(params or {})
        resume = _Resume(last_event_id, tail)
        async with httpx.AsyncClient(timeout=httpx.Timeout(self.timeout, read=self.idle_s)) as client:
            url: str | None = None
            while True:
                try:
                    if url is None:  # inside the retry: a server not up yet is retried like a drop
                        url = self.base_url + await self.path_for(client, name, params, via)
                    async with aclosing(self._connection(client, url, resume, on_open)) as events:
                        async for event in events:
                            yield event
                except LiveResumeGap:
                    if not auto_resubscribe:
                        raise
                    resume.forget()
                except (_Ended, httpx.TransportError, _Unavailable):
                    if not resume.connected and not retry_first:
                        raise
                    if not reconnect:
                        return
                await resume.back_off()

    async def _connection(
        self, client: httpx.AsyncClient, url: str, resume: _Resume, on_open: Callable[[], Any] | None
    ) -> AsyncGenerator[LiveEvent, None]:
        """One connection's events, moving the cursor; `_Ended` on `data: [DONE]`, the server's error
        (410 as LiveResumeGap) when it does not answer 200."""
        headers = {**self._headers(), "Accept": "text/event-stream"}
        query: dict[str, str] = {}
        if resume.cursor:
            headers["Last-Event-ID"] = resume.cursor
        elif resume.tail is not None:
            query["tail"] = str(resume.tail)
        async with aconnect_sse(client, "GET", url, headers=headers, params=query) as source:
            if source.response.status_code != 200:
                await source.response.aread()
                _raise_for_error(source.response, resume.cursor or "")
            resume.opened()
            if on_open is not None:
                on_open()
            async for sse in source.aiter_sse():
                if sse.id:
                    resume.cursor = sse.id
                if sse.data == "[DONE]":
                    raise _Ended()
                if sse.data:  # else a heartbeat (httpx-sse yields id-only frames as empty events)
                    yield LiveEvent(sse.id, json.loads(sse.data))

    def live(
        self,
        signal: Signal | str,
        params: dict[str, Any] | None = None,
        *,
        on_event: Callable[[LiveEvent], Any],
        on_error: Callable[[BaseException], Any] | None = None,
        on_open: Callable[[], Any] | None = None,
        auto_resubscribe: bool = False,
        via: str | None = None,
        last_event_id: str | None = None,
    ) -> Callable[[], None]:
        """Follow a tape with callbacks; returns `stop()`. Runs on the current loop, else a thread."""

        async def follow() -> None:
            try:
                async for event in self.stream(
                    signal,
                    params,
                    last_event_id=last_event_id,
                    via=via,
                    auto_resubscribe=auto_resubscribe,
                    on_open=on_open,
                ):
                    on_event(event)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                if on_error is not None:
                    on_error(err)

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return _follow_in_thread(follow)
        task = loop.create_task(follow())

        def cancel() -> None:
            task.cancel()

        return cancel


def _follow_in_thread(follow: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Without a running loop: follow on a loop of its own in a daemon thread; `stop()` cancels it."""
    own = asyncio.new_event_loop()
    holder: dict[str, asyncio.Task[None]] = {}

    def run() -> None:
        asyncio.set_event_loop(own)
        holder["task"] = own.create_task(follow())
        try:
            own.run_until_complete(holder["task"])
        except asyncio.CancelledError:
            pass
        finally:
            own.close()

    thread = threading.Thread(target=run, name="oke-client-live", daemon=True)
    thread.start()

    def stop() -> None:
        task = holder.get("task")
        if task is not None and not own.is_closed():
            own.call_soon_threadsafe(task.cancel)
        thread.join(timeout=5)

    return stop


def _named(exposures: list[dict[str, Any]], signal: str, via: str) -> dict[str, Any]:
    """The exposure `via` names: by the exposing flow's name or by its path."""
    for exposure in exposures:
        if via in (exposure["path"], exposure.get("flow")):
            return exposure
    names = [e["path"] + (f' (flow "{e["flow"]}")' if e.get("flow") else "") for e in exposures]
    raise ValueError(
        f'via="{via}": no exposure of "{signal}" has that flow name or path '
        f"(exposed at: {', '.join(names) or 'nowhere'})"
    )


def _best_fit(exposures: list[dict[str, Any]], signal: str, params: dict[str, Any]) -> dict[str, Any]:
    """Among the auto-match exposures (custom flows never compete), the one whose path params are
    the largest subset of the input; the firehose is the empty set. A tie needs `via`."""
    fitting = [e for e in exposures if not e.get("custom", False) and set(e["params"]) <= set(params)]
    if not fitting:
        custom = [e.get("flow") or e["path"] for e in exposures if e.get("custom", False)]
        hint = f" (custom flows, chosen only by via: {', '.join(custom)})" if custom else ""
        raise ValueError(f'"{signal}" has no exposure whose path params fit {sorted(params)}{hint}')
    best = max(len(set(e["params"])) for e in fitting)
    chosen = [e for e in fitting if len(set(e["params"])) == best]
    if len(chosen) > 1:
        raise ValueError(
            f'"{signal}" has {len(chosen)} exposures that fit equally well '
            f"({', '.join(e['path'] for e in chosen)}): pass via=PATH"
        )
    return chosen[0]


def _raise_for_error(response: httpx.Response, cursor: str) -> None:
    if response.status_code < 400:
        return
    kind = _Unavailable if response.status_code in (502, 503, 504) else ClientError
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        raise kind(response.status_code, "HTTPError", response.text[:200]) from None
    if response.status_code == 410:
        data = error.get("data") or {}
        raise LiveResumeGap(
            data.get("signal", ""),
            data.get("afterId", cursor),
            data.get("reason"),
            data.get("firstId"),
            data.get("missed"),
        )
    raise kind(response.status_code, error.get("code", "HTTPError"), error.get("message", ""))
