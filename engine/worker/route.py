"""Which flow handles a queue."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from ..flows import Flow
from ..signals import Signal


@dataclass(frozen=True)
class Route:
    """Which flow handles a queue, and the signal whose schema re-validates the payload."""

    signal: Signal
    flow: Flow
    # Asked once here, not per message: inspect's check is too slow for the hot path.
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.flow.do))
