"""A real `okconsole web` process on 127.0.0.1 with a known token, raw requests to it, and the
console processes it started (its descendants running `-m okconsole`, read from /proc)."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import time

import httpx

from consolekit import okconsole_cmd
from engine import oke, signal
from livekit import free_port, wait_listening
from prockit import children

TOKEN = "op3rator-t0ken-for-tests"


async def seed_signal(url: str, name: str = "shop.email") -> str:
    """A store with one pausable signal and one message of it; returns the message id."""
    task = signal.once(name, optional=True)
    async with oke("shop", database_url=url) as app:
        return await app.emit(task, {"to": "a@b.co"})


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def _is_console(pid: int) -> bool:
    """A console process: `python -m okconsole …` (not the shell textual-serve starts it with)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return any(a == b"-m" and b == b"okconsole" for a, b in zip(argv, argv[1:]))


class WebConsole:
    """`okconsole --db URL web --port P --token TOKEN [args…]`, stopped with SIGTERM."""

    def __init__(self, url: str, *args: str, token: str = TOKEN, env: dict[str, str] | None = None) -> None:
        self.url = url
        self.port = free_port()
        self.token = token
        self.args = args
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.stderr = ""

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> WebConsole:
        token = ["--token", self.token] if self.token else []
        self.proc = subprocess.Popen(
            [*okconsole_cmd(), "--db", self.url, "web", "--port", str(self.port), *token, *self.args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "160", **self.env},
        )
        await wait_listening(self.port, timeout=30)
        return self

    async def __aexit__(self, *_exc) -> None:
        assert self.proc is not None
        self.proc.terminate()
        try:
            _out, self.stderr = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _out, self.stderr = self.proc.communicate()

    def consoles(self) -> int:
        assert self.proc is not None
        return sum(1 for pid in descendants(self.proc.pid) if _is_console(pid))

    async def wait_consoles(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.consoles() != count:
            assert time.monotonic() < deadline, f"{self.consoles()} console processes, not {count}"
            await asyncio.sleep(0.1)

    async def cookie(self) -> str:
        """The `Cookie:` value the page gets for presenting the token."""
        async with httpx.AsyncClient() as client:
            answer = await client.get(f"{self.base}/?token={self.token}")
        assert answer.status_code == 303, answer.status_code
        name, value = answer.headers["set-cookie"].split(";")[0].split("=", 1)
        return f"{name}={value}"


class Upgrade:
    """A raw WebSocket handshake (HTTP/1.1 upgrade request) with exactly the headers given; the
    connection stays open after a 101, so the session it started lasts until `close`."""

    def __init__(self, port: int, headers: dict[str, str], path: str = "/ws?width=80&height=24") -> None:
        self.port = port
        self.headers = headers
        self.path = path
        self.writer: asyncio.StreamWriter | None = None

    async def status(self) -> int:
        reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {self.path} HTTP/1.1",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            *(f"{k}: {v}" for k, v in self.headers.items()),
        ]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await self.writer.drain()
        first = await asyncio.wait_for(reader.readline(), 30)
        return int(first.split()[1])

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass


async def upgrade_status(port: int, headers: dict[str, str], path: str = "/ws?width=80&height=24") -> int:
    """The status of one handshake; the connection is closed at once."""
    attempt = Upgrade(port, headers, path)
    try:
        return await attempt.status()
    finally:
        await attempt.close()
