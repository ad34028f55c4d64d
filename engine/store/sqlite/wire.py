"""What the SQLite store and its writer process (child.py) send each other over their socket.

Each message is a 4-byte length and a `marshal`led tuple of plain values: both ends are the same
interpreter (the child is `sys.executable`), and marshal is the fastest codec for tuples of
numbers and strings. The parent sends `(id, op, args)`; the child answers `(id, ok, value)`, with
an error as `(class name, text, errno, SQLite error code)` so the parent raises what the writer
thread would have raised (outage.py tells a full disk from its error code). Id 0 from the child
is a line for the parent's log.
"""

from __future__ import annotations

import marshal
import sqlite3
import struct
from typing import Any

from ...errors import StoreUnavailable

_LENGTH = struct.Struct("!I")
LOG = 0  # the id of a child's log line: (0, level, text)


def frame(message: tuple[Any, ...]) -> bytes:
    data = marshal.dumps(message)
    return _LENGTH.pack(len(data)) + data


class Frames:
    """Cuts a byte stream back into messages."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self._buffer += data
        messages, at, buffer = [], 0, self._buffer
        while len(buffer) - at >= 4:
            (length,) = _LENGTH.unpack_from(buffer, at)
            if len(buffer) - at - 4 < length:
                break
            messages.append(marshal.loads(memoryview(buffer)[at + 4 : at + 4 + length]))
            at += 4 + length
        del buffer[:at]
        return messages


def error_to_wire(err: BaseException) -> tuple[str, str, int | None, int | None]:
    errno_ = err.errno if isinstance(err, OSError) else None
    text = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    return (type(err).__name__, text, errno_, getattr(err, "sqlite_errorcode", None))


def error_from_wire(wire: tuple[str, str, int | None, int | None]) -> BaseException:
    """The writer's error as the class it was (sqlite3's, an OSError, StoreUnavailable), else a
    RuntimeError that names it."""
    name, text, errno_, code = wire
    err: BaseException
    cls = getattr(sqlite3, name, None)
    if isinstance(cls, type) and issubclass(cls, sqlite3.Error):
        err = cls(text)
        if code is not None:
            err.sqlite_errorcode = code
    elif name == StoreUnavailable.__name__:
        err = StoreUnavailable(text)
    elif errno_ is not None:
        err = OSError(errno_, text)
    else:
        err = RuntimeError(f"{name} in the SQLite writer process: {text}")
    return err
