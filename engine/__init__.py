"""okengine: an embedded job and event engine on SQLite or PostgreSQL.

`oke` and `OkeApp` load on first use (PEP 562): a program that only reads the store through
`engine.ops`, such as `okconsole stats`, starts without the HTTP server and the worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .clocks import clock
from .errors import LeaseLost, OkeError, StoreUnavailable
from .flows import flow, forget_bindings, on
from .fx import Fx
from .http import Forbidden, Unauthorized, gate, http
from .signals import Signal, forget_declarations, signal

if TYPE_CHECKING:
    from .app import OkeApp, oke

__all__ = [
    "Forbidden",
    "Fx",
    "LeaseLost",
    "OkeApp",
    "OkeError",
    "Signal",
    "StoreUnavailable",
    "Unauthorized",
    "clock",
    "flow",
    "gate",
    "http",
    "oke",
    "on",
    "reset",
    "signal",
]


def __getattr__(name: str) -> Any:
    if name in ("OkeApp", "oke"):
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


def reset() -> None:
    """Forget every binding and declaration made in this process (tests)."""
    forget_bindings()
    forget_declarations()
