"""What one request may cost the server before a route sees it: a bounded body, and the options for it.

The body limit is `max_payload_bytes` plus 64 KiB (room for the JSON around a payload). A request
that declares more by `Content-Length` is answered 413 before a byte of its body is read; a body
sent without a length (chunked) is counted as it is read and refused the moment it passes the limit,
so the server never holds more than the limit (and uvicorn's 64 KiB read buffer) of one body.

Starlette (1.6 and later) has a `RequestBodyLimitMiddleware`, but it answers in plain text rather
than the JSON envelope every other error carries, it lets the route's gates run before it answers a
declared length, and it keeps the connection open while the refused body streams in; this module
does those three differently and needs no newer Starlette than the engine asks for.
"""

from __future__ import annotations

from typing import Any

from .routes import HttpError

BODY_SLACK_BYTES = 64 * 1024  # a request's JSON around the payload: its other fields, whitespace, escapes


def check_max_connections(value: object) -> int:
    """`oke(max_connections=N)`: an int ≥ 1, refused at `oke()` rather than when the server starts."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"oke(max_connections=...): an int ≥ 1 (open HTTP connections, SSE streams included), got {value!r}"
        )
    return value


class PayloadTooLarge(HttpError):
    """A request body over the limit (413). The connection is closed after the answer: the rest of
    the body is never read, so the socket cannot carry another request."""

    status = 413
    code = "PayloadTooLarge"

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over {limit} bytes (max_payload_bytes + {BODY_SLACK_BYTES})")


class BodyLimit:
    """One request's body budget: the declared length checked up front, the received bytes counted."""

    def __init__(self, max_payload_bytes: int) -> None:
        self.limit = max_payload_bytes + BODY_SLACK_BYTES
        self.received = 0

    def declared_over(self, scope: dict[str, Any]) -> bool:
        """True when `Content-Length` says more than the limit (uvicorn's parser has already refused
        a malformed or contradictory one; anything else unreadable here is left to the counting)."""
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                text = value.strip()  # bytes: isdigit() is ASCII digits only
                digits = text.lstrip(b"0") or b"0"
                # more than 18 digits is over any limit: no need to make an int of 4,000 of them
                if text.isdigit() and (len(digits) > 18 or int(digits) > self.limit):
                    return True
        return False

    def counting(self, receive: Any) -> Any:
        """`receive` that raises PayloadTooLarge once the body passes the limit, before handing it on."""

        async def counted() -> dict[str, Any]:
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                self.received += len(message.get("body", b""))
                if self.received > self.limit:
                    raise PayloadTooLarge(self.limit)
            return message

        return counted
