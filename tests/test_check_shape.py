"""tools/check_shape.py, the function-length check CI runs: run as a command on files it writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "check_shape.py"


def run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def function(name: str, lines: int, indent: str = "", keyword: str = "def") -> str:
    """Source of a function exactly `lines` lines long (its def line included)."""
    body = [f"{indent}    x{i} = {i}" for i in range(lines - 2)] + [f"{indent}    return None"]
    return "\n".join([f"{indent}{keyword} {name}() -> None:", *body]) + "\n"


def test_a_function_of_exactly_the_limit_passes_and_one_line_more_fails(tmp_path: Path) -> None:
    ok = tmp_path / "ok.py"
    ok.write_text(function("sixty", 60))
    assert run(ok).returncode == 0

    long = tmp_path / "long.py"
    long.write_text("import os\n\n\n" + function("sixty_one", 61))
    result = run(long)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [f"{long}:4: sixty_one is 61 lines (limit 60)"]


def test_methods_nested_and_async_functions_are_named_by_their_qualified_names(tmp_path: Path) -> None:
    source = (
        "class Hub:\n"
        + function("run", 70, indent="    ", keyword="async def")
        + "\n\ndef outer() -> None:\n"
        + function("inner", 62, indent="    ")
        + "    return None\n"
    )
    path = tmp_path / "mod.py"
    path.write_text(source)
    lines = run(path).stdout.splitlines()
    # outer holds inner (62 lines) plus its own def and return: 64 lines, reported too
    assert lines == [
        f"{path}:2: Hub.run is 70 lines (limit 60)",
        f"{path}:74: outer is 64 lines (limit 60)",
        f"{path}:75: outer.inner is 62 lines (limit 60)",
    ]


def test_directories_are_walked_and_the_limit_can_be_set(tmp_path: Path) -> None:
    package = tmp_path / "pkg" / "sub"
    package.mkdir(parents=True)
    (package / "a.py").write_text(function("eleven", 11))
    (package / "b.py").write_text(function("ten", 10))
    result = run("--max-lines", "10", tmp_path / "pkg")
    assert result.returncode == 1
    assert result.stdout.splitlines() == [f"{package / 'a.py'}:1: eleven is 11 lines (limit 10)"]
    assert "1 problem(s)" in result.stderr
    assert run("--max-lines", "11", tmp_path / "pkg").returncode == 0


def test_a_file_that_does_not_parse_fails_the_check_with_its_name(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n    pass\n")
    result = run(broken)
    assert result.returncode == 1
    assert result.stdout.startswith(f"{broken}: cannot be checked (SyntaxError")


def test_bad_arguments_are_refused_with_a_message(tmp_path: Path) -> None:
    missing = run(tmp_path / "nowhere")
    assert missing.returncode == 2
    assert "no such file or directory" in missing.stderr
    zero = run("--max-lines", "0", tmp_path)
    assert zero.returncode == 2
    assert "--max-lines must be at least 1" in zero.stderr


def test_without_paths_it_checks_engine_and_okconsole(tmp_path: Path) -> None:
    (tmp_path / "engine").mkdir()
    (tmp_path / "okconsole").mkdir()
    (tmp_path / "elsewhere.py").write_text(function("ignored", 99))
    (tmp_path / "okconsole" / "cli.py").write_text(function("main", 61))
    result = run(cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["okconsole/cli.py:1: main is 61 lines (limit 60)"]
