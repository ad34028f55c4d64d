"""The audit's `source`: where a write came from (`okconsole web` records the browser's address).

Every operator write in engine.ops carries it into its audit row, on SQLite and PostgreSQL; a
store of schema version 5 gains the column at boot, its older rows reading as not recorded.
"""

from __future__ import annotations

import json

from consolekit import run_okconsole
from engine import flow, oke, on, ops, signal
from engine.store import schema as schema_mod
from workers.db import execute, scalar

SOURCE = "web 192.0.2.7:51234"


def _failing(_payload, _fx):
    raise RuntimeError("smtp down")


async def test_every_operator_write_records_its_source(db_url):
    email = signal.once("t.email", retries=0)
    on(email, flow("w.email", do=_failing))
    async with oke("shop", database_url=db_url) as app:
        dead = [await app.emit(email, {"n": n}) for n in range(3)]
        await app.drain()
        later = await app.emit(email, {"n": 9}, delay="1h")
    store = await ops.open_store(db_url)
    who = {"actor": "ann", "reason": "web", "source": SOURCE}
    try:
        await ops.pause(store, "t.email", **who)
        await ops.resume(store, "t.email", **who)
        await ops.replay(store, "t.email", [dead[0]], **who)
        await ops.cancel(store, "t.email", [dead[0]], **who)
        await ops.delete(store, "t.email", [dead[1]], **who)
        await ops.retry(store, "t.email", [later], **who)
        await ops.purge(store, "t.email", "dead", **who)
        await ops.unbind(store, "t.email", "w.email", **who)
        entries = await ops.audit(store)
    finally:
        await store.close()
    assert [e.action for e in reversed(entries)] == [
        "pause",
        "resume",
        "replay",
        "cancel",
        "delete",
        "retry",
        "purge",
        "unbind",
    ]
    assert {(e.actor, e.source) for e in entries} == {("ann", SOURCE)}
    listed = json.loads(run_okconsole("--db", db_url, "audit", "--json").stdout)
    assert {e["source"] for e in listed} == {SOURCE}


async def test_a_version_5_store_gains_the_audit_source_and_keeps_its_rows(db_url):
    email = signal.once("t.email", optional=True)
    async with oke("shop", database_url=db_url) as app:
        await app.emit(email, {"n": 1})
    store = await ops.open_store(db_url)
    try:
        await ops.pause(store, "t.email", actor="old", reason="before the upgrade")
    finally:
        await store.close()
    await execute(db_url, "ALTER TABLE oke_audit DROP COLUMN source")  # the layout version 5 had
    await execute(db_url, "UPDATE oke_meta SET value = '5' WHERE key = 'schema_version'")

    store = await ops.open_store(db_url)  # upgrades in place
    try:
        assert (
            int(await scalar(db_url, "SELECT value FROM oke_meta WHERE key = 'schema_version'"))
            == schema_mod.SCHEMA_VERSION
            == 11
        )
        [old] = await ops.audit(store)
        assert (old.actor, old.reason, old.source) == ("old", "before the upgrade", None)
        await ops.resume(store, "t.email", actor="ann", reason="after", source=SOURCE)
        assert [e.source for e in await ops.audit(store)] == [SOURCE, None]
    finally:
        await store.close()


async def test_cli_writes_have_no_source_and_the_table_shows_the_column(sqlite_url):
    email = signal.once("t.email", optional=True)
    async with oke("shop", database_url=sqlite_url) as app:
        await app.emit(email, {"n": 1})
    done = run_okconsole("--db", sqlite_url, "pause", "t.email", "--yes", "--reason", "by hand")
    assert done.returncode == 0, done.stderr
    [entry] = json.loads(run_okconsole("--db", sqlite_url, "audit", "--json").stdout)
    assert entry["source"] is None and entry["action"] == "pause"
    table = run_okconsole("--db", sqlite_url, "audit").stdout.splitlines()
    assert table[0].split()[:3] == ["At", "Actor", "Source"]
    assert table[1].split()[3:5] == ["-", "pause"]  # after the date, time and actor: no source


async def test_the_tui_audit_log_shows_where_each_write_came_from(sqlite_url):
    from consolekit import SIZE
    from screenkit import screen_text

    from okconsole.app import ConsoleApp

    email = signal.once("t.email", optional=True)
    async with oke("shop", database_url=sqlite_url):
        pass
    store = await ops.open_store(sqlite_url)
    try:
        await ops.pause(store, email.name, actor="ann", reason="from the browser", source=SOURCE)
        await ops.resume(store, email.name, actor="bob", reason="from the CLI")
    finally:
        await store.close()
    app = ConsoleApp(database_url=sqlite_url)
    async with app.run_test(size=SIZE) as pilot:
        app.open_audit()
        for _ in range(50):
            await pilot.pause(0.1)
            if SOURCE in screen_text(app):
                break
        screen = screen_text(app)
    assert "Source" in screen
    paused = next(line for line in screen.splitlines() if "pause " in line and "ann" in line)
    resumed = next(line for line in screen.splitlines() if "resume" in line and "bob" in line)
    assert SOURCE in paused and SOURCE not in resumed and "—" in resumed
