"""HTTP routes, gates and the SSE server."""

from __future__ import annotations

from .routes import Forbidden, Gate, HttpError, Route, Unauthorized, gate, http

__all__ = ["Forbidden", "Gate", "HttpError", "Route", "Unauthorized", "gate", "http"]
