"""The ceiling: a bare sse-starlette endpoint fed from one in-memory asyncio queue per subscriber.

    python bench/sse/bare_server.py --port P [--uvloop]

No store, no ids kept, no replay: a broadcaster puts each event into every subscriber's queue and
each stream yields it as a dict (the idiomatic EventSourceResponse use, which encodes the frame
per subscriber). Same uvicorn settings as `app.serve()`. stdin: {"cmd": "emit", ...} / {"cmd": "quit"}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _util import BARE_PATH, die_with_parent, emit_at_rate, payload, say, stdin_commands  # noqa: E402

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def make_app(subscribers: set[asyncio.Queue]):
    from sse_starlette import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.routing import Route

    async def stream(_request):
        queue: asyncio.Queue = asyncio.Queue()
        subscribers.add(queue)

        async def events():
            try:
                while True:
                    yield await queue.get()
            finally:
                subscribers.discard(queue)

        return EventSourceResponse(events(), ping=15, headers=SSE_HEADERS, sep="\n")

    return Starlette(routes=[Route(BARE_PATH, stream)])


async def main(args: argparse.Namespace) -> None:
    import uvicorn

    subscribers: set[asyncio.Queue] = set()
    # the same Config app.serve() builds (engine/app.py)
    server = uvicorn.Server(uvicorn.Config(make_app(subscribers), host="127.0.0.1", port=args.port,
                                           log_level="warning", lifespan="off", timeout_graceful_shutdown=5))
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task] = set()

    def broadcast(i: int) -> asyncio.Future:
        event = {"id": f"bare.{i + 1}", "data": json.dumps(payload(i), separators=(",", ":"))}
        for queue in list(subscribers):
            queue.put_nowait(event)
        done = loop.create_future()
        done.set_result(None)
        return done

    async def emit_cmd(rate: float, duration: float) -> None:
        say(**await emit_at_rate(broadcast, rate, duration))

    def handle(cmd: dict) -> None:
        if cmd["cmd"] == "emit":
            task = loop.create_task(emit_cmd(cmd["rate"], cmd["duration"]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        elif cmd["cmd"] == "quit":
            server.should_exit = True

    stdin_commands(loop, handle)
    say(pid=os.getpid(), starting=True)
    await server.serve()


if __name__ == "__main__":
    die_with_parent()
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--uvloop", action="store_true")
    ns = parser.parse_args()
    if ns.uvloop:
        import uvloop
        uvloop.run(main(ns))
    else:
        asyncio.run(main(ns))
