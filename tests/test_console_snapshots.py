"""SVG snapshots of the console screens whose content is deterministic (pytest-textual-snapshot).

Screens over live data (ids, ages, rates) change on every run; their behaviour is
asserted in test_console_tui.py and their pictures live in screenshots/.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from console_workers.shop import populate
from okconsole.app import ConsoleApp

SIZE = (120, 32)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A store at a relative path, so the status line reads the same on every machine."""
    monkeypatch.chdir(tmp_path)
    return "sqlite+aiosqlite:///oke.db"


async def _settle(pilot) -> None:
    for _ in range(40):
        await pilot.pause(0.05)
        if getattr(pilot.app, "store_ok", None) is not None:
            break
    await pilot.pause(0.2)


def test_empty_store_overview(snap_compare, in_tmp):
    assert snap_compare(ConsoleApp(in_tmp, refresh_s=60), terminal_size=SIZE, run_before=_settle)


def test_help_screen(snap_compare, in_tmp):
    async def open_help(pilot) -> None:
        await _settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.2)

    assert snap_compare(ConsoleApp(in_tmp, refresh_s=60), terminal_size=SIZE, run_before=open_help)


def test_overview_with_counts(snap_compare, in_tmp):
    asyncio.run(populate(in_tmp))

    async def settle_rows(pilot) -> None:
        await _settle(pilot)
        for _ in range(40):
            if pilot.app.screen.query_one("#signals").row_count == 3:
                break
            await pilot.pause(0.05)

    assert snap_compare(ConsoleApp(in_tmp, refresh_s=60), terminal_size=SIZE, run_before=settle_rows)
