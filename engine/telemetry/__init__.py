"""What a process tells the outside about its runs: handler counters for Prometheus (`metrics.py`,
`handled.py`) and OpenTelemetry spans (`tracing.py`), both fed by one hook the worker calls
around each handler (`hooks.py`)."""

from .handled import HandledStats
from .hooks import RunHooks

__all__ = ["HandledStats", "RunHooks"]
