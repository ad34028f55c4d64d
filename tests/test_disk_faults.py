"""A full disk and a read-only filesystem under the SQLite store, on a small tmpfs the test mounts.

Full: emits go on until the disk is full; each emit that cannot be stored raises StoreUnavailable
saying the disk is full, nothing already acknowledged is lost or corrupted (PRAGMA integrity_check,
every acknowledged id present), the running worker does not retry in a hot loop, and once space is
freed emits and deliveries resume in the same process.

Read-only: Linux refuses `mount -o remount,ro` while a store is open (SQLite holds its files open for
writing), so a running store cannot be remounted under it; a store whose filesystem is read-only
when it opens raises StoreUnavailable saying so, and the same process starts once it is remounted
read-write, with every message intact and delivered.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Iterator

import pytest

from rootkit import require_root, sh

PAD = "x" * 2000  # ~2 KB per message: the 4 MB disk fills after a few hundred


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB tmpfs mounted at tmp_path/disk, unmounted (lazily if need be) afterwards."""
    require_root("mount", "umount")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    sh("mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(mnt))
    try:
        yield mnt
    finally:
        if sh("umount", str(mnt), check=False).returncode != 0:
            sh("umount", "-l", str(mnt), check=False)


def integrity(path: Path, immutable: bool = False) -> tuple[str, set[str]]:
    """PRAGMA integrity_check and every stored message id, read with sqlite3 itself (`immutable` on
    a read-only filesystem, where SQLite cannot create the WAL index: the store was closed cleanly,
    so the WAL is folded in and gone)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro{'&immutable=1' if immutable else ''}", uri=True)
    try:
        verdict = conn.execute("PRAGMA integrity_check").fetchone()[0]
        ids = {row[0] for row in conn.execute("SELECT id FROM oke_messages")}
        return verdict, ids
    finally:
        conn.close()


def ballast(mnt: Path, size: int) -> Path:
    """A file taking `size` bytes of the disk: removing it is "freeing space"."""
    path = mnt / "ballast"
    with open(path, "wb") as f:
        f.write(b"\1" * size)
    return path


async def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(90)
async def test_full_disk_refuses_emits_keeps_data_backs_off_and_resumes(small_disk, caplog):
    from engine import flow, oke, on, signal
    from engine.errors import StoreUnavailable

    db = small_disk / "oke.db"
    seen: list[int] = []
    jobs = signal.once("disk.jobs")
    on(jobs, flow("disk.worker", do=lambda p, fx: seen.append(p["n"])))
    caplog.set_level(logging.WARNING, logger="engine")
    async with oke("disk", database_url=f"sqlite+aiosqlite:///{db}", lease_ms=2000) as app:
        runner = asyncio.create_task(app.run(concurrency=4))
        spare = ballast(small_disk, 1_000_000)
        acked: dict[str, int] = {}
        refusals: list[str] = []
        n = 0
        # emit until the disk is full
        while not refusals:
            assert n < 5000, "the disk never filled up"
            try:
                acked[await app.emit(jobs, {"n": n, "pad": PAD})] = n
            except StoreUnavailable as err:
                refusals.append(str(err))
            n += 1
        assert len(acked) >= 10, f"only {len(acked)} emits before the disk was full"
        # while full: every emit is refused with the reason, and the worker does not spin
        full_from = time.monotonic()
        claims_before = sum("claim failed" in r.getMessage() for r in caplog.records)
        while time.monotonic() - full_from < 3.0:
            with pytest.raises(StoreUnavailable) as raised:
                await app.emit(jobs, {"n": n, "pad": PAD})
            refusals.append(str(raised.value))
            await asyncio.sleep(0.1)
        claim_failures = sum("claim failed" in r.getMessage() for r in caplog.records) - claims_before
        full_s = time.monotonic() - full_from
        assert all("the disk is full" in r for r in refusals), refusals[:3]
        assert claim_failures <= 4 * full_s, f"{claim_failures} failed claims in {full_s:.1f} s: a hot loop"
        verdict, stored = integrity(db)
        assert verdict == "ok"
        assert set(acked) <= stored, f"{len(set(acked) - stored)} acknowledged messages are gone"

        # free space: the same process emits and delivers again
        spare.unlink()
        after = await app.emit(jobs, {"n": n, "pad": PAD})
        acked[after] = n
        await wait_for(lambda: set(acked.values()) <= set(seen), 30, "every acknowledged message delivered")
        await app.stop()
        await runner
    verdict, stored = integrity(db)
    assert verdict == "ok" and set(acked) <= stored
    print(f"\n{len(acked)} emits acknowledged, {len(refusals)} refused while full, "
          f"{claim_failures} failed claims in {full_s:.1f} s full")


@pytest.mark.timeout(60)
async def test_read_only_filesystem_is_named_and_the_store_resumes_after_remount_rw(small_disk):
    from engine import flow, oke, on, signal
    from engine.errors import StoreUnavailable

    db = small_disk / "oke.db"
    url = f"sqlite+aiosqlite:///{db}"
    seen: list[int] = []
    jobs = signal.once("ro.jobs")
    on(jobs, flow("ro.worker", do=lambda p, fx: seen.append(p["n"])))
    async with oke("ro", database_url=url) as app:
        acked = {await app.emit(jobs, {"n": n}): n for n in range(100)}
        busy = sh("mount", "-o", "remount,ro", str(small_disk), check=False)
        assert busy.returncode != 0, "the kernel remounted read-only under an open store"
        acked[await app.emit(jobs, {"n": 100})] = 100  # still writable
    sh("mount", "-o", "remount,ro", str(small_disk))

    app = oke("ro", database_url=url, lease_ms=2000)
    with pytest.raises(StoreUnavailable) as raised:
        await app.start()
    await app.close()
    assert "read-only" in str(raised.value) and str(db) in str(raised.value), str(raised.value)
    verdict, stored = integrity(db, immutable=True)
    assert verdict == "ok" and set(acked) <= stored

    sh("mount", "-o", "remount,rw", str(small_disk))
    async with oke("ro", database_url=url, lease_ms=2000) as app:
        runner = asyncio.create_task(app.run(concurrency=4))
        await wait_for(lambda: set(acked.values()) <= set(seen), 30, "every message delivered")
        await app.stop()
        await runner
    verdict, stored = integrity(db)
    assert verdict == "ok" and set(acked) <= stored
