"""An emitter's copy of the bindings other processes recorded (engine/bindings_cache.py): re-read
in the background once half of BINDINGS_CACHE_S old, so a flow bound meanwhile gets its broadcast
copies before the copy would have run out, and no emit waits for that read."""
from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text

from engine import flow, oke, signal
from engine.bindings_cache import BINDINGS_CACHE_S
from engine.flows import Binding


async def _nothing(_payload: Any, _fx: Any) -> None:
    pass


async def _flows_of(store, round_: int) -> list[str]:
    rows = await store.read(
        lambda conn: conn.execute(
            text("SELECT flow FROM oke_messages WHERE signal = 'fan' AND payload = :p ORDER BY flow"),
            {"p": f'{{"round":{round_}}}'},
        ).all()
    )
    return [r[0] for r in rows]


async def test_a_flow_bound_elsewhere_gets_copies_once_the_background_read_has_seen_it(db_url):
    fan = signal.broadcast("fan")
    async with oke("workers-a", database_url=db_url, bindings=[Binding(fan, flow("fan.a", do=_nothing))]):
        pass  # records fan.a, as a worker deployment would
    async with oke("shop", database_url=db_url) as app:
        await app.emit(fan, {"round": 0})  # reads the bindings
        assert await _flows_of(app.store, 0) == ["fan.a"]

        async with oke("workers-b", database_url=db_url, bindings=[Binding(fan, flow("fan.b", do=_nothing))]):
            pass
        await asyncio.sleep(BINDINGS_CACHE_S * 0.6)
        await app.emit(fan, {"round": 1})  # from the copy (or read in line, on a slow machine)
        assert await _flows_of(app.store, 1) in (["fan.a"], ["fan.a", "fan.b"])
        await asyncio.sleep(BINDINGS_CACHE_S * 0.25)  # the background read it started is done
        await app.emit(fan, {"round": 2})  # still inside the copy's limit: the old copy knew no fan.b
        assert await _flows_of(app.store, 2) == ["fan.a", "fan.b"]
