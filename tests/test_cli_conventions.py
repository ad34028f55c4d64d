"""The console's conventions through the real `okconsole`: version, completion, help, no-TTY, tables, time bounds, exit codes.

Where a terminal matters the command runs on a pseudo-terminal (stdin, stdout and stderr on one pty);
elsewhere on pipes. Servers are real sockets on 127.0.0.1; stores are real SQLite files (and
PostgreSQL where the store's answers are rendered).
"""
from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import signal as os_signal
import socket
import subprocess
import sys
import threading
import time
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Iterator

import pytest
import typer.main

from engine import flow, oke, on, signal
from okconsole.cli import app
from okconsole.tailing import NETWORK_TIMEOUT_S, network_timeout_s
from consolekit import okconsole_cmd, run_in_pty, run_okconsole
from test_cli import Shop, cli
from test_ops import Boom

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def screen_lines(output: str) -> list[str]:
    return [ANSI.sub("", line) for line in output.replace("\r\n", "\n").split("\n")]


# ------------------------------------------------------------------------- version, completion

def test_version_prints_the_package_version_and_exits_0(tmp_path):
    done = run_okconsole("--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"okconsole {dist_version('okengine')}\n"


def test_shell_completion_is_typers(tmp_path):
    for shell, marker in (("bash", "complete_bash"), ("zsh", "compdef"), ("fish", "complete --command okconsole")):
        shown = run_okconsole("--show-completion", shell, cwd=tmp_path)
        assert shown.returncode == 0 and marker in shown.stdout, (shell, shown.stdout, shown.stderr)
    # the script works: bash asks the command itself for the words that fit
    env = {"_OKCONSOLE_COMPLETE": "complete_bash", "COMP_WORDS": "okconsole st", "COMP_CWORD": "1"}
    done = run_okconsole(cwd=tmp_path, env=env)
    assert done.returncode == 0 and done.stdout.split() == ["stats"], (done.stdout, done.stderr)
    assert "--install-completion" in cli("--help").stdout
    home = tmp_path / "home"
    home.mkdir()
    installed = run_okconsole("--install-completion", "zsh", cwd=tmp_path, env={"HOME": str(home)})
    assert installed.returncode == 0 and "zsh completion installed" in installed.stdout, installed.stderr
    assert "_OKCONSOLE_COMPLETE" in (home / ".zfunc" / "_okconsole").read_text()


# ----------------------------------------------------------------------------------- help text

COMMANDS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
ARTEFACT = re.compile(r"\{[A-Z_:]+\}|<[a-z]+(\[[a-z]+\])?>|\[\[")


@pytest.mark.parametrize("name", ["", *COMMANDS])
def test_every_help_has_examples_and_plain_usage(name):
    result = cli(*([name] if name else []), "--help")
    assert result.exit_code == 0
    text = result.stdout
    usage = next(line for line in text.splitlines() if line.startswith("Usage:"))
    assert not ARTEFACT.search(text), text
    assert "Examples:" in text
    examples = text.split("Examples:", 1)[1].strip().splitlines()
    assert examples and all(line.strip().startswith(("okconsole", "OKE_")) for line in examples), examples
    assert all(f"okconsole {name}".rstrip() in line for line in examples if line.strip().startswith("okconsole"))
    if name in ("messages", "show", "replay", "trace", "tail", "serve"):
        assert re.search(r" [A-Z_:]+( \[[A-Z]+\]\.\.\.)?$", usage), usage  # SIGNAL, ID, [ID]..., MODULE:ATTR


def test_replay_usage_reads_as_typed():
    usage = cli("replay", "--help").stdout.splitlines()[0]
    assert usage == "Usage: okconsole replay [OPTIONS] SIGNAL [ID]..."


# ------------------------------------------------------------------------------ no terminal

def test_bare_okconsole_without_a_terminal_prints_help_and_exits_2(sqlite_url, tmp_path):
    Shop().populate(sqlite_url)
    for stdin in (subprocess.DEVNULL, None):  # neither is a TTY here; None inherits pytest's
        done = subprocess.run([*okconsole_cmd(), "--db", sqlite_url], stdin=stdin, capture_output=True,
                              text=True, timeout=30, cwd=tmp_path)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.startswith("Usage: okconsole [OPTIONS] COMMAND") and "Examples:" in done.stderr
        assert "needs a terminal" in done.stderr and "\x1b" not in done.stderr


def test_bare_okconsole_with_only_stdin_on_a_terminal_exits_2(sqlite_url, tmp_path):
    import pty

    master, slave = pty.openpty()
    try:
        done = subprocess.run([*okconsole_cmd(), "--db", sqlite_url], stdin=slave, capture_output=True, text=True,
                              timeout=30, cwd=tmp_path)
    finally:
        os.close(slave)
        os.close(master)
    assert done.returncode == 2 and done.stdout == "" and "needs a terminal" in done.stderr


def test_bare_okconsole_on_a_terminal_starts_the_tui(sqlite_url, tmp_path):
    """The control case: with a TTY the TUI draws (alternate screen, the signal names) and `q` quits."""
    Shop().populate(sqlite_url)
    code, out = run_in_pty([*okconsole_cmd(), "--db", sqlite_url], keys_when={"shop.email": "q"},
                           env={"COLUMNS": "120", "LINES": "40"}, cwd=tmp_path)
    assert "\x1b[?1049h" in out and "shop.email" in out
    assert code == 0 and "Usage:" not in out


# --------------------------------------------------------------------------------------- tables

def populate_long(url: str) -> None:
    """Dead letters with long keys and long failure messages, and a replayed one (an audit row)."""
    mail = signal.once("conv.mail", retries=0)

    async def refuse(payload, fx) -> None:
        raise Boom(f"smtp relay refused {payload['to']}: 552 mailbox over quota, try again much later")

    on(mail, flow("conv.mailer", do=refuse))

    async def go() -> None:
        async with oke("conv", database_url=url) as oke_app:
            for n in range(4):
                await oke_app.emit(mail, {"to": f"user{n}@example.org"}, key=f"customer-{n:04d}-eu-west-1")
            await oke_app.drain()
    asyncio.run(go())


def ids_and_keys(url: str) -> set[str]:
    rows = json.loads(cli("--db", url, "messages", "conv.mail", "--json").stdout)
    return {r["id"] for r in rows} | {r["key"] for r in rows} | {r["parent_run_id"] for r in rows if r["parent_run_id"]}


def whole_on_a_line(words: set[str], lines: list[str]) -> set[str]:
    return {w for w in words if any(w in line for line in lines)}


@pytest.mark.parametrize("columns", [80, 120])
def test_tables_never_split_an_id_a_key_or_a_time(db_url, tmp_path, columns):
    populate_long(db_url)
    wanted = ids_and_keys(db_url)
    first = sorted(w for w in wanted if w.startswith("msg_"))[0]
    assert cli("--db", db_url, "replay", "conv.mail", first, "--yes", "--reason",
               "relay quota raised " * 6).exit_code == 0
    stamp = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
    messages = {w for w in wanted if w.startswith("msg_")}
    for command, shown_ids in ((["messages", "conv.mail"], messages), (["dlq", "conv.mail"], messages - {first}),
                               (["audit"], {first}), (["show", first], {first})):
        args = ["--db", db_url, *command]
        code, tty = run_in_pty([*okconsole_cmd(), *args], env={"COLUMNS": str(columns), "NO_COLOR": "1"},
                               cwd=tmp_path)
        assert code == 0, tty
        lines = screen_lines(tty)
        assert all(len(line) <= columns for line in lines), (command, [len(x) for x in lines], tty)
        assert whole_on_a_line(shown_ids, lines) == shown_ids, (command, tty)
        for line in lines:  # a time is whole or absent: never "2026-12-01 09:4" at a line's end
            assert not re.search(r"\d{4}-\d\d-\d\d( \d\d?(:\d\d?)?)?$", line.rstrip()) or stamp.search(line), line
        piped = run_okconsole(*args, cwd=tmp_path, env={"COLUMNS": str(columns)})
        assert piped.returncode == 0, piped.stderr
        plines = piped.stdout.splitlines()
        assert whole_on_a_line(shown_ids, plines) == shown_ids
        assert "…" not in piped.stdout.replace(" … (+", "") and "left out" not in piped.stdout, piped.stdout
        if command[0] == "messages":
            assert "Parent run" in piped.stdout  # every column, the line left long
            assert max(len(x) for x in plines) > columns
            assert whole_on_a_line(wanted, plines) == wanted
    code, dlq = run_in_pty([*okconsole_cmd(), "--db", db_url, "dlq", "conv.mail"],
                           env={"COLUMNS": str(columns), "NO_COLOR": "1"}, cwd=tmp_path)
    assert "…" in dlq, dlq  # the failure text gives way, cut with an ellipsis
    keys = {r["key"] for r in json.loads(cli("--db", db_url, "dlq", "conv.mail", "--json").stdout)}
    assert len(keys) == 3
    assert whole_on_a_line(keys, screen_lines(dlq)) == keys


# ---------------------------------------------------------------------------- network bounds

@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that accepts every connection and never sends a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(timeout=5)
    for conn in held:
        conn.close()
    listener.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    """`/_oke/exposures` lists one exposure (in the shape of a server from before `custom`/`match`/`flow`:
    the client must still choose it); any other path is accepted and left without an answer
    (or, with `plain`, every path is a 404 as from a web server that is not okengine)."""
    plain = False
    hang = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if not self.plain and self.path == "/_oke/exposures":
            body = json.dumps({"data": [{"signal": "ticks", "path": "/ticks", "params": []}], "error": None})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())
        elif self.plain:
            self.send_error(404)
        else:
            self.hang.wait(30)

    def log_message(self, *args: object) -> None:
        pass


def http_server(plain: bool) -> tuple[http.server.ThreadingHTTPServer, int]:
    handler = type("Handler", (_Handler,), {"plain": plain, "hang": threading.Event()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def test_tail_url_to_a_server_that_never_answers_exits_1_within_the_bound(silent_server, tmp_path):
    started = time.monotonic()
    done = run_okconsole("tail", "ticks", "--url", f"http://127.0.0.1:{silent_server}", cwd=tmp_path,
                         env={"OKE_NETWORK_TIMEOUT": "1"}, timeout=40)
    took = time.monotonic() - started
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == f"okconsole: no answer from http://127.0.0.1:{silent_server} within 1 s"
    assert took < 30


def test_tail_url_whose_stream_never_opens_exits_1(tmp_path):
    server, port = http_server(plain=False)
    try:
        done = run_okconsole("tail", "ticks", "--url", f"http://127.0.0.1:{port}", cwd=tmp_path,
                             env={"OKE_NETWORK_TIMEOUT": "1"}, timeout=40)
        unknown = run_okconsole("tail", "nope", "--url", f"http://127.0.0.1:{port}", cwd=tmp_path,
                                env={"OKE_NETWORK_TIMEOUT": "1"}, timeout=40)
    finally:
        server.RequestHandlerClass.hang.set()  # type: ignore[attr-defined]
        server.shutdown()
    assert done.returncode == 1 and "within 1 s: the stream did not open" in done.stderr, done.stderr
    assert unknown.returncode == 2  # an okengine server that does not expose it: the signal is unknown
    assert f'unknown live signal "nope" (exposed at http://127.0.0.1:{port}: ticks)' in unknown.stderr
    # the server lists only what the caller's gates let through: a gated signal is not listed without a token
    assert "if it is gated, pass the --token its gate accepts" in unknown.stderr


def test_tail_url_of_a_server_that_is_not_okengine_says_so(tmp_path):
    server, port = http_server(plain=True)
    try:
        done = run_okconsole("tail", "ticks", "--url", f"http://127.0.0.1:{port}", cwd=tmp_path, timeout=40)
    finally:
        server.shutdown()
    assert done.returncode == 1 and done.stdout == ""
    assert f"http://127.0.0.1:{port} is not an okengine server" in done.stderr
    assert "unknown live signal" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_network_bound_is_10_s_unless_the_environment_says_otherwise(monkeypatch):
    monkeypatch.delenv("OKE_NETWORK_TIMEOUT", raising=False)
    assert network_timeout_s() == NETWORK_TIMEOUT_S == 10.0
    for junk in ("", "soon", "0", "-3", "nan", "inf"):
        monkeypatch.setenv("OKE_NETWORK_TIMEOUT", junk)
        assert network_timeout_s() == 10.0
    monkeypatch.setenv("OKE_NETWORK_TIMEOUT", "2.5")
    assert network_timeout_s() == 2.5


# -------------------------------------------------------------------------------- exit codes

@pytest.mark.parametrize("url, fragment", [
    ("ftp://127.0.0.1/x", "unsupported database 'ftp'"),
    ("mysql+aiomysql://u@127.0.0.1/db", "unsupported database"),
    ("postgresql+psycopg://u@127.0.0.1/db", "through asyncpg"),
    ("sqlite+aiosqlite:///:memory:", "needs a SQLite file"),
    ("postgresql+asyncpg://u@127.0.0.1:port/db", "not a database URL"),
])
def test_a_bad_db_url_or_scheme_is_bad_usage(url, fragment, tmp_path):
    done = run_okconsole("--db", url, "stats", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert fragment in done.stderr and len(done.stderr.strip().splitlines()) == 1
    per_command = cli("stats", "--db", url)
    assert per_command.exit_code == 2 and fragment in per_command.stderr


def test_db_takes_a_plain_file_path(sqlite_url, tmp_path):
    Shop().populate(sqlite_url)
    path = Path(sqlite_url.split(":///", 1)[1])
    assert sqlite_url == f"sqlite+aiosqlite:///{path}" and str(path).startswith("/")  # four slashes in all
    relative = os.path.relpath(path, tmp_path)
    for given in (str(path), relative, f"./{relative}" if not relative.startswith(".") else relative):
        done = run_okconsole("--db", given, "stats", "--json", cwd=tmp_path)
        assert done.returncode == 0, (given, done.stderr)
        assert "shop.email" in {r["signal"] for r in json.loads(done.stdout)}
    via_env = run_okconsole("stats", "--json", cwd=tmp_path, env={"OKE_DATABASE_URL": str(path)})
    assert via_env.returncode == 0, via_env.stderr
    odd_user = cli("--db", "~no-such-user-0/shop.db", "stats")  # a "~user" that does not exist is a name
    assert odd_user.exit_code == 1 and "no store at" in odd_user.stderr and "~no-such-user-0" in odd_user.stderr
    missing = run_okconsole("--db", "./no-such.db", "stats", cwd=tmp_path)
    assert missing.returncode == 1 and str(tmp_path / "no-such.db") in missing.stderr
    assert not (tmp_path / "no-such.db").exists()


def test_replay_of_messages_that_are_not_dead_names_them_and_changes_nothing(db_url):
    shop = Shop()
    ids = shop.populate(db_url)
    result = cli("--db", db_url, "replay", "shop.email", ids["good"], ids["bad1"], "--yes")
    assert result.exit_code == 2 and result.stdout == ""
    assert f"{ids['good']} is delivered, not dead" in result.stderr and ids["bad1"] not in result.stderr
    dry = cli("--db", db_url, "replay", "shop.email", ids["good"], "--dry-run")
    assert dry.exit_code == 2 and "is delivered" in dry.stderr
    assert json.loads(cli("--db", db_url, "show", ids["bad1"], "--json").stdout)["status"] == "dead"
    assert json.loads(cli("--db", db_url, "audit", "--json").stdout) == []


def _sigint_as_in_a_terminal() -> None:
    """The child gets Ctrl-C as a user's terminal delivers it: a suite started in the background by
    a non-interactive shell (`... &`) ignores SIGINT, and a child would inherit that and never stop."""
    os_signal.signal(os_signal.SIGINT, os_signal.SIG_DFL)


def test_ctrl_c_during_tail_exits_130(sqlite_url, tmp_path):
    import engine

    engine.reset()
    tape = signal.live("ticks", optional=True)

    async def emit() -> None:
        async with oke("ticker", database_url=sqlite_url, bindings=[]) as oke_app:
            for n in range(3):
                await oke_app.emit(tape, {"n": n})
    asyncio.run(emit())
    proc = subprocess.Popen([*okconsole_cmd(), "--db", sqlite_url, "tail", "ticks", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            preexec_fn=_sigint_as_in_a_terminal)
    try:
        backlog = [json.loads(proc.stdout.readline())["data"]["n"] for _ in range(3)]  # it is following now
        proc.send_signal(os_signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert backlog == [0, 1, 2]
    assert proc.returncode == 130, err
    assert "Traceback" not in err


def test_ctrl_c_while_waiting_for_a_server_exits_130(silent_server, tmp_path):
    proc = subprocess.Popen([*okconsole_cmd(), "tail", "ticks", "--url", f"http://127.0.0.1:{silent_server}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            preexec_fn=_sigint_as_in_a_terminal,
                            env={**os.environ, "OKE_NETWORK_TIMEOUT": "60"})
    time.sleep(3)  # imported, connected and waiting
    proc.send_signal(os_signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and out == "" and "Traceback" not in err, err
