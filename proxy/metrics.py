"""Live Prometheus metrics, served by ``GET /metrics`` on the shared port.

One :class:`Metrics` per server (its own registry, so tests and embedded servers never share
counters). The connection pipeline and protocol handlers update it; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from mqproxy.model.errors import BackendError
from mqproxy.model.properties import REVIVE_GROUP, SCHEDULE_GROUP, TRANSACTION_GROUP

#: Groups the broker services use for their own progress; not consumer lag anyone acts on.
INTERNAL_GROUPS = frozenset({SCHEDULE_GROUP, REVIVE_GROUP, TRANSACTION_GROUP})

if TYPE_CHECKING:
    from mqproxy.context import ServerState

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15, 30)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.connections_open = Gauge(
            "mqproxy_connections_open", "Connections currently open, by protocol", ["protocol"], registry=r
        )
        self.connections_total = Counter(
            "mqproxy_connections", "Connections negotiated, by protocol", ["protocol"], registry=r
        )
        self.negotiation_failures = Counter(
            "mqproxy_negotiation_failures",
            "Connections rejected before a protocol was chosen",
            ["reason"],
            registry=r,
        )
        self.connections_refused = Counter(
            "mqproxy_connections_refused",
            "Connections refused over a connection limit, by reason",
            ["reason"],
            registry=r,
        )
        self.requests = Counter(
            "mqproxy_requests", "Requests handled", ["protocol", "op", "outcome"], registry=r
        )
        self.request_latency = Histogram(
            "mqproxy_request_latency_seconds",
            "Request latency",
            ["protocol", "op"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.bytes_in = Counter("mqproxy_bytes_received", "Bytes received", ["protocol"], registry=r)
        self.bytes_out = Counter("mqproxy_bytes_sent", "Bytes sent", ["protocol"], registry=r)
        self._series: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self.store_bytes = Gauge("mqproxy_store_bytes", "Message data held by the backend", registry=r)
        self.consumer_lag = Gauge(
            "mqproxy_consumer_lag_messages",
            "Messages not yet consumed, by consumer group and topic",
            ["group", "topic"],
            registry=r,
        )

    def watch_mqtt(self, source: Callable[[], _HasStats | None]) -> None:
        """Export the MQTT figures of ``source()`` (read per scrape; None until the service exists)."""
        self.registry.register(_GatewayCollector(source))

    def request_series(self, protocol: str, op: str, outcome: str) -> tuple[Any, Any]:
        """The (counter, latency histogram) children of one request kind, created once and cached
        (``labels()`` takes a lock and builds a key on every call)."""
        key = (protocol, op, outcome)
        series = self._series.get(key)
        if series is None:
            series = (self.requests.labels(protocol, op, outcome), self.request_latency.labels(protocol, op))
            self._series[key] = series
        return series


class _HasStats(Protocol):
    def stats(self) -> dict[str, int]: ...


_GATEWAY_VALUES: tuple[tuple[type[GaugeMetricFamily | CounterMetricFamily], str, str, str], ...] = (
    (GaugeMetricFamily, "mqproxy_mqtt_subscriptions", "MQTT subscriptions of all sessions", "subscriptions"),
    (
        GaugeMetricFamily,
        "mqproxy_mqtt_wildcard_filters",
        "Distinct wildcard filters in the index",
        "wildcard_filters",
    ),
    (GaugeMetricFamily, "mqproxy_mqtt_retained_messages", "Topics holding a retained message", "retained"),
    (
        CounterMetricFamily,
        "mqproxy_mqtt_pushed_deliveries",
        "Deliveries a push hub made to a caught-up subscriber without waking its reader",
        "pushed",
    ),
    (GaugeMetricFamily, "mqproxy_mqtt_push_hubs", "LMQs with a push hub serving parked readers", "push_hubs"),
    (
        GaugeMetricFamily,
        "mqproxy_mqtt_read_cache_bytes",
        "Message bytes held by the read cache",
        "read_cache_bytes",
    ),
)
"""Single-value gateway metrics: family, name, help, and the :meth:`_HasStats.stats` key they report."""


class _GatewayCollector:
    """Reads :meth:`~mqproxy.mqtt.gateway.Gateway.stats` at scrape time; nothing before the first MQTT
    connection creates the gateway."""

    def __init__(self, source: Callable[[], _HasStats | None]) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        service = self._source()
        if service is None:
            return
        stats = service.stats()
        sessions = GaugeMetricFamily("mqproxy_mqtt_sessions", "MQTT sessions held", labels=["state"])
        sessions.add_metric(["online"], stats["sessions_online"])
        sessions.add_metric(["offline"], stats["sessions_offline"])
        yield sessions
        cache = CounterMetricFamily(
            "mqproxy_mqtt_read_cache_requests",
            "Subscriber reads by how the shared read cache served them "
            "(miss and bypass read the store; coalesced waited for another reader's store read)",
            labels=["result"],
        )
        for result in ("hit", "coalesced", "miss", "bypass"):
            cache.add_metric([result], stats[f"read_cache_{result}"])
        yield cache
        for family, name, documentation, key in _GATEWAY_VALUES:
            yield family(name, documentation, value=stats[key])


async def refresh_backend_metrics(server: ServerState) -> None:
    """Update the store-size and consumer-lag gauges from the broker facade (called per scrape). While the
    backend cannot answer (a cluster out of reach) they keep their last values."""
    metrics, backend = server.metrics, server.broker
    if backend is None:
        return  # not open yet
    try:
        store_bytes = await backend.store_bytes()
        offsets = await backend.consumer_offsets()
    except BackendError:
        return
    metrics.store_bytes.set(store_bytes)
    lag: dict[tuple[str, str], int] = {}
    for row in offsets:
        if row.group in INTERNAL_GROUPS:
            continue
        try:
            end = await backend.max_offset(row.topic, row.queue_id)
        except BackendError:
            continue  # the topic or queue went away; no lag to report
        key = (row.group, row.topic)
        lag[key] = lag.get(key, 0) + max(0, end - row.offset)
    metrics.consumer_lag.clear()
    for (group, topic), value in lag.items():
        metrics.consumer_lag.labels(group, topic).set(value)


def render_metrics(server: ServerState) -> tuple[bytes, str]:
    """The exposition text of ``server``'s registry and its content type."""
    return generate_latest(server.metrics.registry), CONTENT_TYPE_LATEST
