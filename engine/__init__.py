"""okengine: an embedded job and event engine on SQLite or PostgreSQL."""
from __future__ import annotations

from .app import OkeApp, oke
from .errors import OkeError, StoreUnavailable
from .flows import flow, forget_bindings, on
from .fx import Fx
from .signals import Signal, forget_declarations, signal

__all__ = ["OkeApp", "OkeError", "StoreUnavailable", "Fx", "Signal", "flow", "oke", "on", "reset", "signal"]


def reset() -> None:
    """Forget every binding and declaration made in this process (tests)."""
    forget_bindings()
    forget_declarations()
