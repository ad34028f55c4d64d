"""GET /_oke/metrics: this process's view in the Prometheus text format.

Each scrape reads the store once for the gauges every process would agree on (messages by status,
lag, tape heads) and adds what only this process knows: its handler counters and durations, and
its connected live subscribers. Several processes are scraped each on its own; the docs say how to
add them up (docs/operations.md, "Metrics").

The registry is this endpoint's own (one per app), never prometheus_client's global one, so two
apps in one process, or an app beside a user's own metrics, never mix their figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import ops
from ..ops.tapes import tape_heads
from ..store.outage import is_outage
from ..telemetry.handled import OUTCOMES, HandledStats

if TYPE_CHECKING:
    from ..store import Store

STATUSES = ("pending", "inflight", "delivered", "dead")


@dataclass
class StoreView:
    """What one scrape read of the store; `up` is False when it could not be read."""

    up: bool = False
    stats: list[ops.SignalStats] = field(default_factory=list)
    heads: dict[str, int] = field(default_factory=dict)


async def read_store(store: Store) -> StoreView:
    """The store's side of a scrape; an outage leaves it empty (`oke_store_up 0`), not a 500."""
    try:
        return StoreView(True, await ops.stats(store), await tape_heads(store))
    except Exception as err:
        if not is_outage(err):
            raise
        return StoreView()


class OkeCollector(Collector):
    """The oke_* families from the last store read, this process's handlers and subscribers."""

    def __init__(self, handled: HandledStats) -> None:
        self.handled = handled
        self.view = StoreView()
        self.subscribers: dict[str, int] = {}

    def collect(self) -> Iterator[Metric]:
        yield from self._store_families()
        yield from self._handler_families()
        live = GaugeMetricFamily("oke_live_subscribers", "Live streams this process serves now", labels=["signal"])
        for signal, count in sorted(self.subscribers.items()):
            live.add_metric([signal], count)
        yield live

    def _store_families(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("oke_store_up", "1 when this scrape could read the store, else 0")
        up.add_metric([], 1 if self.view.up else 0)
        yield up
        messages = GaugeMetricFamily("oke_messages", "Messages in the store by status", labels=["signal", "status"])
        lag = GaugeMetricFamily(
            "oke_lag_seconds", "Age of the oldest pending message that is due (0 when none)", labels=["signal"]
        )
        for row in self.view.stats:
            if row.kind == "live":
                continue
            for status in STATUSES:
                messages.add_metric([row.signal, status], getattr(row, status))
            lag.add_metric([row.signal], (row.lag_ms or 0) / 1000)
        events = CounterMetricFamily("oke_live_events", "Events appended to the tape (its head)", labels=["signal"])
        for signal, head in sorted(self.view.heads.items()):
            events.add_metric([signal], head)
        yield from (messages, lag, events)

    def _handler_families(self) -> Iterator[Metric]:
        handled = CounterMetricFamily(
            "oke_handled", "Handler runs of this process by outcome", labels=["signal", "flow", "outcome"]
        )
        duration = HistogramMetricFamily(
            "oke_handler_duration_seconds", "Handler run time in this process", labels=["signal", "flow"]
        )
        for counts in self.handled.flows():
            for name, n in zip(OUTCOMES, counts.outcomes, strict=True):
                handled.add_metric([counts.signal, counts.flow, name], n)
            duration.add_metric([counts.signal, counts.flow], counts.cumulative(), counts.seconds)
        yield from (handled, duration)


class MetricsEndpoint:
    """The app's registry and its collector; `scrape` answers one request."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, handled: HandledStats) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = OkeCollector(handled)
        self.registry.register(self.collector)

    async def scrape(self, store: Store, subscribers: dict[str, int]) -> bytes:
        view = await read_store(store)
        # no await between setting the view and generating: concurrent scrapes cannot mix views
        self.collector.view, self.collector.subscribers = view, subscribers
        body: bytes = generate_latest(self.registry)
        return body


def subscriber_counts(live_signals: list[Any], hubs: Any) -> dict[str, int]:
    """Connected streams per exposed live signal in this process (0 for one nobody follows)."""
    out = {s.name: 0 for s in live_signals}
    if hubs is not None:
        for name, hub in hubs.hubs.items():
            out[name] = len(hub.subscribers)
    return out
