"""OpenTelemetry spans for runs, only when the `[otel]` extra is installed and a provider is set.

Nothing here imports opentelemetry until someone else has: a process that configured a tracer
provider has imported `opentelemetry.trace` already, so its absence from `sys.modules` answers
"no tracing" for the price of a dict lookup, and an app without the extra never loads it.

The store carries span contexts as W3C `traceparent` strings in the message's `traceparent`
column: `<emitting span>` when emitted inside a span, then `<emitting span>;<last failed attempt>`
once an attempt failed (either part may be empty), so a retry is a child of the emitting run and
a link to the attempt before it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from ..failures import failure_message

TRACER_NAME = "okengine"
API_MODULE = _API = "opentelemetry.trace"  # imported by whoever configures a provider


def _api() -> Any | None:
    """The opentelemetry.trace module when a real tracer provider is configured, else None."""
    api = sys.modules.get(_API)
    if api is None:
        return None
    provider = api.get_tracer_provider()
    if isinstance(provider, (api.ProxyTracerProvider, api.NoOpTracerProvider)):
        return None
    return api


def format_traceparent(span_context: Any) -> str | None:
    if not span_context.is_valid:
        return None
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{int(span_context.trace_flags):02x}"


def parse_traceparent(api: Any, text: str) -> Any | None:
    """A remote SpanContext from `00-<trace>-<span>-<flags>`; None for anything else."""
    parts = text.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    found = api.SpanContext(trace_id, span_id, is_remote=True, trace_flags=api.TraceFlags(flags))
    return found if found.is_valid else None


def current_traceparent() -> str | None:
    """The current span's context as a traceparent, to store with a message emitted now."""
    api = _api()
    if api is None:
        return None
    return format_traceparent(api.get_current_span().get_span_context())


def split_carried(carried: str | None) -> tuple[str, str]:
    """(emitting span, last failed attempt) from the message's column, each "" when absent."""
    if not carried:
        return "", ""
    parent, _, previous = carried.partition(";")
    return parent, previous


@dataclass(slots=True)
class RunSpan:
    """A started run span and the context token that makes it current while the handler runs."""

    span: Any
    token: object
    parent: str

    def end(self, error: BaseException | None) -> str | None:
        """End the span; after a failure, the column value that lets the retry link to it."""
        from opentelemetry import context

        context.detach(self.token)  # type: ignore[arg-type]
        carried = None
        if error is not None:
            api = sys.modules[_API]
            message = failure_message(error)  # an exception whose str() raises still ends its span
            try:
                self.span.record_exception(error)
            except Exception:
                self.span.add_event("exception", {"exception.type": type(error).__name__, "exception.message": message})
            self.span.set_status(api.Status(api.StatusCode.ERROR, f"{type(error).__name__}: {message}"))
            carried = f"{self.parent};{format_traceparent(self.span.get_span_context()) or ''}"
        self.span.end()
        return carried


def start_run(
    flow: str, signal: str, message_id: str, attempt: int, run_id: str, carried: str | None
) -> RunSpan | None:
    """Start `oke.run <flow>` as the current span: a child of the emitting run's span, linked to the
    previous attempt's; None when tracing is off."""
    api = _api()
    if api is None:
        return None
    from opentelemetry import context

    parent_text, previous_text = split_carried(carried)
    parent = parse_traceparent(api, parent_text) if parent_text else None
    previous = parse_traceparent(api, previous_text) if previous_text else None
    # an explicit root when the emit was outside any span: never a child of whatever is current here
    start_in = api.set_span_in_context(api.NonRecordingSpan(parent)) if parent else context.Context()
    span = api.get_tracer(TRACER_NAME).start_span(
        f"oke.run {flow}",
        context=start_in,
        kind=api.SpanKind.CONSUMER,
        links=[api.Link(previous)] if previous else None,
        attributes={"oke.signal": signal, "oke.message_id": message_id, "oke.attempt": attempt, "oke.run_id": run_id},
    )
    token = context.attach(api.set_span_in_context(span))
    return RunSpan(span, token, parent_text)
