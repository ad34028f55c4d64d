"""`okconsole why ID` and `okconsole keys SIGNAL`, run as the installed command on SQLite and PostgreSQL:
the verdict line and its JSON, the keys board and its pages, bad input (exit 2 naming it), stored text
printed inert."""

from __future__ import annotations

import json
from typing import Any

import pytest
from consolekit import run_okconsole
from hostilekit import HOSTILE_ERROR, HOSTILE_KEY, assert_inert
from test_why_keys import fail_once  # the failed attempt the store tests make, one helper

from engine import flow, oke, signal
from engine.flows import Binding


async def _noop(payload: Any, fx: Any) -> None:
    return None


async def blocked_key(db_url: str, key: str = "k1", error: str = "smtp silent") -> tuple[str, str]:
    """A key whose head failed once, one message waiting behind it: (head, behind)."""
    jobs = signal.once("jobs")
    async with oke("shop", database_url=db_url, bindings=[Binding(jobs, flow("jobs.work", do=_noop))]) as app:
        head = await app.emit(jobs, {"n": 0}, key=key)
        behind = await app.emit(jobs, {"n": 1}, key=key)
    await fail_once(db_url, head, "TimeoutError", error)
    return head, behind


async def test_why_prints_the_verdict_and_a_line_to_act_on_and_json_the_object(db_url):
    head, behind = await blocked_key(db_url)
    text = run_okconsole("--db", db_url, "why", behind)
    assert text.returncode == 0, text.stderr
    first, second = text.stdout.splitlines()
    assert first.startswith(
        f"blocked_by_key  waits behind {head} (pending, 1 failed attempt, "
        "last: TimeoutError: smtp silent), the head of key 'k1'"
    )
    assert second.startswith(f"{behind} · jobs · pending · since ")
    done = run_okconsole("--db", db_url, "why", behind, "--json")
    assert done.returncode == 0 and done.stderr == ""
    found = json.loads(done.stdout)
    assert list(found) == ["id", "signal", "status", "verdict", "detail", "since"]
    assert (found["id"], found["signal"], found["status"], found["verdict"]) == (
        behind,
        "jobs",
        "pending",
        "blocked_by_key",
    )
    assert found["detail"] == first.split("  ", 1)[1]
    assert isinstance(found["since"], int)
    head_why = json.loads(run_okconsole("--db", db_url, "why", head, "--json").stdout)
    assert head_why["verdict"] == "due"  # a found message is exit 0 whatever its verdict


@pytest.mark.parametrize("bad", ["msg_01j9zq4k7t8v2n3m5p6r7s8t9v", "jobs", "\u202emsg_x"])
async def test_why_of_an_unknown_or_malformed_id_is_exit_2_naming_it_and_what_ids_look_like(db_url, bad):
    await blocked_key(db_url)
    done = run_okconsole("--db", db_url, "why", bad)
    assert done.returncode == 2 and done.stdout == ""
    assert "ids look like msg_" in done.stderr and "known signals" not in done.stderr
    assert_inert(done.stderr)
    if bad.isascii():
        assert bad in done.stderr


async def test_keys_lists_heads_and_blocked_keeps_the_failed_ones(db_url):
    head, _behind = await blocked_key(db_url)
    jobs = signal.once("jobs")
    async with oke("shop", database_url=db_url, bindings=[Binding(jobs, flow("jobs.work", do=_noop))]) as app:
        other = await app.emit(jobs, {"n": 2}, key="k2")
    text = run_okconsole("--db", db_url, "keys", "jobs")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].rstrip() == "jobs: keys with unfinished messages"
    assert lines[1].split() == ["Key", "Head", "Status", "Failed", "Waiting", "Last", "failure"]
    assert lines[2].split()[:5] == ["k1", head, "pending", "1", "1"] and lines[2].endswith("TimeoutError: smtp silent")
    assert lines[3].split() == ["k2", other, "pending", "0", "0", "-"]
    blocked = json.loads(run_okconsole("--db", db_url, "keys", "jobs", "--blocked", "--json").stdout)
    assert blocked["next_after"] is None
    [row] = blocked["items"]
    assert row == {
        "key": "k1",
        "flow": None,
        "head_id": head,
        "head_status": "pending",
        "head_attempts": 1,
        "head_last_failure": {
            "code": "TimeoutError",
            "message": "smtp silent",
            "at": 1,
            "attempt": 1,
            "traceback": None,
        },
        "waiting": 1,
    }


async def test_keys_says_when_there_are_more_and_the_cursor_pages_on(db_url):
    jobs = signal.once("jobs")
    async with oke("shop", database_url=db_url, bindings=[Binding(jobs, flow("jobs.work", do=_noop))]) as app:
        for n in range(5):
            await app.emit(jobs, {"n": n}, key=f"k{n}")
    text = run_okconsole("--db", db_url, "keys", "jobs", "--limit", "3")
    assert [line.split()[0] for line in text.stdout.splitlines()[2:5]] == ["k0", "k1", "k2"]
    last = text.stdout.splitlines()[-1]
    assert last.startswith("… more keys: pass --after ")
    cursor = last.split("--after ", 1)[1].split()[0]
    rest = json.loads(run_okconsole("--db", db_url, "keys", "jobs", "--after", cursor, "--json").stdout)
    assert [k["key"] for k in rest["items"]] == ["k3", "k4"] and rest["next_after"] is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["keys", "nope"], 'unknown signal "nope" (known signals: jobs)'),
        (["keys", "jobs", "--limit", "0"], "--limit"),
        (["keys", "jobs", "--limit", "-3"], "--limit"),
        (["keys", "jobs", "--limit", "many"], "--limit"),
        (["keys", "jobs", "--after", "not-a-cursor"], "not a keys cursor"),
    ],
)
async def test_keys_refuses_bad_input_with_exit_2(db_url, args, says):
    await blocked_key(db_url)
    done = run_okconsole("--db", db_url, *args)
    assert done.returncode == 2 and done.stdout == ""
    assert says in done.stderr


async def test_hostile_keys_and_failures_print_inert(db_url):
    _head, behind = await blocked_key(db_url, key=HOSTILE_KEY, error=HOSTILE_ERROR)
    for args in (["why", behind], ["keys", "jobs"], ["keys", "jobs", "--blocked"], ["why", behind, "--json"]):
        done = run_okconsole("--db", db_url, *args)
        assert done.returncode == 0, done.stderr
        assert_inert(done.stdout)
        assert "\\x1b" in done.stdout or "\\u001b" in done.stdout  # shown escaped, not dropped
