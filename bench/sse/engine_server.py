"""The okengine side: `app.serve()` with one public firehose, in its own process.

    python bench/sse/engine_server.py --db URL --port P [--uvloop]

stdin takes JSON commands: {"cmd": "emit", "rate": R, "duration": S} emits from inside this process
(`app.emit`, which also wakes the local hub at once) and answers with one JSON line;
{"cmd": "quit"} (or EOF) stops the app, which ends open streams with `data: [DONE]`.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

from _util import SIGNAL_NAME, die_with_parent, emit_at_rate, payload, say, stdin_commands  # noqa: E402


def declare():
    from engine import http, on, signal

    sig = signal.live(SIGNAL_NAME)
    on(http.live(sig).public())
    return sig


async def main(args: argparse.Namespace) -> None:
    from engine import oke

    sig = declare()
    app = oke("sse-bench", database_url=args.db)
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task] = set()

    async def emit_cmd(rate: float, duration: float) -> None:
        result = await emit_at_rate(lambda i: app.emit(sig, payload(i)), rate, duration)
        say(**result)

    def handle(cmd: dict) -> None:
        if cmd["cmd"] == "emit":
            task = loop.create_task(emit_cmd(cmd["rate"], cmd["duration"]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        elif cmd["cmd"] == "quit":
            loop.create_task(app.stop())

    stdin_commands(loop, handle)
    say(pid=os.getpid(), starting=True)
    await app.serve(host="127.0.0.1", port=args.port, concurrency=1)
    await app.close()


if __name__ == "__main__":
    die_with_parent()
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--uvloop", action="store_true")
    ns = parser.parse_args()
    if ns.uvloop:
        import uvloop
        uvloop.run(main(ns))
    else:
        asyncio.run(main(ns))
