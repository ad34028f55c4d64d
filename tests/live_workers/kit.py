"""Test helpers over real sockets: raw HTTP requests, an incremental SSE reader, subprocesses.

Nothing here imitates the engine: requests go over TCP to a real uvicorn on 127.0.0.1, and the
subprocess helpers start real Python processes running the scripts beside this file.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal as os_signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def raw_request(port: int, method: str, target: str, headers: dict[str, str] | None = None,
                      body: bytes = b"", timeout: float = 5.0) -> RawResponse:
    """Send `target` byte for byte (no client-side normalisation of `..`, `//` or `%xx`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body:
            lines.append(f"Content-Length: {len(body)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        async with asyncio.timeout(timeout):
            head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ")[1])
        hdrs = {}
        for line in header_lines:
            if ":" in line:
                k, _, v = line.partition(":")
                hdrs[k.strip().lower()] = v.strip()
        if hdrs.get("content-type", "").startswith("text/event-stream"):
            return RawResponse(status, hdrs, b"")  # a stream: the status is what we wanted
        async with asyncio.timeout(timeout):
            if "content-length" in hdrs:
                data = await reader.readexactly(int(hdrs["content-length"]))
            else:
                data = await reader.read()
        return RawResponse(status, hdrs, data)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


@dataclass
class Frame:
    raw: bytes
    id: str | None = None
    data: str | None = None
    comment: bool = False
    fields: list[tuple[str, str]] = field(default_factory=list)

    @property
    def value(self) -> Any:
        return json.loads(self.data) if self.data is not None else None

    @property
    def is_event(self) -> bool:
        return self.data is not None and self.data != "[DONE]"


def parse_frame(raw: bytes) -> Frame:
    frame = Frame(raw)
    for line in raw.decode().split("\n"):
        if line.startswith(":"):
            frame.comment = True
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        frame.fields.append((name, value))
        if name == "id":
            frame.id = value
        elif name == "data":
            frame.data = value if frame.data is None else frame.data + "\n" + value
    return frame


class SSE:
    """One open SSE response read frame by frame, the exact bytes kept.

    A pump task reads the body into a queue, so a timed-out wait never cancels the read itself.
    """

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._buffer = b""
        self.ended = False
        self._pump = asyncio.create_task(self._read()) if response.status_code == 200 else None

    async def _read(self) -> None:
        try:
            async for chunk in self.response.aiter_raw():
                self._queue.put_nowait(chunk)
        except (httpx.HTTPError, asyncio.CancelledError):
            pass
        finally:
            self._queue.put_nowait(None)

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(BaseException):
                await self._pump

    async def frame(self, timeout: float = 10.0) -> Frame:
        async with asyncio.timeout(timeout):
            while b"\n\n" not in self._buffer:
                if self.ended:
                    raise EOFError(f"stream ended; unparsed: {self._buffer!r}")
                chunk = await self._queue.get()
                if chunk is None:
                    self.ended = True
                    continue
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\n\n", 1)
        return parse_frame(raw + b"\n\n")

    async def events(self, count: int, timeout: float = 10.0) -> list[Frame]:
        """The next `count` frames carrying data (heartbeats skipped)."""
        out: list[Frame] = []
        async with asyncio.timeout(timeout):
            while len(out) < count:
                f = await self.frame(timeout)
                if f.is_event:
                    out.append(f)
        return out

    async def rest(self, timeout: float = 10.0) -> list[Frame]:
        """Every frame until the server closes the stream."""
        out: list[Frame] = []
        async with asyncio.timeout(timeout):
            while True:
                try:
                    out.append(await self.frame(timeout))
                except EOFError:
                    return out

    async def silent_for(self, seconds: float) -> bool:
        """True when no frame at all arrives within `seconds`."""
        try:
            f = await self.frame(seconds)
        except TimeoutError:
            return True
        self._buffer = f.raw + self._buffer
        return False


@contextlib.asynccontextmanager
async def sse(client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None
              ) -> AsyncIterator[SSE]:
    async with client.stream("GET", url, headers=headers or {}) as response:
        if response.status_code != 200:
            await response.aread()
        stream = SSE(response)
        try:
            yield stream
        finally:
            await stream.close()


def ids_of(frames: list[Frame]) -> list[str]:
    return [f.id for f in frames if f.is_event]


def seqs_of(frames: list[Frame]) -> list[int]:
    return [int(f.id.split(".")[1]) for f in frames if f.is_event]


# ------------------------------------------------------------------------------ subprocesses

class Proc:
    """A Python script from tests/live_workers run as a real child process."""

    def __init__(self, script: str, *args: str, env: dict[str, str] | None = None) -> None:
        full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE.parent)]),
                    "PYTHONUNBUFFERED": "1", **(env or {})}
        self.popen = subprocess.Popen([sys.executable, str(HERE / script), *args], env=full_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    async def wait_line(self, wanted: str, timeout: float = 20.0) -> str:
        """Block (in a thread) until the child prints a line starting with `wanted`."""
        def read() -> str:
            assert self.popen.stdout is not None
            for line in self.popen.stdout:
                if line.startswith(wanted):
                    return line.strip()
            raise RuntimeError(f"child exited ({self.popen.wait()}) before printing {wanted!r}: "
                               f"{self.popen.stderr.read() if self.popen.stderr else ''}")
        return await asyncio.wait_for(asyncio.to_thread(read), timeout)

    def terminate(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(os_signal.SIGTERM)

    async def wait(self, timeout: float = 20.0) -> int:
        return await asyncio.wait_for(asyncio.to_thread(self.popen.wait), timeout)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    def stderr(self) -> str:
        if self.popen.poll() is None or self.popen.stderr is None:
            return ""
        return self.popen.stderr.read()


# ------------------------------------------------------------------------------ plain SQL reads

async def sql(url: str, query: str, *args: Any) -> list[tuple]:
    """Rows of one query with the database's own driver (PostgreSQL `$n` placeholders)."""
    import re
    import sqlite3

    import asyncpg

    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.split(":///", 1)[1], timeout=30)
        try:
            return [tuple(r) for r in conn.execute(re.sub(r"\$\d+", "?", query), args).fetchall()]
        finally:
            conn.close()
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1), timeout=10)
    try:
        return [tuple(r) for r in await conn.fetch(query, *args)]
    finally:
        await conn.close()


async def tape_rows(url: str, signal: str) -> list[int]:
    """The seqs a tape still holds, oldest first."""
    return [r[0] for r in await sql(url, "SELECT seq FROM oke_tape_events WHERE signal = $1 ORDER BY seq", signal)]
