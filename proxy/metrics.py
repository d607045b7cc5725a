"""Live Prometheus metrics, served by ``GET /metrics`` on the shared port.

One :class:`Metrics` per server (its own registry, so tests and embedded servers never share
counters). The connection pipeline and protocol handlers update it; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from mqproxy.lag import LagCollector
from mqproxy.lag_sources import INTERNAL_GROUPS, LagRefresher
from mqproxy.model.errors import BackendError

__all__ = [
    "INTERNAL_GROUPS",
    "LATENCY_BUCKETS_S",
    "ConnectionSeries",
    "Metrics",
    "count_bytes",
    "observe_many",
    "refresh_backend_metrics",
    "render_metrics",
]

if TYPE_CHECKING:
    from mqproxy.context import LiveConnection, ServerState
    from mqproxy.settings import MetricsSettings

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
        self._connection_series: dict[str, ConnectionSeries] = {}
        self.auth_denied = Counter(
            "mqproxy_auth_denied",
            "Requests and connections refused by access control, by protocol and reason "
            "(no_access_key, unknown_access_key, bad_signature, throttled, admin_required, no_permission)",
            ["protocol", "reason"],
            registry=r,
        )
        self.trace_records = Counter(
            "mqproxy_trace_records",
            "Message-trace records, by result (written to the trace topic, dropped with the buffer full, "
            "failed to be stored)",
            ["result"],
            registry=r,
        )
        for result in ("written", "dropped", "failed"):
            self.trace_records.labels(result)
        self.store_bytes = Gauge("mqproxy_store_bytes", "Message data held by the backend", registry=r)
        self.lag = LagCollector()
        r.register(self.lag)
        self._lag_refresher: LagRefresher | None = None

    def lag_refresher(self, settings: MetricsSettings) -> LagRefresher:
        """The consumer-lag reader of this registry (made on first use)."""
        if self._lag_refresher is None:
            self._lag_refresher = LagRefresher(self.lag, settings)
        return self._lag_refresher

    def watch_mqtt(self, source: Callable[[], _HasStats | None]) -> None:
        """Export the MQTT figures of ``source()`` (read per scrape; None until the service exists)."""
        self.registry.register(_GatewayCollector(source))

    def watch_store(self, source: Callable[[], object]) -> None:
        """Export the disk and retention figures of the store ``source()`` returns, if it has them."""
        self.registry.register(_StoreCollector(source))

    def count_trace(self, result: str, n: int) -> None:
        """``n`` trace records ``written``, ``dropped`` or ``failed`` (by
        :class:`mqproxy.trace.TraceDispatcher`)."""
        self.trace_records.labels(result).inc(n)

    def count_auth_denied(self, protocol: str, reason: str) -> None:
        """One refusal by access control (``AclHolder.on_denied``)."""
        self.auth_denied.labels(protocol, reason).inc()

    def request_series(self, protocol: str, op: str, outcome: str) -> tuple[Any, Any]:
        """The (counter, latency histogram) children of one request kind, created once and cached
        (``labels()`` takes a lock and builds a key on every call)."""
        key = (protocol, op, outcome)
        series = self._series.get(key)
        if series is None:
            series = (self.requests.labels(protocol, op, outcome), self.request_latency.labels(protocol, op))
            self._series[key] = series
        return series

    def connection_series(self, protocol: str) -> ConnectionSeries:
        """The per-protocol children a connection updates (opened, open, bytes in and out), created once
        per protocol and cached: five ``labels()`` calls per connection before."""
        series = self._connection_series.get(protocol)
        if series is None:
            series = self._connection_series[protocol] = ConnectionSeries(
                self.connections_total.labels(protocol),
                self.connections_open.labels(protocol),
                self.bytes_in.labels(protocol),
                self.bytes_out.labels(protocol),
            )
        return series


class ConnectionSeries(NamedTuple):
    """One protocol's connection metrics (children of :class:`Metrics`' labelled families)."""

    opened: Any  # mqproxy_connections_total{protocol}
    open: Any  # mqproxy_connections_open{protocol}
    bytes_in: Any  # mqproxy_bytes_received_total{protocol}
    bytes_out: Any  # mqproxy_bytes_sent_total{protocol}


class _HasStats(Protocol):
    def stats(self) -> dict[str, int]: ...


_STORE_VALUES: tuple[tuple[type[GaugeMetricFamily | CounterMetricFamily], str, str, str], ...] = (
    (
        GaugeMetricFamily,
        "mqproxy_store_disk_used_ratio",
        "Used share of the disk holding the store",
        "disk_used_ratio",
    ),
    (
        GaugeMetricFamily,
        "mqproxy_store_disk_free_bytes",
        "Free bytes of the disk holding the store",
        "disk_free_bytes",
    ),
    (
        GaugeMetricFamily,
        "mqproxy_store_writable",
        "1 while the store accepts new messages, 0 while refusing",
        "writable",
    ),
    (GaugeMetricFamily, "mqproxy_store_segments", "Commit-log segment files kept", "segments"),
    (
        GaugeMetricFamily,
        "mqproxy_store_log_start_offset",
        "Commit-log offset of the oldest record kept (rises as retention deletes segments)",
        "log_start_offset",
    ),
    (CounterMetricFamily, "mqproxy_store_segments_deleted", "Segments retention deleted", "segments_deleted"),
    (
        CounterMetricFamily,
        "mqproxy_store_live_records_moved",
        "Live-state records retention copied to the head before deleting their segment",
        "live_records_moved",
    ),
)


class _StoreCollector:
    """Reads the embedded store's :meth:`disk_stats` at scrape time (nothing for other stores)."""

    def __init__(self, source: Callable[[], object]) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        store = self._source()
        disk_stats = getattr(store, "disk_stats", None)
        if disk_stats is None:
            return
        stats = disk_stats()
        for family, name, documentation, key in _STORE_VALUES:
            yield family(name, documentation, value=stats[key])


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


def count_bytes(metrics: Metrics, live: LiveConnection) -> None:
    """Add what ``live`` moved since it was last counted to ``mqproxy_bytes_received/sent_total`` (under
    its protocol; nothing before one is negotiated). Called per scrape for every open connection and once
    at close, so long-lived connections count as they go and every byte counts once."""
    protocol = live.ctx.protocol
    if protocol is None:
        return
    received, sent = live.wire.bytes_in, live.wire.bytes_out
    if received > live.counted_in:
        metrics.connection_series(protocol).bytes_in.inc(received - live.counted_in)
        live.counted_in = received
    if sent > live.counted_out:
        metrics.connection_series(protocol).bytes_out.inc(sent - live.counted_out)
        live.counted_out = sent


async def refresh_backend_metrics(server: ServerState) -> None:
    """Count the open connections' bytes so far (:func:`count_bytes`), update the store-size gauge from the
    broker facade (per scrape) and the consumer-lag series (when older than ``metrics.lag_refresh_s``,
    :mod:`mqproxy.lag_sources`). While the backend cannot answer (a
    cluster out of reach) they keep their last values."""
    metrics, backend = server.metrics, server.broker
    for live in list(server.live.values()):
        count_bytes(metrics, live)
    if backend is None:
        return  # not open yet
    try:
        metrics.store_bytes.set(await backend.store_bytes())
    except BackendError:
        pass
    await metrics.lag_refresher(server.settings.metrics).refresh(backend)


def render_metrics(server: ServerState) -> tuple[bytes, str]:
    """The exposition text of ``server``'s registry and its content type."""
    return generate_latest(server.metrics.registry), CONTENT_TYPE_LATEST


def observe_many(histogram: Any, amount: float, n: int) -> None:
    """``histogram.observe(amount)`` ``n`` times, in one step where the client library's histogram
    keeps its sum and (non-cumulative) bucket counters as ``prometheus_client`` 0.x does; the exposed
    samples are the same (the sum up to float rounding: ``amount * n`` instead of ``n`` additions)."""
    total = getattr(histogram, "_sum", None)
    buckets = getattr(histogram, "_buckets", None)
    bounds = getattr(histogram, "_upper_bounds", None)
    if total is None or buckets is None or bounds is None:
        for _ in range(n):
            histogram.observe(amount)
        return
    total.inc(amount * n)
    for i, bound in enumerate(bounds):
        if amount <= bound:
            buckets[i].inc(n)
            break
