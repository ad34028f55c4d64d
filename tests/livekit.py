"""Run an app's HTTP server on a free 127.0.0.1 port inside a test, and read raw SSE."""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from typing import Any, AsyncIterator

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_listening(port: int, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            _r, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def serving(app: Any, concurrency: int = 2, port: int | None = None) -> AsyncIterator[str]:
    """The app served (HTTP + workers) until the block ends; yields the base URL."""
    port = port or free_port()
    task = asyncio.create_task(app.serve(host="127.0.0.1", port=port, concurrency=concurrency))
    try:
        await wait_listening(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        await app.stop()
        await asyncio.wait_for(task, 20)


async def read_frames(client: httpx.AsyncClient, url: str, count: int, headers: dict[str, str] | None = None,
                      timeout: float = 10.0) -> tuple[httpx.Response, list[dict[str, Any]]]:
    """Open a stream and parse the first `count` frames ({"id":..., "data":...} raw, data undecoded)."""
    frames: list[dict[str, Any]] = []
    async with client.stream("GET", url, headers=headers or {}) as response:
        if response.status_code != 200:
            await response.aread()
            return response, frames
        current: dict[str, Any] = {}
        async with asyncio.timeout(timeout):
            async for line in response.aiter_lines():
                if line == "":
                    if current:
                        frames.append(current)
                        current = {}
                    if len(frames) >= count:
                        break
                    continue
                field, _, value = line.partition(": ") if ": " in line else (line.rstrip(":"), "", "")
                if line.startswith(":"):
                    current.setdefault("comment", True)
                    continue
                current[field] = value
        return response, frames


def data_of(frames: list[dict[str, Any]]) -> list[Any]:
    return [json.loads(f["data"]) for f in frames if "data" in f and f["data"] != "[DONE]"]
