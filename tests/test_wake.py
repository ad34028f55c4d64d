"""The waker an idle claim lane (and a live tape's hub) parks on: woken at once by `wake()`, from
the loop's thread or another, every wait in progress alike; otherwise it returns at its timeout.
A lane parks on its waker alone, so a stop must wake it: an idle worker returns from `run()` at
once after `app.stop()`, not at its next poll."""
from __future__ import annotations

import asyncio
import threading
import time

from engine import flow, oke, on, signal
from engine.store.wake import Waker


async def test_a_wait_ends_at_its_timeout_when_nobody_wakes_it():
    waker = Waker("test://timeout")
    try:
        started = time.monotonic()
        await waker.wait(0.2)
        assert 0.18 <= time.monotonic() - started < 1.0
    finally:
        waker.close()


async def test_a_wake_ends_every_wait_in_progress_at_once():
    waker = Waker("test://several")
    try:
        waits = [asyncio.create_task(waker.wait(30)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waits)
        started = time.monotonic()
        waker.wake()
        async with asyncio.timeout(1):
            await asyncio.gather(*waits)
        assert time.monotonic() - started < 0.5
        await waker.wait(30)  # still set: a wake-up before the next clear() is not lost
        waker.clear()
        assert not waker.event.is_set()
    finally:
        waker.close()


async def test_a_wake_from_another_thread_ends_the_wait():
    waker = Waker("test://thread")
    try:
        wait = asyncio.create_task(waker.wait(30))
        await asyncio.sleep(0.05)
        threading.Thread(target=waker.wake).start()
        async with asyncio.timeout(2):
            await wait
    finally:
        waker.close()


async def test_an_idle_worker_stops_at_once_not_at_its_next_poll(db_url, monkeypatch):
    import engine.worker.claiming as claiming

    monkeypatch.setattr(claiming, "IDLE_POLL_S", 60.0)  # the lane would park a minute without a wake-up
    jobs = signal.once("wake.idle")
    on(jobs, flow("w.idle", do=lambda payload, fx: None))
    async with oke("t", database_url=db_url) as app:
        runner = asyncio.create_task(app.run(concurrency=2))
        await app.emit(jobs, 1)  # handled: the lanes go idle after it
        async with asyncio.timeout(10):
            while int((await app.store.read(lambda c: c.exec_driver_sql(
                    "SELECT count(*) FROM oke_messages WHERE status = 'delivered'").scalar()))) < 1:
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # parked now
        started = time.monotonic()
        await app.stop()
        async with asyncio.timeout(10):
            await runner
        assert time.monotonic() - started < 2.0
