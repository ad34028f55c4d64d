"""`okconsole pause / resume / cancel / delete / retry` on SQLite and PostgreSQL:
JSON shapes, confirmation (and its refusal without a terminal), --read-only, --actor, exit codes."""
from __future__ import annotations

import asyncio

import pytest

from consolekit import okconsole_cmd, run_in_pty
from engine import oke, signal
from test_cli import Shop, as_json, cli, store_exec, store_sql

FUTURE = 99_999_999_999_999


@pytest.fixture
def shop() -> Shop:
    return Shop()


def pending_shop(url: str, shop: Shop) -> dict[str, str]:
    """The shop's messages (2 dead, 2 delivered), plus two pending: one due, one waiting for its run_at."""
    ids = shop.populate(url)
    shop.broken = False
    more = shop.populate(url)  # delivered now; turn two of them back into pending ones
    ids["due"], ids["waiting"] = more["good"], more["notify"]
    store_exec(
        url,
        f"UPDATE oke_messages SET status = 'pending', finished_at = NULL WHERE id IN ('{ids['due']}', '{ids['waiting']}')",
        f"UPDATE oke_messages SET run_at = {FUTURE} WHERE id = '{ids['waiting']}'",
    )
    return ids


def status_of(url: str, msg_id: str) -> str:
    return as_json(cli("--db", url, "show", msg_id, "--json"))["status"]


def stats_of(url: str, name: str = "shop.email") -> dict:
    return next(r for r in as_json(cli("--db", url, "stats", "--json")) if r["signal"] == name)


def test_pause_and_resume_json_stats_audit_and_refusals(db_url, shop):
    shop.populate(db_url)
    assert cli("--db", db_url, "pause", "shop.email").exit_code == 2  # no terminal, no --yes
    assert cli("--db", db_url, "--read-only", "pause", "shop.email", "--yes").exit_code == 2
    unknown = cli("--db", db_url, "pause", "shop.nope", "--yes")
    assert unknown.exit_code == 2 and "known signals" in unknown.stderr
    assert stats_of(db_url)["paused"] is False

    out = as_json(cli("--db", db_url, "pause", "shop.email", "--yes", "--json", "--actor", "ana", "--reason", "smtp"))
    assert out == {"signal": "shop.email", "paused": True, "changed": True}
    assert stats_of(db_url)["paused"] is True
    table = cli("--db", db_url, "stats")
    row = next(line for line in table.stdout.splitlines() if line.startswith("shop.email"))
    assert "Paused" in table.stdout.splitlines()[0] and " yes " in row
    again = cli("--db", db_url, "pause", "shop.email", "--yes")
    assert again.exit_code == 0 and "paused already" in again.stdout

    human = cli("--db", db_url, "resume", "shop.email", "--yes")
    assert human.exit_code == 0 and "Resumed shop.email." in human.stdout
    assert stats_of(db_url)["paused"] is False
    audit = as_json(cli("--db", db_url, "audit", "--json"))
    assert [(e["action"], e["reason"]) for e in audit[:2]] == [("resume", None), ("pause", "smtp")]
    assert audit[1]["actor"] == "ana" and audit[0]["actor"]  # the OS user when no --actor


def test_a_live_signal_cannot_be_paused(sqlite_url):
    signal.live("tape.x")

    async def boot() -> None:
        async with oke("t", database_url=sqlite_url):
            pass

    asyncio.run(boot())
    refused = cli("--db", sqlite_url, "pause", "tape.x", "--yes")
    assert refused.exit_code == 2 and "is live" in refused.stderr


def test_cancel_json_dry_run_skips_and_replay(db_url, shop):
    ids = pending_shop(db_url, shop)
    assert cli("--db", db_url, "cancel", "shop.email", ids["due"]).exit_code == 2  # asks: no terminal
    assert cli("--db", db_url, "cancel", "shop.email").exit_code == 2  # neither ids nor --all
    assert cli("--db", db_url, "cancel", "shop.email", ids["due"], "--all", "--yes").exit_code == 2
    assert cli("--db", db_url, "cancel", "shop.email", "no-such", "--yes").exit_code == 2
    [(audit_id,)] = store_sql(db_url, "SELECT id FROM oke_messages WHERE signal = 'shop.audit' LIMIT 1")
    other = cli("--db", db_url, "cancel", "shop.email", audit_id, "--yes")  # a message of another signal
    assert other.exit_code == 2 and audit_id in other.output and status_of(db_url, audit_id) == "delivered"
    dry = as_json(cli("--db", db_url, "--read-only", "cancel", "shop.email", "--all", "--dry-run", "--json"))
    assert dry == {"cancelled": 0, "would_cancel": 2, "ids": [ids["due"], ids["waiting"]], "skipped": [],
                   "would_request": []}
    assert status_of(db_url, ids["due"]) == "pending"

    out = as_json(cli("--db", db_url, "cancel", "shop.email", ids["waiting"], ids["bad1"], "--yes", "--json",
                      "--reason", "wrong list"))
    assert out == {"cancelled": 1, "ids": [ids["waiting"]], "skipped": [{"id": ids["bad1"], "status": "dead"}],
                   "requested": []}
    shown = as_json(cli("--db", db_url, "show", ids["waiting"], "--json"))
    assert shown["status"] == "dead" and shown["failures"][-1]["code"] == "Cancelled"
    assert shown["failures"][-1]["message"] == "wrong list"
    assert as_json(cli("--db", db_url, "replay", "shop.email", ids["waiting"], "--yes", "--json"))["replayed"] == 1


def test_delete_and_retry_json_and_tables(db_url, shop):
    ids = pending_shop(db_url, shop)
    before = stats_of(db_url)
    out = as_json(cli("--db", db_url, "delete", "shop.email", ids["bad1"], ids["due"], "--yes", "--json"))
    assert out == {"deleted": 1, "ids": [ids["bad1"]], "skipped": [{"id": ids["due"], "status": "pending"}]}
    after = stats_of(db_url)
    assert (after["dead"], after["pending"]) == (before["dead"] - 1, before["pending"])
    assert cli("--db", db_url, "show", ids["bad1"]).exit_code == 2

    human = cli("--db", db_url, "retry", "shop.email", ids["waiting"], ids["due"], ids["bad2"], "--yes")
    assert human.exit_code == 0
    assert "Retried 1 message(s) of shop.email." in human.stdout
    assert f"Skipped {ids['due']}: it is pending (already due" in human.stdout
    assert f"Skipped {ids['bad2']}: it is dead (a dead letter is requeued with: okconsole replay)" in human.stdout
    assert store_sql(db_url, f"SELECT run_at FROM oke_messages WHERE id = '{ids['waiting']}'") == [(None,)]
    assert cli("--db", db_url, "--read-only", "delete", "shop.email", ids["bad2"], "--yes").exit_code == 2
    assert cli("--db", db_url, "retry", "shop.email").exit_code == 2
    actions = [e["action"] for e in as_json(cli("--db", db_url, "audit", "--json"))]
    assert actions[:2] == ["retry", "delete"]


def test_cancel_asks_on_a_terminal_naming_the_count(sqlite_url, shop):
    ids = pending_shop(sqlite_url, shop)
    code, out = run_in_pty(okconsole_cmd() + ["--db", sqlite_url, "cancel", "shop.email", "--all"], answer="n\n")
    assert "Cancel 2 message(s) of shop.email?" in out and code == 1
    assert status_of(sqlite_url, ids["due"]) == "pending"
    code, out = run_in_pty(okconsole_cmd() + ["--db", sqlite_url, "cancel", "shop.email", "--all"], answer="y\n",
                           keys_when={"Reason (recorded": "stale\n"})
    assert code == 0 and "Cancelled 2 message(s)" in out
    assert status_of(sqlite_url, ids["due"]) == "dead"
