"""The HTTP protocol `app.serve` runs under uvicorn: uvicorn's own, with a deadline for request headers.

uvicorn has no header timeout. Its `timeout_keep_alive` runs only between two requests and is
cancelled by the first byte of the next one, and nothing at all runs before a connection's first
request, so a client that sends a header line now and then (slowloris) holds its connection, and a
place under `max_connections`, for as long as it likes. This subclass arms one timer when a request
is awaited (the connection opens, or a response completes) and cancels it when that request's
headers are complete; when it fires, the connection is closed.

The base is the class uvicorn's "auto" setting picks (httptools when installed, else h11). Both keep
the request in progress as `self.cycle`, a new object once a request's headers are parsed, and call
`on_response_complete` when a response ends; that is all this subclass relies on.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # checked against h11's protocol; at run time the one uvicorn picks
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base
else:
    from uvicorn.protocols.http.auto import AutoHTTPProtocol as _Base

HEADER_TIMEOUT_S = 10.0


class HeaderDeadlineProtocol(_Base):
    """uvicorn's HTTP/1.1 protocol; a request whose headers take over 10 s ends its connection."""

    header_timeout_s = HEADER_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._before: Any = None  # the cycle that was current when the awaited request was due

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._deadline is not None and self.cycle is not self._before:
            self._cancel()  # the awaited request's headers are in: a new cycle serves it

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_headers()

    def handle_websocket_upgrade(self, *args: Any) -> None:
        self._cancel()  # the connection is the WebSocket protocol's from now on
        super().handle_websocket_upgrade(*args)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        self._cancel()
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a pipelined request already started: its headers are in
        self._before = self.cycle
        self._deadline = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
