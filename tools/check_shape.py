"""Fail when a function is longer than the limit (ruff checks complexity, but has no length rule).

    python tools/check_shape.py [--max-lines 60] [PATH ...]      (default paths: engine okconsole)

A function's length runs from its `def` line to its last line, docstring and comments included,
decorators not; a nested function counts on its own and inside its parent. Each function over the
limit is printed as `path:line: qualified.name is N lines (limit M)`, and the exit code is 1.
A file that does not parse is reported and also fails the check.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PATHS = ("engine", "okconsole")
MAX_LINES = 60


@dataclass(frozen=True)
class Function:
    """One function or method as found in a file."""

    path: Path
    line: int
    name: str  # qualified: Class.method, outer.inner
    lines: int


def python_files(paths: list[Path]) -> Iterator[Path]:
    """The .py files named, and those below the directories named, in a stable order."""
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.py") if p.is_file())
        else:
            yield path


def functions(path: Path, tree: ast.AST) -> Iterator[Function]:
    """Every function in `tree`, nested ones included, with its qualified name and length."""

    def visit(node: ast.AST, prefix: str) -> Iterator[Function]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                end = child.end_lineno if child.end_lineno is not None else child.lineno
                yield Function(path, child.lineno, name, end - child.lineno + 1)
                yield from visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, prefix + child.name + ".")
            else:
                yield from visit(child, prefix)

    return visit(tree, "")


def check(paths: list[Path], max_lines: int) -> list[str]:
    """One line per problem: a function over `max_lines`, or a file that cannot be read or parsed."""
    problems: list[str] = []
    for path in python_files(paths):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as err:
            problems.append(f"{path}: cannot be checked ({type(err).__name__}: {err})")
            continue
        problems.extend(
            f"{fn.path}:{fn.line}: {fn.name} is {fn.lines} lines (limit {max_lines})"
            for fn in functions(path, tree)
            if fn.lines > max_lines
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fail when a function is longer than the limit.")
    parser.add_argument("paths", nargs="*", type=Path, help="files or directories (default: engine okconsole)")
    parser.add_argument("--max-lines", type=int, default=MAX_LINES, help=f"the limit (default {MAX_LINES})")
    args = parser.parse_args(argv)
    if args.max_lines < 1:
        parser.error("--max-lines must be at least 1")
    paths = args.paths or [Path(p) for p in DEFAULT_PATHS]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        parser.error(f"no such file or directory: {', '.join(missing)}")
    problems = check(paths, args.max_lines)
    for line in problems:
        print(line)
    if problems:
        print(f"check_shape: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
