"""How a handler's exception is recorded: a code, a message and a traceback that never raise themselves."""

from __future__ import annotations

import traceback

from .errors import OkeError

TRACEBACK_BYTES = 8 * 1024  # what a failure keeps of its traceback: the end, where the raise is
CUT_MARK = "… cut: the last {kept:,} of {total:,} bytes of this traceback\n"


def failure_code(exc: BaseException) -> str:
    """The exception's string `code` attribute if it has one, else its class name."""
    if isinstance(exc, OkeError):
        return f"OKE{exc.code}"
    try:
        code = getattr(exc, "code", None)
    except Exception:  # a `code` property that raises: fall back to the class name
        code = None
    return code if isinstance(code, str) and code else type(exc).__name__


def failure_message(exc: BaseException) -> str:
    """`str(exc)`, or a stand-in when the exception cannot describe itself."""
    try:
        return str(exc)
    except Exception as err:
        return f"<str() of {type(exc).__name__} failed: {type(err).__name__}>"


def failure_traceback(exc: BaseException, limit: int = TRACEBACK_BYTES) -> str:
    """The exception's formatted traceback, its last `limit` bytes of UTF-8 at most, marker included.

    Formatted only for a failed attempt (never on success). A longer one keeps its end, where the
    raise is, from a character boundary on, after a leading line saying it was cut. Both stores keep
    it as text: a NUL (PostgreSQL text cannot hold one) and a lone surrogate (not UTF-8) are written
    as their escapes; other control characters are stored as raised and escaped where shown."""
    try:
        formatted = "".join(traceback.format_exception(exc))
    except Exception as err:  # a traceback module failure must not lose the outcome
        formatted = f"<the traceback of {type(exc).__name__} could not be formatted: {type(err).__name__}>"
    data = formatted.replace("\x00", "\\x00").encode("utf-8", errors="backslashreplace")
    if len(data) <= limit:
        return data.decode("utf-8")
    marker = CUT_MARK.format(kept=limit, total=len(data))
    start = len(data) - (limit - len(marker.encode("utf-8")))
    while start < len(data) and data[start] & 0xC0 == 0x80:  # a continuation byte: not a boundary
        start += 1
    return marker + data[start:].decode("utf-8")
