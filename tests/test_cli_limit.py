"""`okconsole limit` on SQLite and PostgreSQL: the override and its reset in --json and in
stats, the audit row, --read-only's refusal, and bad values refused with exit 2, nothing changed."""

from __future__ import annotations

import pytest

from test_cli import Shop, as_json, cli


@pytest.fixture
def shop() -> Shop:
    return Shop()


def stats_of(url: str, name: str = "shop.email") -> dict:
    return next(r for r in as_json(cli("--db", url, "stats", "--json")) if r["signal"] == name)


def limits_of(url: str) -> tuple:
    row = stats_of(url)
    return row["concurrency"], row["rate"], row["running"]


def test_limit_overrides_until_reset_audited_and_in_stats(db_url, shop):
    shop.populate(db_url)
    assert limits_of(db_url) == (None, None, 0)
    out = as_json(
        cli(
            "--db",
            db_url,
            "limit",
            "shop.email",
            "--concurrency",
            "2",
            "--rate",
            "10/1m",
            "--yes",
            "--json",
            "--actor",
            "ana",
            "--reason",
            "relay throttles",
        )  # fmt: skip
    )
    assert out == {"signal": "shop.email", "concurrency": 2, "rate": "10/1m", "overridden": True, "changed": True}
    assert limits_of(db_url) == (2, "10/1m", 0)

    lifted = as_json(cli("--db", db_url, "limit", "shop.email", "--rate", "none", "--yes", "--json"))
    assert (lifted["concurrency"], lifted["rate"]) == (2, None)  # the concurrency override stays

    human = cli("--db", db_url, "limit", "shop.email", "--reset", "--yes")
    assert human.exit_code == 0 and "as declared" in human.stdout
    assert limits_of(db_url) == (None, None, 0)
    again = cli("--db", db_url, "limit", "shop.email", "--reset", "--yes")
    assert again.exit_code == 0 and "had no override" in again.stdout

    audit = [e for e in as_json(cli("--db", db_url, "audit", "--json")) if e["action"] == "limit"]
    assert [e["reason"] for e in audit] == [
        "reset to the declared limits",
        "rate none",
        "concurrency 2, rate 10/1m: relay throttles",
    ]
    assert audit[-1]["actor"] == "ana" and audit[-1]["signal"] == "shop.email"


@pytest.mark.parametrize(
    "args",
    [
        ["--concurrency", "0"],
        ["--concurrency", "-1"],
        ["--concurrency", "two"],
        ["--rate", "0/1m"],
        ["--rate", "fast"],
        ["--rate", "10/0s"],
        ["--reset", "--concurrency", "3"],
        [],
    ],
)
def test_a_bad_value_is_exit_2_and_changes_nothing(sqlite_url, shop, args):
    shop.populate(sqlite_url)
    cli("--db", sqlite_url, "limit", "shop.email", "--concurrency", "4", "--yes")
    before = as_json(cli("--db", sqlite_url, "audit", "--json"))
    result = cli("--db", sqlite_url, "limit", "shop.email", *args, "--yes")
    assert result.exit_code == 2 and "limit" in result.stderr, result.stderr
    assert limits_of(sqlite_url) == (4, None, 0)
    assert as_json(cli("--db", sqlite_url, "audit", "--json")) == before


def test_read_only_refuses_and_unknown_or_live_signals_are_exit_2(sqlite_url, shop):
    shop.populate(sqlite_url)
    refused = cli("--db", sqlite_url, "--read-only", "limit", "shop.email", "--concurrency", "2", "--yes")
    assert refused.exit_code == 2 and "--read-only" in refused.stderr
    unknown = cli("--db", sqlite_url, "limit", "shop.nope", "--concurrency", "2", "--yes")
    assert unknown.exit_code == 2 and "known signals" in unknown.stderr
    assert cli("--db", sqlite_url, "limit", "shop.email", "--concurrency", "2").exit_code == 2  # asks: no terminal
    assert limits_of(sqlite_url) == (None, None, 0)
