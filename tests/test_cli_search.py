"""`okconsole messages SIGNAL --search TEXT`: payload, key or last failure, any case,
answered by the store over the whole signal; through the installed command and Typer's runner."""
from __future__ import annotations

import json

from consolekit import run_okconsole
from test_cli import as_json, cli, shop  # noqa: F401  (shop is a fixture)


def test_messages_search_matches_payload_key_and_last_failure(db_url, shop):  # noqa: F811
    ids = shop.populate(db_url)
    search = lambda text, *more: [r["id"] for r in as_json(  # noqa: E731
        cli("--db", db_url, "messages", "shop.email", "--search", text, *more, "--json"))]
    assert search("GOOD@X") == [ids["good"]]  # payload, another case
    assert search("u2") == [ids["bad2"]]  # key
    assert search("SMTP refused bad1") == [ids["bad1"]]  # the last failure's message only
    assert search("bad") == [ids["bad2"], ids["bad1"]]
    assert search("bad", "--limit", "1") == [ids["bad2"]]
    assert search("bad", "--status", "delivered") == []
    assert search("no such text") == []

    real = run_okconsole("--db", db_url, "messages", "shop.email", "--search", "Refused", "--json")
    assert real.returncode == 0, real.stderr
    assert [r["id"] for r in json.loads(real.stdout)] == [ids["bad2"], ids["bad1"]]
    human = run_okconsole("--db", db_url, "messages", "shop.email", "--search", "refused bad2")
    assert human.returncode == 0 and ids["bad2"] in human.stdout and ids["bad1"] not in human.stdout
    assert "--search" in cli("messages", "--help").stdout
