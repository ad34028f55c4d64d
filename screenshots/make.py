"""Regenerate the console screenshots (SVG) from the real app over a fresh demo store.

    python screenshots/make.py            # writes screenshots/*.svg (200×50) and screenshots/80x24/*.svg
    python screenshots/make.py clocks     # only clocks.svg (both sizes)
    python screenshots/make.py limited    # only overview-limited.svg (200×50)

It runs the bundled demo on a temporary SQLite store (workers, HTTP and traffic
with failures) and, while it runs, drives `ConsoleApp` with Pilot through every
screen and saves each with `App.save_screenshot`.
"""
from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from textual.css.query import NoMatches  # noqa: E402

from okconsole.app import ConsoleApp  # noqa: E402
from okconsole.demo import DemoRunner  # noqa: E402

SIZES = {(200, 50): HERE, (80, 24): HERE / "80x24"}  # a wide terminal and the smallest we promise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def settle(pilot, predicate, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            if predicate():
                break
        except (NoMatches, AttributeError):  # a checked jump lands a moment later
            pass
        await pilot.pause(0.1)
    await pilot.pause(0.3)


def marked(table, word: str) -> bool:
    """Whether any cell of the table shows `word`."""
    return any(word in str(cell) for i in range(table.row_count) for cell in table.get_row_at(i))


async def shoot(url: str, out: Path, size: tuple[int, int]) -> list[str]:
    saved: list[str] = []
    out.mkdir(exist_ok=True)
    app = ConsoleApp(url, refresh_s=0.5)

    def save(name: str) -> None:
        app.save_screenshot(f"{name}.svg", str(out))
        saved.append(name)

    async with app.run_test(size=size) as pilot:
        await settle(pilot, lambda: app.screen.query_one("#signals").row_count >= 4)
        # the dead letters' health mark follows the per-minute history the demo writes every 5 s
        await settle(pilot, lambda: marked(app.screen.query_one("#signals"), "dead+"), timeout=20.0)
        await pilot.pause(2.5)  # a few refreshes: rates and sparklines
        save("overview")
        app.jump("history tasks.email")
        await settle(pilot, lambda: "peak" in str(app.screen.query_one("#head-delivered").render()))
        await pilot.pause(1.0)
        save("history")
        app.jump("messages tasks.email")
        await settle(pilot, lambda: app.screen.query_one("#messages").row_count > 0)
        save("messages")
        await pilot.press("x")
        await pilot.pause(0.3)
        await pilot.press(*"wrong recipient list")
        await pilot.pause(0.2)
        save("cancel-confirm")
        await pilot.press("escape")
        await pilot.pause(0.2)
        app.jump("dlq tasks.email")
        await settle(pilot, lambda: app.screen.query_one("#letters").row_count > 0)
        await pilot.press("space")
        await pilot.pause(0.2)
        save("dead-letters")
        await pilot.press("R")
        await pilot.pause(0.3)
        await pilot.press(*"smtp relay fixed")
        await pilot.pause(0.2)
        save("replay-confirm")
        await pilot.press("escape")
        await pilot.press("enter")
        await settle(pilot, lambda: app.screen.detail is not None)
        save("message-detail")
        await pilot.press("t")
        await settle(pilot, lambda: app.screen.rendered is not None)
        save("trace")
        app.jump("keys tasks.email")
        await settle(pilot, lambda: app.screen.query_one("#keys").row_count > 0)
        save("keys")
        app.jump("tail order-status")
        await settle(pilot, lambda: app.screen.received >= 10)
        save("tail")
        app.jump("audit")
        await pilot.pause(0.5)
        save("audit")
        await pilot.press("question_mark")
        await pilot.pause(0.3)
        save("help")
    return saved


async def leave_an_orphaned_lease(url: str, tmp: str) -> float:
    """A real second worker takes a message and is SIGKILLed holding its lease; returns when it died."""
    ready = Path(tmp) / "dead-worker-ready"
    proc = subprocess.Popen([sys.executable, str(HERE / "dead_worker.py"), url, str(ready)])
    while not ready.exists():
        if proc.poll() is not None:
            raise SystemExit(f"dead_worker.py exited with {proc.returncode}")
        await asyncio.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    return time.monotonic()


async def shoot_workers(url: str, out: Path, size: tuple[int, int]) -> None:
    app = ConsoleApp(url, refresh_s=0.5)
    async with app.run_test(size=size) as pilot:
        await settle(pilot, lambda: app.screen.query_one("#signals").row_count >= 4)
        app.jump("workers")
        await settle(pilot, lambda: app.screen.query_one("#workers").row_count >= 2)
        await pilot.pause(1.0)
        app.save_screenshot("workers.svg", str(out))


async def tick_some_clocks(url: str) -> None:
    """An app with three clocks ticks for a few seconds: one fine, one failing, one paused."""
    from engine import clock, flow, oke, on, ops

    async def fails(tick, fx):
        raise RuntimeError("the report service answered 503")

    on(clock.every("2s"), flow("reports.heartbeat", do=lambda tick, fx: None))
    on(clock.every("3s"), flow("billing.reconcile", do=fails))
    on(clock.cron("0 * * * *", tz="Europe/Berlin"), flow("reports.hourly", do=lambda tick, fx: None))
    on(clock.cron("30 2 * * 1-5", tz="America/New_York", catch_up=True), flow("crm.sync", do=lambda t, fx: None))
    async with oke("clocks-demo", database_url=url, bindings=None) as app:
        running = asyncio.create_task(app.run())
        await asyncio.sleep(7)
        await app.stop()
        await running
        await ops.pause(app.store, "clock.reports.hourly", actor="ops", reason="report DB migration")


async def shoot_clocks(url: str, out: Path, size: tuple[int, int]) -> None:
    app = ConsoleApp(url, refresh_s=0.5)
    async with app.run_test(size=size) as pilot:
        await settle(pilot, lambda: app.screen.query_one("#signals").row_count >= 1)
        app.jump("clocks")
        await settle(pilot, lambda: app.screen.query_one("#clocks").row_count >= 4)
        await pilot.pause(1.0)
        app.save_screenshot("clocks.svg", str(out))


async def clocks_only() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{tmp}/oke.db"
        await tick_some_clocks(url)
        for size, out in SIZES.items():
            await shoot_clocks(url, out, size)
    print("wrote", ", ".join(f"{out.relative_to(HERE.parent)}/clocks.svg" for out in SIZES.values()))


async def shoot_limited(url: str, out: Path, size: tuple[int, int]) -> None:
    """The overview with tasks.email held at a rate limit an operator set with the real CLI; reset after."""
    okconsole = [sys.executable, "-m", "okconsole", "--db", url, "limit", "tasks.email", "--yes"]
    subprocess.run([*okconsole, "--rate", "2/1m", "--reason", "relay throttles us"], check=True, cwd=HERE.parent)
    app = ConsoleApp(url, refresh_s=0.5)
    try:
        async with app.run_test(size=size) as pilot:
            await settle(pilot, lambda: app.screen.query_one("#signals").row_count >= 4)
            await settle(pilot, lambda: marked(app.screen.query_one("#signals"), "rate 2/1m"), timeout=20.0)
            await pilot.pause(1.0)
            app.save_screenshot("overview-limited.svg", str(out))
    finally:
        subprocess.run([*okconsole, "--reset"], check=True, cwd=HERE.parent)


async def limited_only() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{tmp}/oke.db"
        demo = DemoRunner(url, port=free_port(), seed=7)
        await demo.start()
        try:
            await asyncio.sleep(6)
            await shoot_limited(url, HERE, (200, 50))
        finally:
            await demo.stop()
    print("wrote screenshots/overview-limited.svg")


async def main() -> None:
    if sys.argv[1:] == ["limited"]:
        await limited_only()
        return
    if sys.argv[1:] == ["clocks"]:
        await clocks_only()
        return
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{tmp}/oke.db"
        demo = DemoRunner(url, port=free_port(), seed=7)
        await demo.start()
        try:
            await asyncio.sleep(6)  # some history first, then shoot while traffic flows
            saved = []
            for size, out in SIZES.items():
                saved += [f"{out.relative_to(HERE.parent)}/{n}.svg" for n in await shoot(url, out, size)]
            killed = await leave_an_orphaned_lease(url, tmp)
            await asyncio.sleep(max(0.0, killed + 31 - time.monotonic()))  # not seen for 30 s: orphaned
            for size, out in SIZES.items():
                await shoot_workers(url, out, size)
                saved.append(f"{out.relative_to(HERE.parent)}/workers.svg")
            await shoot_limited(url, HERE, (200, 50))
            saved.append("screenshots/overview-limited.svg")
        finally:
            await demo.stop()
    print("wrote", ", ".join(saved))


if __name__ == "__main__":
    asyncio.run(main())
