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


def help_entries(text: str, section: str) -> dict[str, str]:
    """A section of click's help (`Commands:`, `Options:`) as {first word: its text, wrapped lines joined}."""
    lines = text.split(f"\n{section}\n", 1)[1].split("\n\n", 1)[0].splitlines()
    entries: dict[str, str] = {}
    name = ""
    for line in lines:
        stripped = line.strip()
        if line.startswith("  ") and not line.startswith("   "):  # a new entry: "  name  its text"
            name, _, rest = stripped.partition(" ")
            entries[name] = rest.strip()
        elif name:
            entries[name] += " " + stripped
    return entries


def test_help_summaries_are_whole_sentences_and_read_only_names_every_write(sqlite_url, shop):
    shown = run_okconsole("--help", env={"COLUMNS": "80"})
    assert shown.returncode == 0
    commands = help_entries(shown.stdout, "Commands:")
    assert {"stats", "replay", "cancel", "tail"} <= commands.keys()
    for name, text in commands.items():
        assert text.endswith(".") and "..." not in text, f"{name}: {text!r} is cut"
    read_only = help_entries(shown.stdout, "Options:")["--read-only"]
    assert "cancel" in read_only and "pause" in read_only, read_only

    from okconsole.commands.common import WRITE_COMMANDS
    from okconsole.commands.conventions import SUMMARIES

    assert commands.keys() <= SUMMARIES.keys(), "a command without a summary of its own"
    for name, text in commands.items():
        assert len(f"  {name}  {text}") <= 80, f"{name}: {text!r} wraps at 80 columns"
    listed = read_only.split(":", 1)[1]
    assert all(f" {name}," in listed or f" {name};" in listed for name in WRITE_COMMANDS), read_only
    # and each one it lists is refused under --read-only before it changes anything
    ids = shop.populate(sqlite_url)
    calls = {
        "replay": ["shop.email", "--all"], "purge": ["shop.email", "--status", "dead"],
        "unbind": ["shop.email", "w.email"], "pause": ["shop.email"], "resume": ["shop.email"],
        "cancel": ["shop.email", ids["bad1"]], "delete": ["shop.email", ids["bad1"]],
        "retry": ["shop.email", ids["bad1"]], "limit": ["shop.email", "--concurrency", "2"],
    }
    assert calls.keys() == set(WRITE_COMMANDS)
    for name, args in calls.items():
        refused = cli("--db", sqlite_url, "--read-only", name, *args, "--yes")
        assert refused.exit_code == 2 and f"--read-only: {name} writes to the store" in refused.stderr, name
    assert as_json(cli("--db", sqlite_url, "show", ids["bad1"], "--json"))["status"] == "dead"
