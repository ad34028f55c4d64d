"""SSE readers on raw asyncio connections (no HTTP client library): one process, many streams.

    python bench/sse/subscribers.py fanout --port P --path /x --count N
    python bench/sse/subscribers.py replay --port P --path /x --count 1 --until K --last-event-id ID

Each connection is an asyncio.Protocol that sends a plain HTTP/1.1 GET, checks the status line,
de-chunks the body and splits SSE frames on blank lines. For every `data:` frame it reads the
payload's `"t":` (the emitter's `time.time()`) and adds receive − emit to a 0.1 ms histogram.
Runs on uvloop when installed, so the readers cost as little as possible.

fanout: prints {"connected": n} when every stream has its 200 headers, {"progress": total} every
0.5 s, and on the stdin line "stop" the final stats (then closes every stream).
replay: one stream from a cursor; prints the time to the `until`-th event and exits.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _util import Histogram, die_with_parent, say  # noqa: E402

T_KEY = b'"t":'


class Shared:
    def __init__(self, until: int | None = None) -> None:
        self.hist = Histogram()
        self.received = 0
        self.opened = 0
        self.failed: list[str] = []
        self.lost = 0
        self.done_frames = 0
        self.first_recv: float | None = None
        self.last_recv: float | None = None
        self.until = until
        self.reached = asyncio.get_running_loop().create_future()
        self.all_open = asyncio.Event()
        self.want_open = 0
        self.stopping = False


class SseConn(asyncio.Protocol):
    def __init__(self, shared: Shared, request: bytes) -> None:
        self.shared = shared
        self.request = request
        self.transport: asyncio.Transport | None = None
        self.head: bytearray | None = bytearray()
        self.chunked = False
        self.raw = bytearray()
        self.left = 0          # bytes left in the current chunk's body
        self.skip = 0          # bytes of CRLF left after a chunk's body
        self.sse = b""         # incomplete SSE frame
        self.received = 0
        self.t_headers: float | None = None
        self.t_first: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.shared.stopping and self.head is None:
            self.shared.lost += 1

    def data_received(self, data: bytes) -> None:
        if self.head is not None:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self.head[:end]).split(b"\r\n")
            rest = bytes(self.head[end + 4:])
            self.head = None
            status = lines[0].split(b" ", 2)
            if len(status) < 2 or status[1] != b"200":
                self.shared.failed.append(lines[0].decode("latin-1"))
                self._count_open()
                self.transport.close()  # type: ignore[union-attr]
                return
            self.chunked = any(l.lower() == b"transfer-encoding: chunked" for l in lines[1:])
            self.t_headers = time.time()
            self.shared.opened += 1
            self._count_open()
            if not rest:
                return
            data = rest
        body = self._dechunk(data) if self.chunked else data
        if not body:
            return
        buf = self.sse + body if self.sse else body
        frames = buf.split(b"\n\n")
        self.sse = frames.pop()
        if not frames:
            return
        now = time.time()
        shared = self.shared
        hist = shared.hist
        got = 0
        for frame in frames:
            k = frame.find(b"data: ")
            if k < 0:
                continue  # a comment (heartbeat) or an id-only frame
            if frame.startswith(b"[DONE]", k + 6):
                shared.done_frames += 1
                continue
            j = frame.find(T_KEY, k)
            if j >= 0:
                e = frame.find(b",", j)
                hist.add_ms((now - float(frame[j + 4:e])) * 1000.0)
            got += 1
        if got:
            if self.t_first is None:
                self.t_first = now
            if shared.first_recv is None:
                shared.first_recv = now
            shared.last_recv = now
            self.received += got
            shared.received += got
            if shared.until is not None and self.received >= shared.until and not shared.reached.done():
                shared.reached.set_result(now)

    def _count_open(self) -> None:
        if self.shared.opened + len(self.shared.failed) >= self.shared.want_open:
            self.shared.all_open.set()

    def _dechunk(self, data: bytes) -> bytes:
        raw = self.raw
        raw += data
        out = []
        pos = 0
        n = len(raw)
        while pos < n:
            if self.left:
                take = min(self.left, n - pos)
                out.append(bytes(raw[pos:pos + take]))
                pos += take
                self.left -= take
                if self.left:
                    break
                self.skip = 2
            if self.skip:
                take = min(self.skip, n - pos)
                pos += take
                self.skip -= take
                if self.skip:
                    break
                continue
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(bytes(raw[pos:eol]).split(b";", 1)[0], 16)
            pos = eol + 2
            if size == 0:
                pos = n  # last chunk: the stream is over
                break
            self.left = size
        del raw[:pos]
        return b"".join(out)


def request_bytes(port: int, path: str, last_event_id: str | None) -> bytes:
    head = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Accept: text/event-stream",
            "Cache-Control: no-cache"]
    if last_event_id is not None:
        head.append(f"Last-Event-ID: {last_event_id}")
    return ("\r\n".join(head) + "\r\n\r\n").encode()


async def open_all(shared: Shared, port: int, path: str, count: int, last_event_id: str | None,
                   timeout: float) -> list[SseConn]:
    loop = asyncio.get_running_loop()
    request = request_bytes(port, path, last_event_id)
    conns: list[SseConn] = []
    gate = asyncio.Semaphore(64)
    shared.want_open = count

    async def one() -> None:
        async with gate:
            conn = SseConn(shared, request)
            try:
                await loop.create_connection(lambda: conn, "127.0.0.1", port)
                conns.append(conn)
            except OSError as err:
                shared.failed.append(f"connect: {err}")
                conn._count_open()

    await asyncio.gather(*(one() for _ in range(count)))
    await asyncio.wait_for(shared.all_open.wait(), timeout)
    return conns


async def fanout(args: argparse.Namespace) -> None:
    shared = Shared()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        loop.call_soon_threadsafe(stop.set)

    loop.run_in_executor(None, read_stdin)
    conns = await open_all(shared, args.port, args.path, args.count, args.last_event_id, 120.0)
    say(connected=shared.opened, failed=len(shared.failed), errors=shared.failed[:3])
    cpu0 = time.process_time()
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass
        say(progress=shared.received, lost=shared.lost, at=time.time())
    shared.stopping = True
    per_conn = [c.received for c in conns]
    say(final=True, received=shared.received, hist=shared.hist.dump(), first_recv=shared.first_recv,
        last_recv=shared.last_recv, per_conn_min=min(per_conn, default=0), per_conn_max=max(per_conn, default=0),
        lost=shared.lost, done_frames=shared.done_frames, cpu_s=time.process_time() - cpu0)
    for c in conns:
        if c.transport is not None:
            c.transport.close()
    await asyncio.sleep(0.05)


async def replay(args: argparse.Namespace) -> None:
    shared = Shared(until=args.until)
    cpu0 = time.process_time()
    t_request = time.time()
    conns = await open_all(shared, args.port, args.path, 1, args.last_event_id, 60.0)
    if shared.failed:
        say(final=True, error=shared.failed[0])
        return
    conn = conns[0]
    try:
        t_done = await asyncio.wait_for(shared.reached, args.timeout)
    except TimeoutError:
        t_done = None
    say(final=True, received=conn.received, t_request=t_request, t_headers=conn.t_headers,
        t_first=conn.t_first, t_done=t_done, lost=shared.lost, cpu_s=time.process_time() - cpu0)
    conn.transport.close()  # type: ignore[union-attr]
    await asyncio.sleep(0.05)


def main() -> None:
    die_with_parent()
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["fanout", "replay"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--until", type=int)
    parser.add_argument("--last-event-id")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--no-uvloop", action="store_true")
    args = parser.parse_args()
    run = fanout if args.mode == "fanout" else replay
    if not args.no_uvloop:
        try:
            import uvloop
        except ImportError:
            uvloop = None
        if uvloop is not None:
            uvloop.run(run(args))
            return
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
