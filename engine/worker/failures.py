"""How a handler's exception is recorded: a code and a message that never raise themselves."""

from __future__ import annotations

from ..errors import OkeError


def failure_code(exc: BaseException) -> str:
    """The exception's string `code` attribute if it has one, else its class name."""
    if isinstance(exc, OkeError):
        return f"OKE{exc.code}"
    try:
        code = getattr(exc, "code", None)
    except Exception:  # a `code` property that raises: fall back to the class name
        code = None
    return code if isinstance(code, str) and code else type(exc).__name__


def failure_message(exc: BaseException) -> str:
    """`str(exc)`, or a stand-in when the exception cannot describe itself."""
    try:
        return str(exc)
    except Exception as err:
        return f"<str() of {type(exc).__name__} failed: {type(err).__name__}>"
