"""What-if patches for the engine server process (bench only; engine/ is not touched).

    python bench/sse/engine_server.py ... --experiment coalesce --experiment group-commit
    python bench/sse_bench.py --experiment coalesce --experiment coalesce,group-commit   # extra rows
                                                                   # (one per flag) beside the stock engine

The emitter process gets the same patches (group-commit matters there).

They test the changes the profile points at, so the report can say what each is worth:

coalesce      live_stream writes whatever is ready as ONE chunk: on the live path every batch already
              waiting in the subscription queue is drained and joined; on replay each 1,000-event page
              is one chunk, its frames built straight from the stored JSON (no json.loads per event
              when there is no filter). Stock code yields one frame per event, so each event costs a
              generator step, an ASGI send and a socket write() per subscriber. Filtered streams fall
              back to the stock function.
group-commit  app.emit on a live signal joins concurrent emits into one `live.append` transaction
              (one fsync, one hub wake-up, one batch for every subscriber) instead of one each.

The stock semantics kept: ids and order, gap fill from the store, resume after a hub drop, reset
detection, heartbeats, [DONE] on shutdown. This is a sketch for measurement, not engine code:
it mirrors engine/http/sse.py and engine/app.py as of b68ac30 and falls back to the stock stream for
arguments it does not know, so a changed engine shows up as a plain (unpatched) row, never a wrong one.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator


def apply(names: list[str]) -> None:
    for name in names:
        {"coalesce": _coalesce, "group-commit": _group_commit}[name]()


# ----------------------------------------------------------------------------- coalesce
def _coalesce() -> None:
    from engine.bus import hub as hub_mod
    from engine.bus import live
    from engine.http import server as srv
    from engine.http import sse

    stock = sse.live_stream
    DONE = hub_mod.DONE
    RESET = getattr(hub_mod, "RESET", object())
    known = {"heartbeat_s", "first_page", "page_head"}

    def frames_of(epoch: str, events: list) -> bytes:
        return b"".join(f"id: {epoch}.{e.seq}\ndata: {e.payload}\n\n".encode() for e in events)

    async def pages(store: Any, signal: str, epoch: str, after: int, until: int | None = None
                    ) -> AsyncIterator[tuple[int, bytes]]:
        """(last seq, joined frames) per page of stored events after `after` (through `until`)."""
        while True:
            events = await store.read(lambda c: live.read_after(c, signal, after, sse.REPLAY_BATCH))
            if until is not None:
                kept = [e for e in events if e.seq <= until]
            else:
                kept = events
            if kept:
                after = kept[-1].seq
                yield after, frames_of(epoch, kept)
            if len(events) < sse.REPLAY_BATCH or len(kept) < len(events):
                return

    async def live_stream(store: Any, hubs: Any, control: Any, signal: str, epoch: str, after_seq: int,
                          match: Any, **options: Any) -> AsyncIterator[bytes]:
        if match is not None or set(options) - known:  # filtered, or an engine newer than this sketch
            async for chunk in stock(store, hubs, control, signal, epoch, after_seq, match, **options):
                yield chunk
            return
        heartbeat_s = options.get("heartbeat_s", sse.HEARTBEAT_S)
        first_page = options.get("first_page")
        loop = asyncio.get_running_loop()
        hub = hubs.hub(signal)
        sub = hub.subscribe()
        control.subscriptions.add(sub)
        last = after_seq
        sent_at = loop.time()
        pending: Any = None
        try:
            await hub.ready.wait()
            replay_from: int | None = last
            if first_page is not None:  # read by the caller with the cursor check (stock semantics)
                if first_page:
                    last = first_page[-1].seq
                    sent_at = loop.time()
                    yield frames_of(epoch, first_page)
                if len(first_page) < sse.REPLAY_BATCH:
                    last = max(last, options.get("page_head", 0))
                    replay_from = last if (hub.last_seq or 0) > last else None
                else:
                    replay_from = last
            if replay_from is not None:
                async for last, chunk in pages(store, signal, epoch, replay_from):
                    sent_at = loop.time()
                    yield chunk
                    if control.closing:
                        break
            while not control.closing:
                if pending is not None:
                    batch, pending = pending, None
                else:
                    wait = sent_at + heartbeat_s - loop.time()
                    try:
                        if wait <= 0:
                            raise TimeoutError
                        async with asyncio.timeout(wait):
                            batch = await sub.queue.get()
                    except TimeoutError:
                        sent_at = loop.time()
                        yield b":\n\n"
                        continue
                if batch == DONE:
                    break
                if batch == RESET:
                    if hub.epoch != epoch:
                        break
                    continue
                if batch is None:
                    old_hub, old = hub, sub
                    hub = hubs.hub(signal)
                    sub = hub.subscribe()
                    control.subscriptions.add(sub)
                    control.subscriptions.discard(old)
                    old_hub.unsubscribe(old)
                    await hub.ready.wait()
                    async for last, chunk in pages(store, signal, epoch, last):
                        sent_at = loop.time()
                        yield chunk
                    continue
                batches = [batch]
                while not sub.queue.empty():  # everything already waiting goes out in this one write
                    more = sub.queue.get_nowait()
                    if isinstance(more, list):
                        batches.append(more)
                    else:
                        pending = more
                        break
                frames: list[bytes] = []
                reset = False
                for b in batches:
                    if not b[0].id.startswith(f"{epoch}."):
                        reset = True
                        break
                    if b[-1].seq <= last:
                        continue
                    if b[0].seq > last + 1:
                        if frames:
                            yield b"".join(frames)
                            frames = []
                        async for last, chunk in pages(store, signal, epoch, last, until=b[0].seq - 1):
                            yield chunk
                    for item in b:
                        if item.seq > last:
                            last = item.seq
                            frames.append(item.frame)
                if frames:
                    sent_at = loop.time()
                    yield b"".join(frames)
                if reset:
                    break
            yield sse.DONE_FRAME
        finally:
            control.subscriptions.discard(sub)
            hub.unsubscribe(sub)

    srv.live_stream = live_stream  # server.py calls the name it imported


# ----------------------------------------------------------------------------- group commit
def _group_commit() -> None:
    from engine.app import OkeApp
    from engine.bus import live

    async def _append_live(self: Any, signal: Any, encoded: str, parent_run_id: str | None,
                           *_rest: Any, **_kw: Any) -> str:
        # emit() has validated the payload and the exposure before calling this (engine at e3c0f2f);
        # the stock body is one `live.append(conn, signal, [encoded], ...)` per call, then a wake-up
        assert self.store is not None
        state = self.__dict__.setdefault("_bench_group", {})
        key = (signal.name, parent_run_id)
        entry = state.get(key)
        if entry is None:
            entry = state[key] = {"queue": [], "task": None, "signal": signal}
        future = asyncio.get_running_loop().create_future()
        entry["queue"].append((encoded, future))
        if entry["task"] is None:
            entry["task"] = asyncio.get_running_loop().create_task(_flush(self, key, entry))
        return await future

    async def _flush(app: Any, key: tuple, entry: dict) -> None:
        try:
            while entry["queue"]:
                taken, entry["queue"] = entry["queue"], []
                payloads = [p for p, _f in taken]
                try:
                    ids = await app.store.write(lambda c: live.append(c, entry["signal"], payloads, key[1]))
                except BaseException as err:
                    for _p, f in taken:
                        if not f.done():
                            f.set_exception(err)
                    raise
                if app._http is not None:
                    app._http.wake(key[0])
                for (_p, f), event_id in zip(taken, ids):
                    if not f.done():
                        f.set_result(event_id)
        finally:
            entry["task"] = None

    OkeApp._append_live = _append_live
