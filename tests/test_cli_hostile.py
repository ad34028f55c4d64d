"""The CLI never obeys the data it shows: the hostile corpus (tests/hostilekit.py) through every
command that prints stored text, read as the bytes a terminal would get from the real `okconsole`.

A store is filled by the real engine: a signal whose name is markup, messages whose payloads and
keys carry terminal escapes, dead letters whose errors are `[/]`, `[/tmp/x]` and an OSC 52 write,
an audit reason and live events with the same, and one 10 MB payload.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from consolekit import okconsole_cmd
from hostilekit import HOSTILE, HOSTILE_ERROR, HOSTILE_KEY, STORABLE, assert_inert, big_payload, hostile_payload, visible

from engine import flow, oke, on, signal
from engine.display import SHOW_BYTES

NAME = "[bold red]hostile[/]"
TAPE = "tape[blink]x[/blink]"


class Failure(Exception):
    pass


def populate(url: str) -> dict[str, str]:
    """The hostile store: ids of a hostile message, a dead letter and the 10 MB payload."""
    queue = signal.once(NAME, retries=0)
    tape = signal.live(TAPE, optional=True)
    errors = iter(["[/]", "[/tmp/x] not found", HOSTILE_ERROR])

    @on(queue)
    @flow(name="[link=http://evil.example]flow[/link]")
    async def handle(payload, fx) -> None:
        if payload.get("fail"):
            raise Failure(next(errors))

    async def go() -> dict[str, str]:
        async with oke("hostile", database_url=url, max_payload_bytes=16 * 1024 * 1024) as app:
            ids = {"hostile": await app.emit(queue, {**hostile_payload(), "fail": False}, key=HOSTILE_KEY)}
            for n in range(3):
                ids[f"dead{n}"] = await app.emit(queue, {**hostile_payload(), "fail": True}, key=f"{HOSTILE_KEY}{n}")
            ids["big"] = await app.emit(queue, big_payload())
            for value in STORABLE.values():
                await app.emit(tape, {"text": value})
            await app.drain()
            return ids

    return asyncio.run(go())


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('hostile') / 'oke.db'}"
    ids = populate(url)
    import engine

    engine.reset()
    return url, ids


def okconsole(*args: str, ok: int = 0) -> tuple[bytes, bytes]:
    """The real console in a process, stdout a pipe: the raw bytes it writes."""
    import subprocess

    done = subprocess.run([*okconsole_cmd(), *args], capture_output=True, timeout=120)
    assert done.returncode == ok, done.stderr.decode(errors="replace")
    return done.stdout, done.stderr


def as_text(raw: bytes) -> str:
    return raw.decode("utf-8")


@pytest.mark.parametrize(
    "command",
    [
        ["stats"],
        ["messages", NAME, "--limit", "50"],
        ["dlq", NAME],
        ["failures", NAME],
        ["bindings"],
    ],
    ids=lambda c: c[0],
)
def test_tables_show_stored_text_inert_and_literal(hostile_store, command) -> None:
    url, _ = hostile_store
    out, err = okconsole("--db", url, *command)
    assert_inert(out)
    assert_inert(err)
    text = as_text(out)
    assert NAME in text  # markup shown as the text it is, not as bold red
    if command[0] in ("dlq", "failures"):
        assert "[/tmp/x] not found" in text and "[/]" in text
        assert visible(HOSTILE_ERROR)[:40] in text.replace("\n", "")


def test_messages_shows_the_key_escaped(hostile_store) -> None:
    url, _ = hostile_store
    out, _ = okconsole("--db", url, "messages", NAME, "--limit", "50")
    assert visible(HOSTILE_KEY) in as_text(out)


def test_show_prints_every_corpus_string_visibly_escaped(hostile_store) -> None:
    url, ids = hostile_store
    out, err = okconsole("--db", url, "show", ids["hostile"])
    assert_inert(out)
    assert_inert(err)
    text = as_text(out)
    for name in ("osc52", "osc8", "c1_csi", "bidi", "markup_close", "markup_link"):
        # the payload is printed as JSON, so the corpus string appears JSON-quoted, then made inert
        assert visible(json.dumps(HOSTILE[name], ensure_ascii=False)[1:-1]) in text, name
    assert visible(HOSTILE_KEY) in text


def test_show_of_a_dead_letter_prints_its_errors_literally(hostile_store) -> None:
    url, ids = hostile_store
    out, _ = okconsole("--db", url, "show", ids["dead2"])
    assert_inert(out)
    assert visible(HOSTILE_ERROR).split()[0] in as_text(out)


def test_show_cuts_a_10_mb_payload_at_64_kib_and_full_prints_it_all(hostile_store) -> None:
    url, ids = hostile_store
    out, _ = okconsole("--db", url, "show", ids["big"])
    assert len(out) < SHOW_BYTES + 16 * 1024
    text = as_text(out)
    assert "more bytes (--full prints all)" in text
    full, _ = okconsole("--db", url, "show", ids["big"], "--full")
    assert full.count(b"x") >= 10 * 1024 * 1024
    raw, _ = okconsole("--db", url, "show", ids["big"], "--json")
    assert len(json.loads(raw)["payload"]["blob"]) == 10 * 1024 * 1024


@pytest.mark.parametrize(
    "command",
    [["stats"], ["messages", NAME], ["show", "hostile"], ["dlq", NAME], ["failures", NAME], ["audit"]],
    ids=lambda c: c[0],
)
def test_json_escapes_every_c0_and_c1_and_round_trips(hostile_store, command) -> None:
    url, ids = hostile_store
    args = [ids.get(a, a) for a in command]
    out, _ = okconsole("--db", url, *args, "--json")
    assert_inert(out)
    for code in [*range(0x20), *range(0x7F, 0xA0)]:
        assert chr(code).encode() not in out.rstrip(b"\n"), hex(code)
    data = json.loads(out)
    if command[0] == "show":
        assert data["key"] == HOSTILE_KEY and data["payload"]["osc52"] == HOSTILE["osc52"]


def test_audit_shows_a_hostile_reason_inert(hostile_store, tmp_path: Path) -> None:
    url, ids = hostile_store
    okconsole("--db", url, "replay", NAME, ids["dead0"], "--yes", "--reason", HOSTILE["osc52"] + "[/]")
    out, _ = okconsole("--db", url, "audit")
    assert_inert(out)
    assert visible("osc52") + "[/]" in as_text(out)


def test_tail_prints_live_events_inert_in_text_and_json(hostile_store) -> None:
    url, _ = hostile_store
    count = str(len(STORABLE))
    out, _ = okconsole("--db", url, "tail", TAPE, "--from-start", "--count", count)
    assert_inert(out)
    lines = as_text(out).splitlines()
    assert len(lines) == len(STORABLE)
    out, _ = okconsole("--db", url, "tail", TAPE, "--from-start", "--count", count, "--json")
    assert_inert(out)
    texts = [json.loads(line)["data"]["text"] for line in as_text(out).splitlines()]
    assert texts == list(STORABLE.values())


def test_errors_on_stderr_name_stored_names_inert(hostile_store) -> None:
    url, _ = hostile_store
    out, err = okconsole("--db", url, "messages", "no-such-signal", ok=2)
    assert_inert(err)
    assert NAME in as_text(err)  # the known names are listed, literally


def test_invalid_utf8_written_by_another_program_is_shown_as_bytes(tmp_path: Path) -> None:
    """SQLite keeps whatever bytes another program wrote into a TEXT column; the console shows
    them as `\\xNN` instead of failing the whole query."""
    import sqlite3

    url = f"sqlite+aiosqlite:///{tmp_path / 'oke.db'}"
    msg_id = populate(url)["dead1"]
    raw = sqlite3.connect(tmp_path / "oke.db")
    with raw:
        raw.execute("UPDATE oke_messages SET key = CAST(x'6bff1b5b324a' AS TEXT) WHERE id = ?", (msg_id,))
        raw.execute("UPDATE oke_failures SET message = CAST(x'626f6f6dfe' AS TEXT) WHERE message_id = ?", (msg_id,))
    raw.close()
    for command in (["messages", NAME], ["dlq", NAME], ["show", msg_id]):
        out, _ = okconsole("--db", url, *command)
        assert_inert(out)
        assert "k\\xff\\x1b[2J" in as_text(out), command
    out, _ = okconsole("--db", url, "show", msg_id)
    assert "boom\\xfe" in as_text(out)
    out, _ = okconsole("--db", url, "show", msg_id, "--json")
    assert json.loads(out)["key"] == "k\udcff\x1b[2J"
