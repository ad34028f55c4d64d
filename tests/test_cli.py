"""okconsole's scripted commands: JSON fields, exit codes, confirmation, one-line errors.

The stores are filled by the real engine; the console runs through Typer's CliRunner,
and as the installed `okconsole` in subprocesses (and in a pseudo-terminal where a
TTY matters: confirmation prompts, colour).
"""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from engine import flow, oke, on, signal
from engine.store import make_store
from okconsole.cli import app
from burstkit import emit_many
from test_ops import Boom
from consolekit import okconsole_cmd, run_in_pty, run_okconsole

runner = CliRunner()
DEAD_LETTER_FIELDS = {"id", "signal", "key", "payload", "attempts", "failures", "created_at", "parent_run_id",
                      "status"}
MESSAGE_FIELDS = {"id", "status", "key", "attempts", "locked_by", "lease_expires_at", "created_at",
                  "parent_run_id", "run_at", "priority", "dedupe"}
UNREACHABLE = "postgresql+asyncpg://postgres@127.0.0.1:1/nope"


def cli(*args: str, env: dict[str, str] | None = None, input: str | None = None):
    return runner.invoke(app, list(args), env=env, input=input, catch_exceptions=False)


def as_json(result) -> Any:
    assert result.exit_code == 0, f"exit {result.exit_code}: {result.stderr}"
    return json.loads(result.stdout)


class Shop:
    """A small app: emails fail while `broken` for addresses starting with "bad"; a "notify" job emits a child."""

    def __init__(self) -> None:
        self.broken = True
        self.calls: list[tuple[str, int]] = []
        self.runs: dict[str, str] = {}
        self.email = signal.once("shop.email", retries=1)
        self.audit_sig = signal.once("shop.audit", retries=0)
        signal.once("shop.idle", optional=True, description="Reserved for nightly jobs")
        on(self.email, flow("w.email", do=self._email))
        on(self.audit_sig, flow("w.audit", do=self._audit))

    async def _email(self, payload, fx) -> None:
        self.calls.append((payload["to"], fx.attempt))
        if payload.get("notify"):
            self.runs["notify"] = fx.run_id
            await fx.emit(self.audit_sig, {"about": payload["to"]})
        if self.broken and payload["to"].startswith("bad"):
            raise Boom(f"smtp refused {payload['to']}")

    async def _audit(self, payload, fx) -> None:
        self.runs["audit"] = fx.run_id

    def populate(self, url: str) -> dict[str, str]:
        async def go() -> dict[str, str]:
            async with oke("shop", database_url=url) as app:
                ids = {"good": await app.emit(self.email, {"to": "good@x.co"}, key="u1"),
                       "bad1": await app.emit(self.email, {"to": "bad1@x.co"}, key="u1"),
                       "bad2": await app.emit(self.email, {"to": "bad2@x.co"}, key="u2"),
                       "notify": await app.emit(self.email, {"to": "n@x.co", "notify": True})}
                await app.drain()
                return ids
        return asyncio.run(go())

    def drain(self, url: str) -> None:
        async def go() -> None:
            async with oke("shop", database_url=url) as app:
                await app.drain()
        asyncio.run(go())


@pytest.fixture
def shop() -> Shop:
    return Shop()


def store_sql(url: str, statement: str, **params: Any) -> list[tuple]:
    async def go():
        store = make_store(url)
        await store.open()
        try:
            return await store.read(lambda conn: [tuple(r) for r in conn.execute(text(statement), params)])
        finally:
            await store.close()
    return asyncio.run(go())


def store_exec(url: str, *statements: str) -> None:
    async def go():
        store = make_store(url)
        await store.open()
        try:
            def run(conn):
                for s in statements:
                    conn.execute(text(s))
            await store.write(run)
        finally:
            await store.close()
    asyncio.run(go())


def dead_count(url: str, signal_name: str = "shop.email") -> int:
    rows = as_json(cli("--db", url, "stats", "--json"))
    return next(r["dead"] for r in rows if r["signal"] == signal_name)


# ----------------------------------------------------------------------------------------- reads

def test_stats_json_and_table(db_url, shop):
    shop.populate(db_url)
    rows = as_json(cli("--db", db_url, "stats", "--json"))
    assert isinstance(rows, list)
    got = {r["signal"]: r for r in rows}
    assert set(got) == {"shop.email", "shop.audit", "shop.idle"}
    for r in rows:
        assert set(r) == {"signal", "kind", "description", "pending", "inflight", "delivered", "dead", "lag_ms",
                          "flows", "paused", "scheduled", "kept", "head", "events_per_s", "health",
                          "concurrency", "rate", "running", "held_by"}
    assert {k: got["shop.email"][k] for k in ("kind", "pending", "inflight", "delivered", "dead", "lag_ms")} == \
        {"kind": "once", "pending": 0, "inflight": 0, "delivered": 2, "dead": 2, "lag_ms": None}
    assert got["shop.idle"]["delivered"] == 0 and got["shop.audit"]["delivered"] == 1
    assert (got["shop.email"]["flows"], got["shop.idle"]["flows"]) == (["w.email"], [])
    assert (got["shop.email"]["description"], got["shop.idle"]["description"]) == \
        ("shop.email", "Reserved for nightly jobs")
    assert as_json(cli("stats", "--db", db_url, "--json")) == rows  # --db after the command works too

    human = cli("--db", db_url, "stats")
    assert human.exit_code == 0 and human.stderr == ""
    assert "shop.email" in human.stdout and "shop.idle" in human.stdout and "Dead" in human.stdout
    idle_line = next(line for line in human.stdout.splitlines() if line.startswith("shop.idle"))
    assert "Reserved for nightly jobs" in idle_line and "Description" in human.stdout
    assert "\x1b[" not in human.stdout  # not a terminal: no colour


def test_messages_json_filters_and_errors(db_url, shop):
    ids = shop.populate(db_url)
    rows = as_json(cli("--db", db_url, "messages", "shop.email", "--json"))
    assert [r["id"] for r in rows] == [ids["notify"], ids["bad2"], ids["bad1"], ids["good"]]
    assert all(set(r) == MESSAGE_FIELDS for r in rows)
    dead = as_json(cli("--db", db_url, "messages", "shop.email", "--status", "dead", "--json"))
    assert [(r["id"], r["status"], r["attempts"]) for r in dead] == [(ids["bad2"], "dead", 2),
                                                                     (ids["bad1"], "dead", 2)]
    keyed = as_json(cli("--db", db_url, "messages", "shop.email", "--key", "u1", "--limit", "1", "--json"))
    assert [r["id"] for r in keyed] == [ids["bad1"]]

    bad_status = cli("--db", db_url, "messages", "shop.email", "--status", "failed")
    assert bad_status.exit_code == 2 and "pending, inflight, delivered, dead" in bad_status.stderr
    unknown = cli("--db", db_url, "messages", "shop.nope", "--json")
    assert unknown.exit_code == 2 and unknown.stdout == ""
    assert "shop.nope" in unknown.stderr
    assert "shop.audit, shop.email, shop.idle" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
    assert cli("--db", db_url, "messages", "shop.email", "--limit", "0").exit_code == 2


def test_show_json_has_payload_failures_lease_blocker_and_trace(db_url, shop):
    ids = shop.populate(db_url)
    data = as_json(cli("--db", db_url, "show", ids["bad1"], "--json"))
    assert data["id"] == ids["bad1"] and data["status"] == "dead" and data["payload"] == {"to": "bad1@x.co"}
    assert [(f["code"], f["attempt"]) for f in data["failures"]] == [("E_BOOM", 1), ("E_BOOM", 2)]
    assert all(set(f) == {"code", "message", "at", "attempt", "traceback"} and isinstance(f["at"], int)
               for f in data["failures"])
    assert data["lease"] == {"locked_by": None, "lease_expires_at": None, "reclaimable": False,
                            "orphaned": False}
    assert data["blocked_by"] is None
    assert [r["attempt"] for r in data["runs"]] == [1, 2]
    assert [t["message_id"] for t in data["trace"]] == [ids["bad1"], ids["bad1"]]

    child = as_json(cli("--db", db_url, "messages", "shop.audit", "--json"))[0]
    shown = as_json(cli("--db", db_url, "show", child["id"], "--json"))
    assert shown["parent_run_id"] == shop.runs["notify"]
    assert shown["trace"][0]["run_id"] == shop.runs["notify"]
    assert shown["trace"][0]["children"][0]["run_id"] == shop.runs["audit"]

    human = cli("--db", db_url, "show", ids["bad1"])
    assert human.exit_code == 0
    assert "bad1@x.co" in human.stdout and "E_BOOM" in human.stdout and "w.email" in human.stdout

    missing = cli("--db", db_url, "show", "msg_missing", "--json")
    assert missing.exit_code == 2 and missing.stdout == ""
    assert "not a message id: msg_missing" in missing.stderr and "shop.email" not in missing.stderr


def test_dlq_and_failures_json(db_url, shop):
    ids = shop.populate(db_url)
    letters = as_json(cli("--db", db_url, "dlq", "shop.email", "--json"))
    assert [d["id"] for d in letters] == [ids["bad2"], ids["bad1"]]
    for d in letters:
        assert set(d) == DEAD_LETTER_FIELDS
        assert d["status"] == "dead" and d["signal"] == "shop.email" and d["attempts"] == 2
        assert [set(f) for f in d["failures"]] == [{"code", "message", "at", "attempt", "traceback"}] * 2
    assert letters[0]["payload"] == {"to": "bad2@x.co"} and letters[0]["key"] == "u2"
    assert as_json(cli("--db", db_url, "dlq", "shop.audit", "--json")) == []
    assert [d["id"] for d in as_json(cli("--db", db_url, "dlq", "shop.email", "--limit", "1", "--json"))] == \
        [ids["bad2"]]
    table = cli("--db", db_url, "dlq", "shop.email")
    assert table.exit_code == 0 and ids["bad1"] in table.stdout and "smtp refused bad1@x.co" in table.stdout
    assert "more dead letters" not in table.stdout
    assert "more dead letters" in cli("--db", db_url, "dlq", "shop.email", "--limit", "1").stdout
    assert cli("--db", db_url, "dlq", "shop.nope").exit_code == 2

    groups = as_json(cli("--db", db_url, "failures", "shop.email", "--json"))
    assert sorted((g["code"], g["message"], g["count"]) for g in groups) == [
        ("E_BOOM", "smtp refused bad1@x.co", 1), ("E_BOOM", "smtp refused bad2@x.co", 1)]
    assert all(set(g) == {"code", "message", "count", "last_at"} for g in groups)
    assert groups[0]["last_at"] >= groups[1]["last_at"]
    human = cli("--db", db_url, "failures", "shop.email")
    assert human.exit_code == 0 and "smtp refused bad2@x.co" in human.stdout
    assert cli("--db", db_url, "failures", "shop.nope").exit_code == 2


def test_trace_json_over_a_chain_of_emits(db_url, shop):
    shop.populate(db_url)
    for start in (shop.runs["audit"], shop.runs["notify"]):
        root = as_json(cli("--db", db_url, "trace", start, "--json"))
        assert root["run_id"] == shop.runs["notify"] and root["flow"] == "w.email"
        assert root["status"] == "succeeded" and root["parent_run_id"] is None
        assert isinstance(root["started_at"], int) and isinstance(root["ended_at"], int)
        assert [m["signal"] for m in root["messages"]] == ["shop.audit"]
        [child] = root["children"]
        assert (child["run_id"], child["flow"], child["parent_run_id"]) == \
            (shop.runs["audit"], "w.audit", shop.runs["notify"])
    human = cli("--db", db_url, "trace", shop.runs["audit"])
    assert human.exit_code == 0 and "w.email" in human.stdout and "w.audit" in human.stdout
    unknown = cli("--db", db_url, "trace", "run_nope")
    assert unknown.exit_code == 2 and "run_nope" in unknown.stderr


# ---------------------------------------------------------------------------------------- replay

def test_replay_refuses_without_yes_off_a_terminal_and_under_read_only(db_url, shop):
    ids = shop.populate(db_url)
    refused = cli("--db", db_url, "replay", "shop.email", "--all")
    assert refused.exit_code == 2 and "--yes" in refused.stderr and refused.stdout == ""
    refused_one = cli("--db", db_url, "replay", "shop.email", ids["bad1"], "--json")
    assert refused_one.exit_code == 2
    read_only = cli("--db", db_url, "--read-only", "replay", "shop.email", "--all", "--yes")
    assert read_only.exit_code == 2 and "read-only" in read_only.stderr
    assert dead_count(db_url) == 2
    assert as_json(cli("--db", db_url, "audit", "--json")) == []

    dry = as_json(cli("--db", db_url, "--read-only", "replay", "shop.email", "--all", "--dry-run", "--json"))
    assert dry == {"replayed": 0, "would_replay": 2, "ids": [ids["bad1"], ids["bad2"]]}
    assert dead_count(db_url) == 2


def test_stats_of_a_live_signal_shows_its_tape_not_zeros(db_url):
    """30 events in the last minute: kept 30, the newest id, 0.5 events/s (over the minute); the
    table says so too, and shows no queue counts for it (a tape has none)."""
    ticks = signal.live("t.ticks", retention={"max_count": 1000}, optional=True)

    async def emit() -> None:
        async with oke("t", database_url=db_url, bindings=[]) as engine_app:
            for n in range(30):
                await engine_app.emit(ticks, {"n": n})

    asyncio.run(emit())
    [row] = [r for r in as_json(cli("--db", db_url, "stats", "--json")) if r["signal"] == "t.ticks"]
    assert (row["kind"], row["kept"], row["events_per_s"]) == ("live", 30, 0.5), row
    assert re.fullmatch(r"[^.]+\.30", row["head"]), row["head"]
    table = cli("--db", db_url, "stats", env={"COLUMNS": "200"})
    lines = table.stdout.splitlines()
    header = lines[0].split()
    assert {"Kept", "Ev/s", "Head"} <= set(header), header
    [line] = [one.split() for one in lines if one.startswith("t.ticks ")]
    shown = dict(zip(header, line, strict=True))
    assert (shown["Kept"], shown["Ev/s"], shown["Head"], shown["Pending"]) == ("30", "0.5", row["head"], "—"), shown


def test_replay_then_a_worker_delivers_with_attempts_from_zero(db_url, shop):
    ids = shop.populate(db_url)
    out = as_json(cli("--db", db_url, "--actor", "ops-bot", "replay", "shop.email", ids["bad1"], "--yes",
                      "--reason", "smtp fixed", "--json"))
    assert out == {"replayed": 1, "ids": [ids["bad1"]]}
    again = cli("--db", db_url, "replay", "shop.email", ids["bad1"], "--yes", "--json")  # not dead
    assert again.exit_code == 2 and again.stdout == ""
    assert f"{ids['bad1']} is pending, not dead" in again.stderr

    shown = as_json(cli("--db", db_url, "show", ids["bad1"], "--json"))
    assert (shown["status"], shown["attempts"], shown["replays"]) == ("pending", 0, 1)
    assert [f["code"] for f in shown["failures"]] == ["E_BOOM", "E_BOOM", "replayed"]
    [entry] = as_json(cli("--db", db_url, "audit", "--json"))
    assert set(entry) == {"at", "actor", "action", "signal", "count", "ids", "reason", "source"}
    assert entry["source"] is None  # not made from a browser
    assert (entry["actor"], entry["action"], entry["signal"], entry["count"], entry["ids"], entry["reason"]) == \
        ("ops-bot", "replay", "shop.email", 1, [ids["bad1"]], "smtp fixed")

    shop.broken = False
    shop.calls.clear()
    shop.drain(db_url)
    assert shop.calls == [("bad1@x.co", 1)]
    done = as_json(cli("--db", db_url, "show", ids["bad1"], "--json"))
    assert (done["status"], done["attempts"]) == ("delivered", 1)
    assert [f["code"] for f in done["failures"]] == ["E_BOOM", "E_BOOM", "replayed"]

    # the rest, with --all, per-command --actor and a human summary
    human = cli("--db", db_url, "replay", "shop.email", "--all", "--yes", "--actor", "carol")
    assert human.exit_code == 0 and "Replayed 1" in human.stdout and ids["bad2"] in human.stdout
    assert as_json(cli("--db", db_url, "audit", "--json", "--limit", "1"))[0]["actor"] == "carol"
    assert dead_count(db_url) == 0


def test_replay_filters_and_usage_errors(sqlite_url, shop, tmp_path):
    ids = shop.populate(sqlite_url)
    db = ("--db", sqlite_url)

    def usage(*args: str) -> str:
        result = cli(*db, "replay", *args)
        assert result.exit_code == 2, (args, result.stdout, result.stderr)
        assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
        return result.stderr

    assert "--all" in usage("shop.email", "--yes")
    assert "not both" in usage("shop.email", ids["bad1"], "--all", "--yes")
    assert "duration" in usage("shop.email", "--all", "--older-than", "7 days", "--yes")
    assert "duration" in usage("shop.email", "--all", "--older-than", "1h30m", "--yes")
    assert "rate" in usage("shop.email", "--all", "--rate", "fast", "--yes")
    assert "rate" in usage("shop.email", "--all", "--rate", "0/s", "--yes")
    assert "exactly one" in usage("shop.email", "--all", "--payload", str(tmp_path / "p.json"), "--yes")
    (tmp_path / "bad.json").write_text("{not json")
    assert "not JSON" in usage("shop.email", ids["bad1"], "--payload", str(tmp_path / "bad.json"), "--yes")
    assert "cannot read" in usage("shop.email", ids["bad1"], "--payload", str(tmp_path / "none.json"), "--yes")
    err = usage("shop.email", "msg_nope", "--yes")
    assert "not a message id: msg_nope (message ids look like msg_" in err and "shop.audit" not in err
    err = usage("shop.nope", "--all", "--yes")
    assert "shop.nope" in err and "shop.email" in err
    assert dead_count(sqlite_url) == 2

    assert as_json(cli(*db, "replay", "shop.email", "--all", "--older-than", "7d", "--yes", "--json")) == \
        {"replayed": 0, "ids": []}
    assert as_json(cli(*db, "replay", "shop.email", "--all", "--code", "E_OTHER", "--dry-run", "--json")) == \
        {"replayed": 0, "would_replay": 0, "ids": []}
    assert as_json(cli(*db, "replay", "shop.email", "--all", "--match", "BAD2@", "--key", "u2", "--dry-run",
                       "--json"))["ids"] == [ids["bad2"]]
    out = as_json(cli(*db, "replay", "shop.email", "--all", "--code", "E_BOOM", "--match", "bad2",
                      "--older-than", "1ms", "--rate", "100/s", "--yes", "--json"))
    assert out == {"replayed": 1, "ids": [ids["bad2"]]}


def test_replay_payload_file_replaces_one_payload(sqlite_url, shop, tmp_path):
    ids = shop.populate(sqlite_url)
    (tmp_path / "fixed.json").write_text(json.dumps({"to": "fixed@x.co"}))
    out = as_json(cli("--db", sqlite_url, "replay", "shop.email", ids["bad1"], "--payload",
                      str(tmp_path / "fixed.json"), "--yes", "--json"))
    assert out == {"replayed": 1, "ids": [ids["bad1"]]}
    assert as_json(cli("--db", sqlite_url, "show", ids["bad1"], "--json"))["payload"] == {"to": "fixed@x.co"}
    shop.calls.clear()
    shop.drain(sqlite_url)  # still "broken", but the new address is not a bad one
    assert shop.calls == [("fixed@x.co", 1)]
    assert as_json(cli("--db", sqlite_url, "show", ids["bad1"], "--json"))["status"] == "delivered"


def test_replay_payload_is_checked_against_a_declared_schema(sqlite_url):
    from pydantic import BaseModel

    class Order(BaseModel):
        qty: int

    orders = signal.once("shop.orders", schema=Order, retries=0)

    async def handle(payload, fx):
        raise Boom("down")

    on(orders, flow("w.orders", do=handle))

    async def go() -> str:
        async with oke("shop", database_url=sqlite_url) as app:
            msg = await app.emit(orders, {"qty": 1})
            await app.drain()
            return msg

    msg = asyncio.run(go())
    bad = Path(sqlite_url.split("///", 1)[1]).parent / "bad.json"
    bad.write_text('{"qty": "many"}')
    result = cli("--db", sqlite_url, "replay", "shop.orders", msg, "--payload", str(bad), "--yes")
    assert result.exit_code == 2 and "OKE1250" in result.stderr
    assert dead_count(sqlite_url, "shop.orders") == 1


def test_two_concurrent_okconsole_processes_replay_one_dead_letter_once(db_url, shop, tmp_path):
    ids = shop.populate(db_url)
    for msg_id in (ids["bad1"], ids["bad2"]):
        procs = [subprocess.Popen([*okconsole_cmd(), "--db", db_url, "replay", "shop.email", msg_id, "--yes",
                                   "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=tmp_path) for _ in range(2)]
        outs = [p.communicate(timeout=60) for p in procs]
        # the loser either finds the message pending already (exit 2 naming it) or passes
        # that check and is skipped by the replay's own `status = 'dead'` guard (replayed 0)
        codes = sorted(p.returncode for p in procs)
        assert codes in ([0, 0], [0, 2]), outs
        counts = sorted(json.loads(out)["replayed"] for (out, _), p in zip(outs, procs) if p.returncode == 0)
        assert counts == ([0, 1] if codes == [0, 0] else [1])
        assert all(f"{msg_id} is pending, not dead" in err for (_, err), p in zip(outs, procs) if p.returncode)
    assert store_sql(db_url, "SELECT count(*) FROM oke_failures WHERE kind = 'replayed'") == [(2,)]
    assert sum(e["count"] for e in as_json(cli("--db", db_url, "audit", "--json"))) == 2


def test_replay_of_10000_via_the_cli_commits_whole_or_not_at_all(sqlite_url):
    bulk = signal.once("shop.bulk", retries=0)

    async def fail(payload, fx):
        raise Boom("down")

    on(bulk, flow("w.bulk", do=fail))

    async def go() -> list[str]:
        async with oke("shop", database_url=sqlite_url) as app:
            ids = await emit_many(app, bulk, [{"n": n} for n in range(10_000)])
            await app.drain(concurrency=64)
            return ids

    ids = asyncio.run(go())
    store_exec(sqlite_url, "CREATE TRIGGER oke_test_abort BEFORE INSERT ON oke_failures "
                           f"WHEN NEW.kind = 'replayed' AND NEW.message_id = '{ids[7777]}' "
                           "BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END")
    failed = cli("--db", sqlite_url, "replay", "shop.bulk", "--all", "--yes", "--json")
    assert failed.exit_code == 1 and failed.stdout == ""
    assert len(failed.stderr.strip().splitlines()) == 1 and "refused by the test trigger" in failed.stderr
    assert dead_count(sqlite_url, "shop.bulk") == 10_000
    assert store_sql(sqlite_url, "SELECT count(*) FROM oke_failures WHERE kind = 'replayed'") == [(0,)]
    assert store_sql(sqlite_url, "SELECT count(*) FROM oke_messages WHERE status <> 'dead'") == [(0,)]
    assert as_json(cli("--db", sqlite_url, "audit", "--json")) == []

    store_exec(sqlite_url, "DROP TRIGGER oke_test_abort")
    done = as_json(cli("--db", sqlite_url, "replay", "shop.bulk", "--all", "--yes", "--json"))
    assert done["replayed"] == 10_000 and done["ids"] == ids
    assert dead_count(sqlite_url, "shop.bulk") == 0


# ----------------------------------------------------------------------------------------- purge

def test_purge_confirmation_json_and_audit(db_url, shop):
    ids = shop.populate(db_url)
    refused = cli("--db", db_url, "purge", "shop.email", "--status", "dead")
    assert refused.exit_code == 2 and "--yes" in refused.stderr
    assert cli("--db", db_url, "purge", "shop.email", "--status", "pending", "--yes").exit_code == 2
    assert cli("--db", db_url, "purge", "shop.email", "--yes").exit_code == 2  # --status is required
    assert cli("--db", db_url, "--read-only", "purge", "shop.email", "--status", "dead", "--yes").exit_code == 2
    assert cli("--db", db_url, "purge", "shop.nope", "--status", "dead", "--yes").exit_code == 2
    assert dead_count(db_url) == 2

    assert as_json(cli("--db", db_url, "purge", "shop.email", "--status", "dead", "--older-than", "7d", "--yes",
                       "--json")) == {"purged": 0, "ids": []}
    assert as_json(cli("--db", db_url, "purge", "shop.email", "--status", "dead", "--dry-run", "--json")) == \
        {"purged": 0, "would_purge": 2, "ids": [ids["bad1"], ids["bad2"]]}
    out = as_json(cli("--db", db_url, "purge", "shop.email", "--status", "dead", "--yes", "--json",
                      "--actor", "dana", "--reason", "old junk"))
    assert out["purged"] == 2 and sorted(out["ids"]) == sorted([ids["bad1"], ids["bad2"]])
    assert dead_count(db_url) == 0
    assert cli("--db", db_url, "show", ids["bad1"]).exit_code == 2
    [entry] = as_json(cli("--db", db_url, "audit", "--json"))
    assert (entry["action"], entry["actor"], entry["count"], entry["reason"]) == ("purge", "dana", 2, "old junk")
    human = cli("--db", db_url, "purge", "shop.email", "--status", "delivered", "--yes")
    assert human.exit_code == 0 and "Purged 2 delivered" in human.stdout
    assert as_json(cli("--db", db_url, "messages", "shop.email", "--json")) == []


# -------------------------------------------------------------------------- the store, the stubs

@pytest.mark.parametrize("args", [("stats",), ("stats", "--json"), ("dlq", "x", "--json"),
                                  ("replay", "x", "--all", "--yes"), ("audit",)])
def test_unreachable_postgres_exits_1_with_one_line(args):
    result = cli("--db", UNREACHABLE, *args)
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("okconsole: cannot reach PostgreSQL at 127.0.0.1:1/nope: ")


def test_unreachable_postgres_in_a_real_process(tmp_path):
    done = run_okconsole("--db", UNREACHABLE, "stats", "--json", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("okconsole: cannot reach PostgreSQL at 127.0.0.1:1/nope")
    assert "Traceback" not in done.stderr
    via_env = run_okconsole("stats", cwd=tmp_path, env={"OKE_DATABASE_URL": UNREACHABLE})
    assert via_env.returncode == 1 and "127.0.0.1:1/nope" in via_env.stderr


def test_a_missing_sqlite_file_is_reported_and_not_created(tmp_path):
    target = tmp_path / "nowhere" / "oke.db"
    result = cli("--db", f"sqlite+aiosqlite:///{target}", "stats")
    assert result.exit_code == 1 and str(target) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not target.exists() and not target.parent.exists()
    default = run_okconsole("stats", cwd=tmp_path, env={"OKE_DATABASE_URL": ""})
    assert default.returncode == 1 and ".oke/oke.db" in default.stderr
    assert not (tmp_path / ".oke").exists()


def test_a_file_that_is_not_a_database_exits_1(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a SQLite database, just some bytes" * 100)
    result = cli("--db", f"sqlite+aiosqlite:///{junk}", "stats", "--json")
    assert result.exit_code == 1 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and str(junk) in result.stderr


def test_subprocess_reads_the_store_named_by_the_environment(sqlite_url, shop, tmp_path):
    shop.populate(sqlite_url)
    done = run_okconsole("stats", "--json", cwd=tmp_path, env={"OKE_DATABASE_URL": sqlite_url})
    assert done.returncode == 0, done.stderr
    assert {r["signal"] for r in json.loads(done.stdout)} == {"shop.email", "shop.audit", "shop.idle"}
    dlq = run_okconsole("--db", sqlite_url, "dlq", "shop.email", "--json", cwd=tmp_path)
    assert dlq.returncode == 0 and len(json.loads(dlq.stdout)) == 2


@pytest.mark.parametrize("args", [("tail", "order-status", "--json"), ("demo", "--headless", "--seconds", "3")])
def test_long_running_commands_on_an_unreachable_store_exit_1(args):
    if args[0] == "demo":
        from livekit import free_port
        args = (*args, "--port", str(free_port()))
    result = cli("--db", UNREACHABLE, *args)
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "127.0.0.1:1" in result.stderr


def test_help_lists_every_command():
    result = cli("--help")
    assert result.exit_code == 0
    for name in ("stats", "messages", "show", "dlq", "failures", "replay", "purge", "audit", "trace"):
        assert name in result.stdout


# ------------------------------------------------------------------------------ on a terminal

SGR = re.compile(r"\x1b\[([0-9;]*)m")


def colour_codes(output: str) -> set[str]:
    """SGR parameters that set a colour (30–37, 90–97, 38;…), ignoring bold/dim/reset."""
    found = set()
    for params in SGR.findall(output):
        parts = params.split(";")
        for i, p in enumerate(parts):
            if p in ("38", "48") or (p.isdigit() and (30 <= int(p) <= 37 or 90 <= int(p) <= 97)):
                found.add(";".join(parts[i:i + 3]))
    return found


def test_replay_on_a_terminal_asks_first(sqlite_url, shop, tmp_path):
    ids = shop.populate(sqlite_url)
    code, out = run_in_pty([*okconsole_cmd(), "--db", sqlite_url, "replay", "shop.email", "--all"], answer="n\n",
                           cwd=tmp_path)
    assert "Replay 2 dead letter(s) of shop.email?" in out
    assert code == 1 and "cancelled" in out
    assert dead_count(sqlite_url) == 2

    code, out = run_in_pty([*okconsole_cmd(), "--db", sqlite_url, "replay", "shop.email", ids["bad2"]],
                           answer="y\n", cwd=tmp_path, keys_when={"Reason (recorded": "smtp fixed\n"})
    assert code == 0, out
    assert "Replay 1 dead letter(s) of shop.email?" in out and "Replayed 1" in out
    assert dead_count(sqlite_url) == 1


def test_colour_follows_the_terminal_and_no_color(sqlite_url, shop, tmp_path):
    shop.populate(sqlite_url)
    args = [*okconsole_cmd(), "--db", sqlite_url, "stats"]
    code, coloured = run_in_pty(args, env={"NO_COLOR": None, "FORCE_COLOR": None}, cwd=tmp_path)
    assert code == 0 and "shop.email" in coloured
    assert colour_codes(coloured), "a terminal gets colour (dead counts in red)"
    code, plain = run_in_pty(args, env={"NO_COLOR": "1", "FORCE_COLOR": None}, cwd=tmp_path)
    assert code == 0 and "shop.email" in plain
    assert colour_codes(plain) == set()
    piped = run_okconsole("--db", sqlite_url, "stats", cwd=tmp_path, env={"FORCE_COLOR": ""})
    assert piped.returncode == 0 and "\x1b[" not in piped.stdout


_ABANDONED_CONNECT = """
import asyncio, socket, sys
import typer
from engine.errors import StoreUnavailable
from okconsole.commands.common import State
from okconsole.commands.session import run

async def call(store):
    # What a store meets when PostgreSQL goes away mid-call: a connection attempt of its own that is
    # refused after nobody awaits it any more (bench/chaos.py's console check caught its traceback).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    abandoned = asyncio.ensure_future(asyncio.open_connection("127.0.0.1", port))
    await asyncio.sleep(0.2)
    assert abandoned.done()
    del abandoned
    raise StoreUnavailable("cannot reach PostgreSQL at 127.0.0.1:1/nope: connection was closed in the middle of operation")

try:
    run(State(db=sys.argv[1], read_only=True, actor=None), call)
except typer.Exit as done:  # what the okconsole command does with it
    sys.exit(done.exit_code)
"""


def test_a_connection_refused_after_nobody_awaits_it_prints_no_traceback(tmp_path, sqlite_url, shop):
    """The one-line reason stays the only line when a store's own connection attempt failed
    unawaited: asyncio would print that task's traceback at exit."""
    shop.drain(sqlite_url)  # a store to open
    done = subprocess.run([sys.executable, "-c", _ABANDONED_CONNECT, sqlite_url], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "okconsole: cannot reach PostgreSQL at 127.0.0.1:1/nope: connection was closed in the middle of operation"]


async def test_a_read_command_starts_without_the_engines_app_server_or_worker(tmp_path):
    """`okconsole stats` reads the store through engine.ops: loading the app, its HTTP server and the
    worker would only slow the start of every command an operator types."""
    store = make_store(f"sqlite+aiosqlite:///{tmp_path / 'oke.db'}")
    await store.open()
    await store.close()
    probe = (
        "import sys\n"
        "from okconsole.cli import main\n"
        f"sys.argv = ['okconsole', '--db', 'sqlite+aiosqlite:///{tmp_path / 'oke.db'}', 'stats', '--json']\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    loaded = sorted(m for m in ('engine.app', 'engine.http.server', 'engine.worker', 'uvicorn')\n"
        "                    if m in sys.modules)\n"
        "    print('loaded:', loaded, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "loaded: []" in proc.stderr, proc.stderr
    assert proc.returncode == 0 and json.loads(proc.stdout) == [], (proc.returncode, proc.stdout, proc.stderr)
