"""The real `okconsole` command as a person meets it on a write or a wrong id, on SQLite and
PostgreSQL: an unknown or malformed id is named as such (with what an id looks like), an
interactive write asks for the reason the audit log records, and `--help` reads whole sentences."""

from __future__ import annotations

import pytest

from consolekit import okconsole_cmd, run_in_pty, run_okconsole
from test_cli import Shop, as_json, cli

WELL_SHAPED = "msg_" + "0" * 26  # the shape of an id, and no message has it
REASON = "Reason (recorded in the audit log)"


@pytest.fixture
def shop() -> Shop:
    return Shop()


def test_an_unknown_or_malformed_id_says_so_and_what_ids_look_like(db_url, shop):
    ids = shop.populate(db_url)
    cases = [
        (("show", "nope"), "not a message id: nope (message ids look like msg_ then 26 letters and digits"),
        (("show", WELL_SHAPED), f"unknown message id {WELL_SHAPED}: no such message in this store"),
        (("cancel", "shop.email", ids["bad1"], "12345", "--yes"), "not a message id: 12345"),
        (("replay", "shop.email", WELL_SHAPED, "--yes"), f'unknown message id {WELL_SHAPED} in signal "shop.email"'),
    ]
    for args, said in cases:
        result = run_okconsole("--db", db_url, *args)
        assert result.returncode == 2 and result.stdout == "", (args, result.stderr)
        [line] = result.stderr.splitlines()
        assert said in line and "msg_" in line, (args, line)
        assert "known signals" not in line and "shop.audit" not in line, line  # the signals are beside the point
    assert as_json(cli("--db", db_url, "show", ids["bad1"], "--json"))["status"] == "dead"  # nothing changed


def test_an_interactive_write_asks_for_the_reason_the_audit_records(sqlite_url, shop, tmp_path):
    ids = shop.populate(sqlite_url)
    base = [*okconsole_cmd(), "--db", sqlite_url]
    # y, then an empty reason (asked again), then the reason
    code, out = run_in_pty([*base, "replay", "shop.email", ids["bad1"]], answer="y\n", cwd=tmp_path,
                           keys_when={REASON: "\n", "a reason is required": "smtp fixed\n"})
    assert code == 0 and "Replayed 1" in out, out
    code, out = run_in_pty([*base, "cancel", "shop.email", ids["bad1"]], answer="y\n", cwd=tmp_path,
                           keys_when={REASON: "wrong recipient\n"})
    assert code == 0 and "Cancelled 1" in out, out
    # --reason given: the question is asked, the reason is not
    code, out = run_in_pty([*base, "delete", "shop.email", ids["bad2"], "--reason", "personal data"], answer="y\n",
                           cwd=tmp_path)
    assert code == 0 and "Deleted 1" in out and REASON not in out, out
    audit = as_json(cli("--db", sqlite_url, "audit", "--json"))
    assert [(e["action"], e["reason"]) for e in audit[:3]] == [
        ("delete", "personal data"), ("cancel", "wrong recipient"), ("replay", "smtp fixed")]
    table = run_okconsole("--db", sqlite_url, "audit").stdout
    assert all(reason in table for reason in ("personal data", "wrong recipient", "smtp fixed")), table

    # without a terminal it cannot ask: it says how to pass both
    refused = run_okconsole("--db", sqlite_url, "purge", "shop.email", "--status", "delivered")
    assert refused.returncode == 2 and "pass --yes (and --reason TEXT" in refused.stderr
