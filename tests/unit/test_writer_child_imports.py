"""The SQLite writer child imports only the standard library and the engine's stdlib-only modules.

The child starts under `python -I -S` with empty stand-ins for `engine` and `engine.store`
(engine/store/sqlite/process.py), so a third-party import would make every SQLite app fail at its
first write, and an import of the engine's heavier modules would slow its start. This loads the
child's module the way the launcher does and lists every module it brought in."""

from __future__ import annotations

import json
import subprocess
import sys

from engine.store.sqlite.process import ENGINE_DIR

PROBE = """\
import json, sys, types
before = set(sys.modules)
for name, where in (("engine", ""), ("engine.store", "/store"), ("engine.store.sqlite", "/store/sqlite")):
    package = types.ModuleType(name)
    package.__path__ = [sys.argv[1] + where]
    sys.modules[name] = package
import engine.store.sqlite.child
print(json.dumps(sorted(set(sys.modules) - before)))
"""
# the engine's modules the child may use: each imports only the standard library and these
ENGINE_STDLIB_ONLY = {
    "engine",
    "engine.errors",
    "engine.ids",
    "engine.store",
    "engine.store.sql",
    "engine.store.sqlite",
    "engine.store.sql.claim",
    "engine.store.sql.enqueue",
    "engine.store.sql.gates",
    "engine.store.sql.settle",
    "engine.store.sqlite.child",
    "engine.store.sqlite.file",
    "engine.store.sqlite.tx",
    "engine.store.sqlite.wire",
    "engine.store.sqlite.walsync",
}


def imported_by_the_child() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PROBE, str(ENGINE_DIR)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_writer_child_imports_only_the_standard_library_and_stdlib_only_engine_modules():
    modules = imported_by_the_child()
    engine = {m for m in modules if m == "engine" or m.startswith("engine.")}
    others = {m.split(".")[0] for m in modules} - {"engine"}
    assert engine <= ENGINE_STDLIB_ONLY, f"the child imports {sorted(engine - ENGINE_STDLIB_ONLY)}"
    assert others <= set(sys.stdlib_module_names), (
        f"not the standard library: {sorted(others - set(sys.stdlib_module_names))}"
    )
    assert "engine.store.sqlite.child" in engine  # the probe loaded what the launcher loads
