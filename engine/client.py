"""The Python client for live tapes: `stream()` and `live()` with resume and back-off.

It asks the server which exposures a signal has (`/_oke/exposures`, which lists those the
caller's token passes; with none listed it asks the firehose, whose 401/403/404 says why), picks the
auto-match one whose path params are the largest subset of the input (a tie
needs `via`; a custom flow's exposure is used only when `via` names its flow or
path), and follows it: reconnects send `Last-Event-ID` from the last id received (an
id-only heartbeat frame counts). The seeds' rule for what happens when a stream ends:
`auto_resubscribe=False` (the default) → a drop raises `StreamDropped` and a 410 raises
`LiveResumeGap`, and the subscription ends; `True` → reopen after a back-off of 500 ms doubling
to 30 s, and on a 410 drop the cursor and replay the remaining tape. A stream silent for longer
than `idle_s` (no event, no heartbeat: a half-open connection, a stalled proxy) counts as a drop.
The browser module the server serves at `/_oke/client.js` (engine/http/client.js) follows the
same rules.
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


class StreamDropped(RuntimeError):
    """A stream that dropped (or never opened) with `auto_resubscribe=False`: the subscription ends.

    `last_id` is the last id received (None before any): pass it as `last_event_id` to resume.
    """

    def __init__(self, signal: str, last_id: str | None, opened: bool, cause: BaseException) -> None:
        what = "dropped" if opened else "could not open"
        after = f' after "{last_id}"' if last_id else ""
        super().__init__(
            f'live "{signal}": the stream {what}{after} ({type(cause).__name__}: {cause}); '
            "resume with last_event_id=, or pass auto_resubscribe=True to reopen by itself"
        )
        self.signal = signal
        self.last_id = last_id
        self.opened = opened


class BadFrame(ValueError):
    """A `data:` frame that is not JSON (our server never sends one; a proxy or another server may).
    `stream()` raises it unless given `on_bad_frame`; `live()` hands it to `on_error` and goes on."""

    def __init__(self, signal: str, event_id: str, data: str) -> None:
        shown = data if len(data) <= 80 else data[:80] + "…"
        super().__init__(f'live "{signal}": a data frame that is not JSON (id {event_id!r}): {shown!r}')
        self.signal = signal
        self.event_id = event_id


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
        # jitter only lengthens the wait: the back-off stays within 500 ms … 30 s
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

    async def path_for(
        self, client: httpx.AsyncClient, signal: str | None, params: dict[str, Any], via: str | None
    ) -> str:
        """The URL path of the exposure to follow (by the choice rule of docs/reference.md); `signal=None` with `via`:
        the exposure of the flow named `via`, whatever its signal (`Client.flow(name)`)."""
        listed = await self.exposures(client)
        if signal is None:
            assert via is not None, "an exposure is chosen by its signal, or by its flow's name"
            chosen = _of_flow(listed, via)
            signal = chosen["signal"]
        else:
            exposures = [e for e in listed if e["signal"] == signal]
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

    def flow(self, name: str) -> FlowLive:
        """The live exposure a flow serves, by the flow's name (the seeds' `api.orders.events(...)`)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"Client.flow(name): a flow name is a non-empty string, got {name!r}")
        return FlowLive(self, name)

    def stream(
        self,
        signal: Signal | str,
        params: dict[str, Any] | None = None,
        *,
        last_event_id: str | None = None,
        via: str | None = None,
        auto_resubscribe: bool = False,
        on_open: Callable[[], Any] | None = None,
        tail: int | None = None,
        retry_first: bool = True,
        on_bad_frame: Callable[[BadFrame], Any] | None = None,
    ) -> AsyncIterator[LiveEvent]:
        """Events of a live tape, resuming by id, until the caller stops iterating or it ends.

        With `auto_resubscribe=False` a drop raises `StreamDropped` and a 410 `LiveResumeGap`; with
        True both reopen after the back-off (a 410 from the start of the remaining tape).
        `tail=N` starts a cursor-less stream at the last N retained events (0: only new ones);
        `retry_first=False` (with auto_resubscribe) raises if the very first connection fails.
        A non-JSON `data:` frame raises `BadFrame`, or goes to `on_bad_frame` and the stream goes on.
        """
        plan = _Plan(
            _signal_name(signal), dict(params or {}), via, auto_resubscribe, retry_first, on_open, on_bad_frame
        )
        return self._events(plan, _Resume(last_event_id, tail))

    async def _events(self, plan: _Plan, resume: _Resume) -> AsyncGenerator[LiveEvent, None]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(self.timeout, read=self.idle_s)) as client:
            url: str | None = None
            while True:
                try:
                    if url is None:  # inside the retry: a server not up yet is retried like a drop
                        url = self.base_url + await self.path_for(client, plan.signal, plan.params, plan.via)
                    async with aclosing(self._connection(client, url, resume, plan)) as events:
                        async for event in events:
                            yield event
                except LiveResumeGap:
                    if not plan.auto_resubscribe:
                        raise
                    resume.forget()
                except (_Ended, httpx.TransportError, _Unavailable) as err:
                    if not plan.auto_resubscribe:
                        raise StreamDropped(plan.label, resume.cursor, resume.connected, err) from err
                    if not resume.connected and not plan.retry_first:
                        raise
                await resume.back_off()

    async def _connection(
        self, client: httpx.AsyncClient, url: str, resume: _Resume, plan: _Plan
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
            if plan.on_open is not None:
                plan.on_open()
            async for sse in source.aiter_sse():
                if sse.id:
                    resume.cursor = sse.id
                if sse.data == "[DONE]":
                    raise _Ended("the server ended the stream (it is shutting down)")
                if not sse.data:  # a heartbeat (httpx-sse yields id-only frames as empty events)
                    continue
                try:
                    data = json.loads(sse.data)
                except ValueError:
                    bad = BadFrame(plan.label, sse.id, sse.data)
                    if plan.on_bad_frame is None:
                        raise bad from None
                    plan.on_bad_frame(bad)
                    continue
                yield LiveEvent(sse.id, data)

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
        """Follow a tape with callbacks; returns `stop()`. Runs on the current loop, else a thread.

        `on_error` gets what ends the subscription (`StreamDropped`, `LiveResumeGap`, `ClientError`,
        a bad choice of exposure) and, without ending it, a `BadFrame`."""
        plan = _Plan(_signal_name(signal), dict(params or {}), via, auto_resubscribe, True, on_open, on_error)
        return self._follow(plan, last_event_id, on_event, on_error)

    def _follow(
        self,
        plan: _Plan,
        last_event_id: str | None,
        on_event: Callable[[LiveEvent], Any],
        on_error: Callable[[BaseException], Any] | None,
    ) -> Callable[[], None]:
        async def follow() -> None:
            try:
                async with aclosing(self._events(plan, _Resume(last_event_id, None))) as events:
                    async for event in events:
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


@dataclass(frozen=True)
class _Plan:
    """What one subscription follows and how it treats a drop, a gap and a bad frame."""

    signal: str | None  # None: the exposure of the flow named by `via`, whatever its signal
    params: dict[str, Any]
    via: str | None
    auto_resubscribe: bool
    retry_first: bool
    on_open: Callable[[], Any] | None
    on_bad_frame: Callable[[BadFrame], Any] | None

    @property
    def label(self) -> str:
        return self.signal if self.signal is not None else f"flow {self.via}"


class FlowLive:
    """`Client.flow(name)`: subscribe through the exposure a named flow serves; its signal and path
    come from the server's listing, so the caller names only the flow."""

    def __init__(self, client: Client, name: str) -> None:
        self.client = client
        self.name = name

    def stream(
        self,
        params: dict[str, Any] | None = None,
        *,
        last_event_id: str | None = None,
        auto_resubscribe: bool = False,
        on_open: Callable[[], Any] | None = None,
    ) -> AsyncIterator[LiveEvent]:
        plan = _Plan(None, dict(params or {}), self.name, auto_resubscribe, True, on_open, None)
        return self.client._events(plan, _Resume(last_event_id, None))

    def live(
        self,
        params: dict[str, Any] | None = None,
        *,
        on_event: Callable[[LiveEvent], Any],
        on_error: Callable[[BaseException], Any] | None = None,
        on_open: Callable[[], Any] | None = None,
        auto_resubscribe: bool = False,
        last_event_id: str | None = None,
    ) -> Callable[[], None]:
        plan = _Plan(None, dict(params or {}), self.name, auto_resubscribe, True, on_open, on_error)
        return self.client._follow(plan, last_event_id, on_event, on_error)


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


def _of_flow(exposures: list[dict[str, Any]], flow: str) -> dict[str, Any]:
    """The exposure the flow named `flow` serves (flows of custom exposures are listed by name)."""
    for exposure in exposures:
        if exposure.get("flow") == flow:
            return exposure
    named = sorted({e["flow"] for e in exposures if e.get("flow")})
    raise ValueError(
        f'flow "{flow}": no live exposure listed here is served by a flow of that name '
        f"(flows: {', '.join(named) or 'none'}; a gated one is listed only to a caller its gate admits)"
    )


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
