"""Live Prometheus metrics, served by ``GET /metrics`` on the shared port.

One :class:`Metrics` per server (its own registry, so tests and embedded servers never share
counters). The connection pipeline and protocol handlers update it; nothing here does I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

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
            "mqproxy_negotiation_failures", "Connections rejected before a protocol was chosen", ["reason"],
            registry=r,
        )
        self.requests = Counter(
            "mqproxy_requests", "Requests handled", ["protocol", "op", "outcome"], registry=r
        )
        self.request_latency = Histogram(
            "mqproxy_request_latency_seconds", "Request latency", ["protocol", "op"],
            buckets=LATENCY_BUCKETS_S, registry=r,
        )
        self.bytes_in = Counter("mqproxy_bytes_received", "Bytes received", ["protocol"], registry=r)
        self.bytes_out = Counter("mqproxy_bytes_sent", "Bytes sent", ["protocol"], registry=r)


def render_metrics(server: ServerState) -> tuple[bytes, str]:
    """The exposition text of ``server``'s registry and its content type."""
    return generate_latest(server.metrics.registry), CONTENT_TYPE_LATEST
