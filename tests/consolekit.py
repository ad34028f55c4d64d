"""Helpers the console's tests share: the real `okconsole` in a subprocess or a pseudo-terminal,
waiting on a Pilot-driven app or a listening port, and one visit to a store."""
from __future__ import annotations

import asyncio
import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from textual.css.query import NoMatches

from engine.store import make_store
from screenkit import screen_text

SIZE = (160, 48)  # the terminal the TUI tests run the app in


def okconsole_cmd() -> list[str]:
    """The installed `okconsole` script, else `python -m okconsole`."""
    found = shutil.which("okconsole")
    return [found] if found else [sys.executable, "-m", "okconsole"]


def run_okconsole(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
                  timeout: float = 60) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([*okconsole_cmd(), *args], capture_output=True, text=True, cwd=cwd, env=full_env,
                          timeout=timeout)


def run_in_pty(args: list[str], answer: str | None = None, env: dict[str, str] | None = None,
               cwd: Path | None = None, timeout: float = 60,
               keys_when: dict[str, str] | None = None) -> tuple[int, str]:
    """Run with stdin/stdout/stderr on a pseudo-terminal; type `answer` when a [y/N] prompt shows
    (and, for each `keys_when` marker, its keys once the marker shows)."""
    pending = {"[y/N]": answer} if answer is not None else {}
    pending.update(keys_when or {})
    master, slave = pty.openpty()
    full_env = {**os.environ, "COLUMNS": "200", "TERM": "xterm-256color", **(env or {})}
    for name, value in list(full_env.items()):
        if value is None:
            del full_env[name]
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=full_env, cwd=cwd,
                            close_fds=True)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
                for marker in [m for m in pending if m.encode() in out]:
                    os.write(master, pending.pop(marker).encode())
            elif proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"timed out; output so far: {out!r}")
        proc.wait(timeout=10)
    finally:
        os.close(master)
    return proc.returncode, out.decode(errors="replace")


async def wait_for(pilot, predicate, timeout: float = 20.0) -> None:
    """Let the app run until `predicate()` holds (loads are asynchronous). The default timeout is
    a loaded machine's: three test processes on 2 cores, one of them beside the soak or chaos."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not _holds(predicate):
        if loop.time() > deadline:
            screen = type(pilot.app.screen).__name__
            raise AssertionError(f"condition not reached in time; the screen ({screen}):\n{screen_text(pilot.app)}"
                                 f"\n{_tables_state(pilot.app)}")
        await pilot.pause(0.05)


def _tables_state(app: Any) -> str:
    """What each DataTable on screen still owes: DataTable measures new rows (column widths) only on
    an Idle event of its own, so a table whose columns stay at their headers' widths shows here
    whether its message pump runs, what waits in its queue and what it has not measured yet. (It
    showed widths measured while the screen kept its header widths: Textual issue 4470, which
    okconsole.widgets.tui_tables.Table works around.)"""
    from textual.widgets import DataTable

    lines = []
    for table in app.screen.query(DataTable):
        lines.append(
            f"DataTable#{table.id}: running={table.is_running} queued={table._message_queue.qsize()} "
            f"dimensions_due={table._require_update_dimensions} unmeasured_rows={len(table._new_rows)} "
            f"widths={[c.content_width for c in table.ordered_columns]}"
        )
    return "\n".join(lines)


def _holds(predicate) -> bool:
    try:
        return bool(predicate())
    except NoMatches:  # the screen is still composing
        return False


def wait_port(port: int, timeout: float = 20) -> None:
    """Until an okengine server answers on 127.0.0.1:`port`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/_oke/exposures", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listened on {port}")


async def with_store(url: str, fn: Any) -> Any:
    """`await fn(store)` on the store at `url`, opened for the call and closed after."""
    store = make_store(url)
    await store.open()
    try:
        return await fn(store)
    finally:
        await store.close()
