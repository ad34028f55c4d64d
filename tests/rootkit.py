"""What the fault tests that need root share: the root gate and running system commands.

Mounting filesystems and building network namespaces need root. Locally such a test skips when it
is not root (or a tool is missing); with CI=true it fails instead, since CI runs as root and
installs the tools (.ci/run).
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def require_root(*tools: str) -> None:
    """Skip (locally) or fail (CI=true) unless we are root and every tool is on PATH."""
    missing = [t for t in tools if shutil.which(t) is None]
    reason = ("needs root" if os.geteuid() != 0 else
              f"needs {', '.join(missing)} on PATH" if missing else None)
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"{reason} (CI=true: this test must not be skipped)", pytrace=False)
    pytest.skip(reason)


def sh(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a system command; raise with its stderr when `check` and it fails."""
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc
