"""Fold py-spy's raw (collapsed) stacks into where a process spends its time.

`py-spy record -f raw` writes one line per distinct stack: `frame;frame;...;leaf count`, each frame
`function (file:line)`. We report self time by function, inclusive time by function, and self
time grouped by library (engine, starlette, uvicorn, asyncio, sqlalchemy, sqlite3, ...).
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^:()]+)(?::(?P<line>\d+))?\)$")


def _key(frame: str) -> tuple[str, str]:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip(), ""
    path = m.group("file")
    short = _short(path)
    return f"{m.group('fn')} ({short})", _library(path)


def _short(path: str) -> str:
    for marker in ("/site-packages/", "/work/main/", "/lib/python3."):
        if marker in path:
            tail = path.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "/lib/python3." and "/" in tail else tail
    return path


def _library(path: str) -> str:
    if "/work/main/engine/" in path or path.startswith("engine/"):
        return "engine/" + path.split("engine/", 1)[1].split("/")[0]
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1].split("/")[0]
    if "/lib/python3." in path:
        tail = path.split("/lib/python3.", 1)[1].split("/", 1)[-1]
        return "stdlib:" + tail.split("/")[0].removesuffix(".py")
    return path.rsplit("/", 1)[-1]


def fold(raw_path: Path) -> dict:
    self_fn: Counter[str] = Counter()
    incl_fn: Counter[str] = Counter()
    self_lib: Counter[str] = Counter()
    incl_engine: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in raw_path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f]
        thread = "?"
        for f in frames:
            if f.startswith("thread ("):
                thread = f.partition("): ")[2] or f
        frames = [f for f in frames if not f.startswith(("process ", "thread ("))]
        if not frames:
            continue
        threads[thread] += count
        total += count
        keys = [_key(f) for f in frames]
        leaf_fn, leaf_lib = keys[-1]
        self_fn[leaf_fn] += count
        self_lib[leaf_lib or "?"] += count
        seen = set()
        for fn, lib in keys:
            if fn not in seen:
                seen.add(fn)
                incl_fn[fn] += count
                if lib.startswith("engine/"):
                    incl_engine[fn] += count
    return {"samples": total, "threads": threads.most_common(8), "self": self_fn.most_common(25), "inclusive": incl_fn.most_common(40),
            "libraries": self_lib.most_common(15), "engine_inclusive": incl_engine.most_common(15)}


def render(title: str, folded: dict) -> str:
    total = folded["samples"] or 1
    out = [f"  py-spy: {title} — {folded['samples']} samples"]
    for label, rows in (("samples by thread (py-spy counts a thread blocked in C, e.g. fsync, as active)",
                         folded.get("threads", [])),
                        ("self time by library", folded["libraries"]),
                        ("self time by function", folded["self"][:15]),
                        ("inclusive time, engine frames", folded["engine_inclusive"]),
                        ("inclusive time, all frames", folded["inclusive"][:25])):
        out.append(f"    {label}:")
        out.extend(f"      {100 * n / total:5.1f}%  {name}" for name, n in rows)
    return "\n".join(out)
