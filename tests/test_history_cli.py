"""`okconsole history SIGNAL [--since D] [--json]` on SQLite and PostgreSQL: the rows
are the store's minutes, gap-free and oldest first, the table shows the busy ones, and a bad
--since or an unknown signal is one line and exit 2."""

from __future__ import annotations

from engine.store.history import MINUTE_MS
from test_cli import as_json, cli, run_okconsole, shop, store_exec  # noqa: F401 (shop: a fixture)

FIELDS = {"at", "emitted", "delivered", "failed", "dead", "pruned", "pruned_runs"}


def test_history_json_counts_what_the_shop_did(db_url, shop):
    shop.populate(db_url)
    rows = as_json(cli("--db", db_url, "history", "shop.email", "--json"))
    assert rows and all(set(r) == FIELDS for r in rows)
    assert [r["at"] for r in rows] == sorted(r["at"] for r in rows)
    total = {k: sum(r[k] for r in rows) for k in FIELDS - {"at"}}
    # good and notify delivered; bad1 and bad2 failed once (retried), then went dead
    assert total == {"emitted": 4, "delivered": 2, "failed": 2, "dead": 2, "pruned": 0, "pruned_runs": 0}


def test_history_fills_quiet_minutes_and_the_table_shows_busy_ones(db_url, shop):
    shop.populate(db_url)
    rows = as_json(cli("--db", db_url, "history", "shop.email", "--json"))
    earlier = rows[0]["at"] - 3 * MINUTE_MS
    store_exec(db_url, f"INSERT INTO oke_history (signal, minute, emitted, delivered, failed, dead, pruned, "
                       f"pruned_runs) VALUES ('shop.email', {earlier}, 9, 9, 0, 0, 0, 0)")
    rows = as_json(cli("--db", db_url, "history", "shop.email", "--since", "15m", "--json"))
    assert [r["at"] - earlier for r in rows[:4]] == [0, MINUTE_MS, 2 * MINUTE_MS, 3 * MINUTE_MS]
    assert [r["emitted"] for r in rows[:4]] == [9, 0, 0, 4]  # the quiet minutes are rows of zeros
    assert as_json(cli("--db", db_url, "history", "shop.email", "--since", "1m", "--json"))[0]["at"] > earlier

    human = cli("--db", db_url, "history", "shop.email", "--since", "15m")
    assert human.exit_code == 0
    lines = human.stdout.splitlines()
    assert "History of shop.email" in lines[0]
    assert lines[1].split() == ["At", "Emitted", "Delivered", "Failed", "Dead", "Pruned"]
    assert [line.split()[2:] for line in lines[2:4]] == [["9", "9", "0", "0", "0"], ["4", "2", "2", "2", "0"]]
    assert "quiet minutes not shown; --json lists every minute." in human.stdout


def test_history_of_a_signal_without_any_says_so(sqlite_url, shop):
    shop.populate(sqlite_url)
    assert as_json(cli("--db", sqlite_url, "history", "shop.idle", "--json")) == []
    human = cli("--db", sqlite_url, "history", "shop.idle")
    assert human.exit_code == 0 and human.stdout.strip() == "No history of shop.idle in that window."


def test_bad_since_and_unknown_signal_exit_2_with_one_line(sqlite_url, shop):
    shop.populate(sqlite_url)
    for since in ("3x", "0m", "-1h", "1 h", ""):
        done = run_okconsole("--db", sqlite_url, "history", "shop.email", "--since", since)
        assert done.returncode == 2, since
        assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
        assert "--since" in done.stderr and "is not a duration" in done.stderr
    unknown = run_okconsole("--db", sqlite_url, "history", "shop.nope", "--json")
    assert unknown.returncode == 2 and 'unknown signal "shop.nope"' in unknown.stderr and unknown.stdout == ""
