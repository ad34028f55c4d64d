"""A store full of the hostile corpus (hostilekit), made through the engine as strangers would fill it:
every screen of the console is visited on it and must show it inert.

    seeded = await seed_hostile(url)  # the ids to visit; the names are this module's constants

    python -m hostilestore URL        # the same, from a shell (the pty test seeds in a subprocess)

It holds a once signal whose name, description and flow carry markup, messages whose payloads and
keys hold the corpus, dead letters whose failure code and message are `[/]`, `[/tmp/x] not found`,
HOSTILE_ERROR and a 100 KB traceback-like text, a 10 MB payload, a live tape of hostile events, an
audit entry with a hostile actor and reason, and a worker whose id and app name carry it all.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any

from hostilekit import BIG_PAYLOAD_BYTES, HOSTILE, HOSTILE_ERROR, HOSTILE_KEY, big_payload

import engine
from engine import flow, oke, on, ops, signal
from engine.store import make_store

SIGNAL = "orders [bold red]RED[/] [blink]x[/blink]"
FLOW = "flows.[blink]f[/blink][/]"
TAPE = "tape[bold red]T[/]"
DESCRIPTION = "about [blink]this[/blink] \x1b]52;c;SEFDS0VE\x07 signal"
APP = "app\x1b[5m[b]A[/b]"
WORKER = "worker\x1b]52;c;SEFDS0VE\x07[blink]w[/blink]"
ACTOR = "actor\x1b]52;c;SEFDS0VE\x07[blink]a[/blink]"
LONG_ERROR = "Traceback (most recent call last):\n" + '  File "[/x.py]", line 1, in <module>\n' * 3000
# the failures the dead letters end with: (code, message)
FAILURES = [
    ("Plain", "[/]"),
    ("Plain", "[/tmp/x] not found"),
    ("\x1b[5m[bold]CODE[/bold]", HOSTILE_ERROR),
    ("Traceback", LONG_ERROR),
]
KEYED = [name for name in HOSTILE if name != "surrogate"]  # a key must be valid Unicode


@dataclass(frozen=True)
class Seeded:
    hostile_id: str  # a delivered message whose payload holds the whole corpus, key HOSTILE_KEY
    big_id: str  # a delivered message with a 10 MB payload
    dead_ids: list[str]  # one per FAILURES entry, in that order


class Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def declare() -> tuple[Any, Any]:
    engine.reset()
    orders = signal.once(SIGNAL, retries=0, description=DESCRIPTION)
    tape = signal.live(TAPE, retention={"max_count": 100}, optional=True)

    @on(orders)
    @flow(FLOW)
    async def handle(payload: Any, fx: Any) -> None:
        if "fail" in payload:
            code, message = FAILURES[payload["fail"]]
            raise Refused(code, message)

    return orders, tape


async def seed_hostile(url: str) -> Seeded:
    orders, tape = declare()
    payload = {k: v for k, v in HOSTILE.items() if k != "surrogate"}  # JSON cannot carry a lone surrogate
    async with oke(APP, database_url=url, worker_id=WORKER, max_payload_bytes=BIG_PAYLOAD_BYTES + 1024) as app:
        for name in KEYED:
            await app.emit(orders, {"corpus": HOSTILE[name]}, key=HOSTILE[name])
        big_id = await app.emit(orders, big_payload())
        dead_ids = [await app.emit(orders, {"fail": n, **payload}, key=HOSTILE_KEY) for n in range(len(FAILURES))]
        hostile_id = await app.emit(orders, payload, key=HOSTILE_KEY)
        for name in KEYED:
            await app.emit(tape, {"event": HOSTILE[name], "name": name})
        await app.drain()
    store = make_store(url)
    await store.open()
    try:
        await ops.pause(store, SIGNAL, actor=ACTOR, reason=HOSTILE_ERROR)
        await ops.resume(store, SIGNAL, actor=ACTOR, reason=HOSTILE["markup_bold"])
    finally:
        await store.close()
    return Seeded(str(hostile_id), str(big_id), [str(i) for i in dead_ids])


if __name__ == "__main__":
    print(asyncio.run(seed_hostile(sys.argv[1])))
