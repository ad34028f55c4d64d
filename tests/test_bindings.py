"""Bindings across processes: two flows on a once signal in two processes, last_seen
and binding_ttl, `okconsole bindings` / `unbind`, and the store upgrade that brought them (schema 3).

Processes are real (tests/workers/bound_app.py), the console runs as the installed `okconsole`, and the
TUI is read off its rendered screen (tests/screenkit.py).
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine import flow, oke, ops, signal
from engine.flows import Binding
from engine.store import schema as schema_mod
from okconsole.app import ConsoleApp
from okconsole.screens.overview import OverviewScreen
from screenkit import screen_lines, screen_text
from consolekit import okconsole_cmd, run_in_pty, run_okconsole, wait_for, with_store
from workers.db import execute, fetch, scalar

TESTS = Path(__file__).resolve().parent
FIX_1071 = ("Use signal.broadcast if each flow should independently receive this event, or bind only one "
            "flow if these should compete for the same work.")


async def _noop(payload: Any, fx: Any) -> None:
    return None


def boot_process(url: str, signal_name: str, flow_name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TESTS / "workers" / "bound_app.py"), url, signal_name, flow_name],
                          capture_output=True, text=True, timeout=120)


async def copies_by_flow(url: str, signal_name: str) -> dict[str, list[str]]:
    """Status of each broadcast copy, per flow, in emit order (plain SQL, not the engine's reads)."""
    out: dict[str, list[str]] = {}
    for flow_name, status in await fetch(url, "SELECT flow, status FROM oke_messages WHERE signal = $1 "
                                              "ORDER BY seq", signal_name):
        out.setdefault(flow_name, []).append(status)
    return out


# ------------------------------------------------------------------ two processes, one once signal

async def test_once_signal_bound_to_two_flows_by_two_processes_is_warned_listed_and_marked(db_url):
    first = boot_process(db_url, "orders", "orders.charge")
    assert first.returncode == 0, first.stderr
    assert "OKE1071" not in first.stderr  # nobody else binds it yet

    second = boot_process(db_url, "orders", "orders.ship")
    assert second.returncode == 0 and second.stdout.strip() == "booted", second.stderr  # boot does not refuse
    warning = next(line for line in second.stderr.splitlines() if "OKE1071" in line)
    assert warning.startswith("WARNING engine.app: OKE1071: Once signal \"orders\" is bound to more than one Flow")
    assert '"orders.charge"' in warning and '"orders.ship"' in warning and FIX_1071 in warning

    stats = run_okconsole("--db", db_url, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    row = next(r for r in json.loads(stats.stdout) if r["signal"] == "orders")
    assert row["flows"] == ["orders.charge", "orders.ship"]

    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen)
                       and app.screen.query_one("#signals").row_count == 1)
        # the marker and the about line are painted by one refresh, but a screenshot can land between
        # the table's repaint and the line's: wait until both are on screen, then read them
        await wait_for(pilot, lambda: "split its messages" in screen_text(app) and "once ⚠" in screen_text(app))
        lines = screen_lines(app)
        [signal_row] = [line for line in lines if line.split()[:1] == ["orders"] and "once" in line]
        assert "once ⚠" in signal_row
        [about] = [line for line in lines if "split its messages" in line]
        assert "⚠ 2 flows split its messages: orders.charge, orders.ship (OKE1071)" in about

    # the other process was last seen more than 5 minutes ago: no warning, not listed
    await execute(db_url, "UPDATE oke_bindings SET last_seen = last_seen - 360000 WHERE flow = 'orders.charge'")
    third = boot_process(db_url, "orders", "orders.ship")
    assert third.returncode == 0 and "OKE1071" not in third.stderr, third.stderr
    rows = await with_store(db_url, ops.stats)
    assert next(r for r in rows if r.signal == "orders").flows == ["orders.ship"]


# ------------------------------------------------------------------ last_seen and binding_ttl

@pytest.mark.parametrize("bad, error", [(7, TypeError), (None, TypeError), ("7 days", ValueError),
                                        ("0d", ValueError), ("1h30m", ValueError), ("", ValueError)])
def test_binding_ttl_is_a_checked_duration(bad, error):
    with pytest.raises(error, match=r"oke\(binding_ttl=\.\.\.\)"):
        oke("t", binding_ttl=bad)
    assert oke("t", binding_ttl="12h").binding_ttl_ms == 12 * 3_600_000
    assert oke("t").binding_ttl_ms == 7 * 86_400_000


async def test_broadcast_copies_go_only_to_bindings_seen_within_their_ttl(db_url):
    news = signal.broadcast("news")
    removed = oke("old", database_url=db_url, binding_ttl="1s",
                  bindings=[Binding(news, flow("search.old", do=_noop))])
    async with removed:
        pass  # a deploy that still bound search.old, then went away
    async with oke("new", database_url=db_url, bindings=[Binding(news, flow("search.new", do=_noop))]) as app:
        await app.emit(news, {"n": 1})  # search.old was seen within its TTL: a consumer down for a deploy
        assert await copies_by_flow(db_url, "news") == {"search.old": ["pending"], "search.new": ["pending"]}
        await asyncio.sleep(2.6)  # past the TTL, and past the emitter's 2 s cache of the bindings
        await app.emit(news, {"n": 2})
        assert await copies_by_flow(db_url, "news") == {"search.old": ["pending"],
                                                        "search.new": ["pending", "pending"]}
        listed = {b.flow: b for b in await ops.bindings(app.store)}
    assert (listed["search.old"].active, listed["search.new"].active) == (False, True)
    assert listed["search.old"].kind == "broadcast" and listed["search.old"].last_seen < listed["search.new"].last_seen


async def test_a_running_app_refreshes_last_seen_and_a_retired_binding_stays_retired(db_url, monkeypatch):
    import engine.app

    monkeypatch.setattr(engine.app, "BINDING_HEARTBEAT_S", 0.1)
    news = signal.broadcast("news")
    bindings = [Binding(news, flow("search", do=_noop)), Binding(news, flow("mail", do=_noop))]
    async with oke("t", database_url=db_url, bindings=bindings) as app:
        seen = {b.flow: b.last_seen for b in await ops.bindings(app.store)}
        await ops.unbind(app.store, "news", "mail", actor="ops")
        runner = asyncio.create_task(app.run(concurrency=1))
        try:
            async with asyncio.timeout(10):
                while (await ops.binding(app.store, "news", "search")).last_seen <= seen["search"]:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            mail = await ops.binding(app.store, "news", "mail")
        finally:
            await app.stop()
            await runner
    assert mail.last_seen > seen["mail"] and not mail.active  # seen, but unbound: still no copies
    async with oke("t", database_url=db_url, bindings=bindings) as app:  # booting with it binds it again
        assert (await ops.binding(app.store, "news", "mail")).active


# ------------------------------------------------------------------ unbind

async def test_unbind_retires_a_flow_and_ends_its_pending_copies_dead_replayably(db_url):
    news = signal.broadcast("news", retries=0)
    bindings = [Binding(news, flow("search.old", do=_noop)), Binding(news, flow("mail", do=_noop))]
    async with oke("t", database_url=db_url, bindings=bindings) as app:
        for n in range(3):
            await app.emit(news, {"n": n})
        unbinding = asyncio.create_task(ops.unbind(app.store, "news", "search.old", actor="alice",
                                                   reason="flow removed"))
        await asyncio.sleep(0.3)
        await app.emit(news, {"n": 3})  # read the bindings before the unbind: its copy is ended too
        result = await unbinding
        assert (result.signal, result.flow, result.dead) == ("news", "search.old", 4)
        await app.emit(news, {"n": 4})  # after: no copy for search.old
        assert await copies_by_flow(db_url, "news") == {"search.old": ["dead"] * 4, "mail": ["pending"] * 5}

        detail = await ops.show(app.store, result.ids[0])
        assert detail.status == "dead" and detail.failures[-1].code == "Unbound"
        assert detail.failures[-1].message == 'flow "search.old" was unbound by alice: flow removed'
        [stats] = [r for r in await ops.stats(app.store) if r.signal == "news"]
        assert (stats.pending, stats.dead, stats.flows) == (5, 4, ["mail"])
        entries = await ops.audit(app.store, action="unbind")
        assert sum(e.count for e in entries) == 4 and {e.actor for e in entries} == {"alice"}
        assert sorted(i for e in entries for i in e.ids) == sorted(result.ids)
        assert all(e.reason == "flow search.old: flow removed" and e.signal == "news" for e in entries)

        replayed = await ops.replay(app.store, "news", result.ids[:1], actor="alice")
        assert replayed.ids == result.ids[:1] and (await ops.show(app.store, result.ids[0])).status == "pending"

        with pytest.raises(ops.UnknownFlow, match=r'no flow "nope" .* \(its flows: mail, search.old\)'):
            await ops.unbind(app.store, "news", "nope")
        with pytest.raises(ops.UnknownSignal, match=r"known signals: news"):
            await ops.unbind(app.store, "nope", "mail")


async def test_cli_bindings_and_unbind(db_url):
    news = signal.broadcast("news")
    bindings = [Binding(news, flow("search.old", do=_noop)), Binding(news, flow("mail", do=_noop))]
    async with oke("t", database_url=db_url, bindings=bindings) as app:
        await app.emit(news, {"n": 1})
        await app.emit(news, {"n": 2})

    listed = run_okconsole("--db", db_url, "bindings", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["signal"], r["kind"], r["flow"], r["active"]) for r in rows] == \
        [("news", "broadcast", "mail", True), ("news", "broadcast", "search.old", True)]
    assert all(set(r) == {"signal", "kind", "flow", "last_seen", "active"} and r["last_seen"] > 0 for r in rows)

    unknown_signal = run_okconsole("--db", db_url, "unbind", "nope", "mail", "--yes")
    assert unknown_signal.returncode == 2 and "known signals: news" in unknown_signal.stderr
    unknown_flow = run_okconsole("--db", db_url, "unbind", "news", "nope", "--yes")
    assert unknown_flow.returncode == 2 and "its flows: mail, search.old" in unknown_flow.stderr
    read_only = run_okconsole("--db", db_url, "--read-only", "unbind", "news", "search.old", "--yes")
    assert read_only.returncode == 2 and "--read-only" in read_only.stderr
    no_tty = run_okconsole("--db", db_url, "unbind", "news", "search.old")
    assert no_tty.returncode == 2 and "pass --yes" in no_tty.stderr
    assert await copies_by_flow(db_url, "news") == {"search.old": ["pending"] * 2, "mail": ["pending"] * 2}
    assert await scalar(db_url, "SELECT count(*) FROM oke_bindings WHERE retired_at IS NOT NULL") == 0

    done = run_okconsole("--db", db_url, "--actor", "alice", "unbind", "news", "search.old", "--yes",
                         "--reason", "flow removed", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["signal"], result["flow"], result["dead"], len(result["ids"])) == ("news", "search.old", 2, 2)
    assert await copies_by_flow(db_url, "news") == {"search.old": ["dead"] * 2, "mail": ["pending"] * 2}
    audit = json.loads(run_okconsole("--db", db_url, "audit", "--json").stdout)
    assert (audit[0]["action"], audit[0]["actor"], audit[0]["count"]) == ("unbind", "alice", 2)
    assert audit[0]["reason"] == "flow search.old: flow removed" and sorted(audit[0]["ids"]) == sorted(result["ids"])

    table = run_okconsole("--db", db_url, "bindings")
    assert table.returncode == 0
    [old] = [line for line in table.stdout.splitlines() if "search.old" in line]
    assert old.split()[-1] == "no" and "Active" in table.stdout


async def test_unbind_on_a_terminal_asks_first(sqlite_url, tmp_path):
    news = signal.broadcast("news")
    async with oke("t", database_url=sqlite_url, bindings=[Binding(news, flow("search.old", do=_noop))]) as app:
        await app.emit(news, {"n": 1})
    command = [*okconsole_cmd(), "--db", sqlite_url, "unbind", "news", "search.old"]
    code, out = run_in_pty(command, answer="n\n", cwd=tmp_path)
    assert 'Unbind flow "search.old" from news? It gets no new copies and its pending copies end dead.' in out
    assert code == 1 and "cancelled" in out
    assert await copies_by_flow(sqlite_url, "news") == {"search.old": ["pending"]}
    code, out = run_in_pty(command, answer="y\n", cwd=tmp_path, keys_when={"Reason (recorded": "flow removed\n"})
    assert code == 0 and "1 pending copy ended dead (code Unbound)" in out, out
    assert await copies_by_flow(sqlite_url, "news") == {"search.old": ["dead"]}


# ------------------------------------------------------------------ the store upgrade

def _downgrade_to_version_3(conn) -> None:
    """The layout version 3 had: no run_at / priority / dedupe / traceparent, no pauses table, the ready index
    on seq alone."""
    from sqlalchemy import text

    for index in ("oke_messages_ready", "oke_messages_dedupe", "oke_messages_scheduled"):
        conn.execute(text(f"DROP INDEX {index}"))
    conn.execute(text("CREATE INDEX oke_messages_ready ON oke_messages (seq) "
                      "WHERE status IN ('pending', 'inflight')"))
    for column in ("run_at", "priority", "dedupe", "traceparent"):
        conn.execute(text(f"ALTER TABLE oke_messages DROP COLUMN {column}"))
    conn.execute(text("DROP TABLE oke_pauses"))
    conn.execute(text("UPDATE oke_meta SET value = '3' WHERE key = 'schema_version'"))


def _downgrade_to_version_2(conn) -> None:
    """The layout version 2 had: no binding activity, no recorded JSON Schemas."""
    from sqlalchemy import text

    _downgrade_to_version_3(conn)
    for table, column in [("oke_bindings", "last_seen"), ("oke_bindings", "ttl_ms"),
                          ("oke_bindings", "retired_at"), ("oke_signals", "json_schema")]:
        conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))
    conn.execute(text("UPDATE oke_meta SET value = '2' WHERE key = 'schema_version'"))


async def test_a_version_2_store_is_upgraded_in_place(db_url):
    news = signal.broadcast("news")
    bindings = [Binding(news, flow("search", do=_noop))]
    async with oke("t", database_url=db_url, bindings=bindings) as app:
        first = await app.emit(news, {"n": 1})
        await app.store.write(_downgrade_to_version_2)
    recorded_at = await scalar(db_url, "SELECT updated_at FROM oke_bindings WHERE flow = 'search'")

    async with oke("console", database_url=db_url, bindings=[]) as app:  # binds nothing: only upgrades
        assert int(await scalar(db_url, "SELECT value FROM oke_meta WHERE key = 'schema_version'")) == \
            schema_mod.SCHEMA_VERSION == 11
        [old] = await ops.bindings(app.store)
        assert (old.flow, old.last_seen, old.active) == ("search", recorded_at, True)  # seen when recorded
        assert (await ops.show(app.store, first)).status == "pending"
        await app.emit(news, {"n": 2})  # an emitter of the upgraded store still finds the flow
    assert await copies_by_flow(db_url, "news") == {"search": ["pending", "pending"]}
    assert await scalar(db_url, "SELECT json_schema FROM oke_signals WHERE name = 'news'") == "{}"


async def test_a_version_3_store_is_upgraded_in_place_and_its_messages_stay_due(db_url):
    tasks = signal.once("tasks", retries=0)
    seen: list[int] = []

    async def handle(payload, fx):
        seen.append(payload["n"])

    bindings = [Binding(tasks, flow("work", do=handle))]
    async with oke("t", database_url=db_url, bindings=bindings):
        pass  # records the binding, so an emitter that binds nothing still stores the message
    async with oke("emitter", database_url=db_url, bindings=[]) as app:
        first = await app.emit(tasks, {"n": 1})
        await app.store.write(_downgrade_to_version_3)
    async with oke("t", database_url=db_url, bindings=bindings) as app:
        assert int(await scalar(db_url, "SELECT value FROM oke_meta WHERE key = 'schema_version'")) == 11
        assert await scalar(db_url, "SELECT count(*) FROM oke_pauses") == 0
        await app.drain()
        assert (await ops.show(app.store, first)).status == "delivered"
    assert seen == [1]
    assert await scalar(db_url, f"SELECT priority FROM oke_messages WHERE id = '{first}'") == 0
    assert await scalar(db_url, f"SELECT run_at FROM oke_messages WHERE id = '{first}'") is None
    assert await scalar(db_url, f"SELECT traceparent FROM oke_messages WHERE id = '{first}'") is None
    assert "priority" in await _index_sql(db_url, "oke_messages_ready")  # rebuilt for the claim's order
    assert "dedupe" in await _index_sql(db_url, "oke_messages_dedupe")
    assert "run_at" in await _index_sql(db_url, "oke_messages_scheduled")


async def _index_sql(url: str, name: str) -> str:
    if url.startswith("sqlite"):
        return str(await scalar(url, "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = $1", name))
    return str(await scalar(url, "SELECT indexdef FROM pg_indexes WHERE indexname = $1", name))
