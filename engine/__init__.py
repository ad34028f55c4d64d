"""okengine: an embedded job and event engine on SQLite or PostgreSQL."""

from __future__ import annotations

from .app import OkeApp, oke
from .clocks import clock
from .errors import LeaseLost, OkeError, StoreUnavailable
from .flows import flow, forget_bindings, on
from .fx import Fx
from .http import Forbidden, Unauthorized, gate, http
from .signals import Signal, forget_declarations, signal

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


def reset() -> None:
    """Forget every binding and declaration made in this process (tests)."""
    forget_bindings()
    forget_declarations()
