"""The real `okconsole` command as a person meets it on a write or a wrong id, on SQLite and
PostgreSQL: an unknown or malformed id is named as such (with what an id looks like), an
interactive write asks for the reason the audit log records, and `--help` reads whole sentences."""

from __future__ import annotations

import pytest

from consolekit import run_okconsole
from test_cli import Shop, as_json, cli

WELL_SHAPED = "msg_" + "0" * 26  # the shape of an id, and no message has it


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
