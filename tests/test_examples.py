"""The examples the docs show, run for real so they cannot rot.

Each script in examples/ runs in a fresh directory on SQLite and on PostgreSQL (OKE_DATABASE_URL)
and must print what the guide says it prints; examples/shop.py is served with the real
`okconsole serve` and answers an order over HTTP and its events over SSE. The docs' inline
Python blocks must at least compile (top-level `await` allowed), and every file it embeds must exist.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from livekit import free_port
from consolekit import wait_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs"

# script -> lines it must print (in this order); "{port}" is filled in for the live example
EXPECTED: dict[str, list[str]] = {
    "quickstart.py": [r"stored msg_\w+", r"attempt 1: mailing ada@example.com: hello"],
    "retries.py": [r"charged 10 to 4242-4242-4242-4242", r"msg_\w+: dead after 3 attempts",
                   r"  attempt 1: CARD_DECLINED: card 4000-0000-0000-0002 declined \(attempt 1\)",
                   r"  attempt 2: CARD_DECLINED: .*", r"  attempt 3: CARD_DECLINED: .*"],
    "broadcast.py": [r"cache: drop mug-01", r"search index: reindex mug-01"],
    "durable_steps.py": [r"attempt 2: receipt for ch_o1 \(42\)", r"the card was charged 1 time\(s\)"],
    "live_tape.py": [r"\w+\.1 paid", r"\w+\.2 packed", r"resumed after \w+\.1 -> \w+\.2 packed"],
}


def _env(db_url: str) -> dict[str, str]:
    return {**os.environ, "OKE_DATABASE_URL": db_url,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_every_example_script_is_checked():
    scripts = {p.name for p in EXAMPLES.glob("*.py")} - {"shop.py"}
    assert scripts == set(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_prints_what_the_guide_says(script: str, db_url: str, tmp_path: Path):
    args = [sys.executable, str(EXAMPLES / script)] + ([str(free_port())] if script == "live_tape.py" else [])
    done = subprocess.run(args, cwd=tmp_path, env=_env(db_url), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(EXPECTED[script]), done.stdout
    for line, pattern in zip(lines, EXPECTED[script]):
        assert re.fullmatch(pattern, line), (pattern, done.stdout)


def test_quickstart_leaves_its_store_in_dot_oke(tmp_path: Path):
    env = {k: v for k, v in _env("").items() if k != "OKE_DATABASE_URL"}
    done = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / ".oke" / "oke.db").is_file()


def test_shop_served_by_okconsole_serve_answers_over_http_and_sse(db_url: str):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "okconsole", "serve", "shop:app", "--port", str(port)],
                              cwd=EXAMPLES, env=_env(db_url), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, stdin=subprocess.DEVNULL)
    try:
        wait_port(port)
        base = f"http://127.0.0.1:{port}"
        auth = {"Authorization": "Bearer shop-token"}
        order = {"orderId": "o1", "customer": "ada", "total_cents": 1250}
        assert httpx.post(f"{base}/orders", json=order, timeout=10).status_code == 401
        placed = httpx.post(f"{base}/orders", json=order, headers=auth, timeout=10)
        assert placed.status_code == 200, placed.text
        assert placed.json()["data"]["orderId"] == "o1"
        bad = httpx.post(f"{base}/orders", json={"customer": "ada"}, headers=auth, timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "BadRequest"
        events = []
        with httpx.stream("GET", f"{base}/orders/o1/events", headers=auth, timeout=30) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[len("data: "):]))
                if len(events) == 2:
                    break
        assert events == [{"orderId": "o1", "status": "paid"}, {"orderId": "o1", "status": "shipped"}]
    finally:
        server.terminate()
        _out, err = server.communicate(timeout=30)
    assert server.returncode in (0, -15), err
    assert f"okconsole serve: shop on http://127.0.0.1:{port}" in err


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M)


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_docs_python_blocks_compile_and_embedded_files_exist(page: str):
    path = DOCS / page
    for block in _python_blocks(path):
        compile(block, f"{page} (python block)", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    for embedded in re.findall(r'--8<-- "([^"]+)"', path.read_text(encoding="utf-8")):
        assert (ROOT / embedded).is_file(), embedded


def test_docs_build_strictly_and_a_broken_link_fails_it(tmp_path: Path):
    """The docs extra's strict build (as .ci/run runs it) passes, and fails on a dead link."""
    pytest.importorskip("mkdocs", reason="pip install -e '.[docs]' to build the docs")

    def build(config: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                               "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)

    built = build(ROOT / "mkdocs.yml")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "reference" / "index.html").is_file()
    broken_docs = tmp_path / "docs"
    shutil.copytree(DOCS, broken_docs)
    with open(broken_docs / "index.md", "a", encoding="utf-8") as page:
        page.write("\n[gone](no-such-page.md)\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text((ROOT / "mkdocs.yml").read_text(encoding="utf-8")
                      .replace("docs_dir: docs", f"docs_dir: {broken_docs}"), encoding="utf-8")
    failed = build(config)
    assert failed.returncode != 0
    assert "no-such-page.md" in failed.stderr


@pytest.mark.parametrize("page", ["README.md", "CONTRIBUTING.md"])
def test_top_level_pages_link_only_to_files_in_the_repository(page: str):
    text = (ROOT / page).read_text(encoding="utf-8")
    outside = "/".join(("..", "shared"))  # the contract folder beside the clone, which users do not have
    assert outside not in text and "/work/shared" not in text
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if target.startswith(("http://", "https://")):
            continue
        assert (ROOT / target).exists(), f"{page} links to {target}, which is not in the repository"
