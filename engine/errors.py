"""The catalogue of OKE error codes: one table, nothing scattered.

Every engine error a user can meet is an `OkeError` whose text starts with
`OKE<code>`, so logs and scripts can grep for it.
"""

from __future__ import annotations

from typing import Any

BIND_A_FLOW = "Bind a flow with on(signal, ...)"  # OKE1240's remedy for a once or broadcast signal
MOUNT_AN_EXPOSURE = (  # and for a live one: its subscribers are exposures; on(signal, ...) is refused at boot
    'Mount an exposure with on(http.live(signal).gate(...)) or on(http.get("/path").gate(...).live(signal))'
)

# code -> (cause template, fix)
CATALOGUE: dict[int, tuple[str, str]] = {
    1001: (
        'Flow "{flow}" reads "signal:{name}" without declaring it.',
        'Add "signal:{name}" to the flow\'s effects={{"reads": [...]}}.',
    ),
    1041: ('{method} {path} is bound twice (flow "{flow}").', "Bind each method and path once."),
    1050: (
        'Live signal "{signal}" is exposed twice with the same gates ({gates}) and match ({match}).',
        "Give the second exposure other gates or a match, or remove it.",
    ),
    1071: (
        'Once signal "{signal}" is bound to more than one Flow ({flows}).',
        "Use signal.broadcast if each flow should independently receive this event, or bind only one "
        "flow if these should compete for the same work.",
    ),
    1072: ('A signal flow on "{trigger}" has no name.', 'Give the flow a name: flow("workers.something", ...).'),
    1210: ('Cursor "{afterId}" missing on "{signal}".', "Reconnect without Last-Event-ID to replay the retained tape."),
    1240: (
        'Flow "{flow}" emits signal "{resource}" with no subscriber.',
        "{bind} or declare the signal with optional=True.",
    ),
    1250: ('"{resource}": {detail}', "Emit a payload that matches the signal's schema."),
}


class OkeError(Exception):
    """An engine error with a stable numeric code, a cause and a fix."""

    def __init__(self, code: int, cause: str, fix: str = "", data: dict[str, Any] | None = None) -> None:
        self.code = code
        self.cause = cause
        self.fix = fix
        self.data = dict(data or {})
        super().__init__(self.__str__())

    def __str__(self) -> str:
        text = f"OKE{self.code}: {self.cause}"
        return f"{text} Fix: {self.fix}" if self.fix else text

    @classmethod
    def of(cls, code: int, **fields: Any) -> OkeError:
        """Build the catalogued error `code`, filling its templates from `fields`."""
        cause, fix = CATALOGUE[code]
        return cls(code, cause.format(**fields), fix.format(**fields), data=fields)


class StoreUnavailable(RuntimeError):
    """The database cannot be reached; the message says which and why, in one line."""


class SchemaTooNew(RuntimeError):
    """The store was created by a newer okengine than this one."""


class LeaseLost(RuntimeError):
    """`fx.extend_lease()` found the message reclaimed by another holder: this attempt's outcome
    will not be recorded, so the handler should stop its work."""

    code = "LeaseLost"


class HandlerTimeout(TimeoutError):
    """A handler ran past its flow's `timeout`: it was cancelled and the attempt failed."""

    code = "Timeout"
