"""The Grafana dashboard (``config/grafana/mqproxy.json``) queries only metrics mqproxy exports: every metric
name in its PromQL (panel targets and template variables) is one the ``/metrics`` of a running in-process
proxy shows, or one the Message Connector's telemetry (``mqproxy connect``) exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio
from prometheus_client.parser import text_string_to_metric_families

from mqproxy.connector.telemetry import ConnectorMetrics
from mqproxy.facade.api import SendRequest
from mqproxy.model.types import Message
from mqproxy.server import ServerHandle, serve
from mqproxy.settings import Settings

DASHBOARD = Path(__file__).resolve().parents[2] / "config" / "grafana" / "mqproxy.json"

#: PromQL words that look like identifiers but are not metric names.
KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
                      "and", "or", "unless", "inf", "nan"})
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w$.])([A-Za-z_:][A-Za-z0-9_:]*)\b(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """Metric names in one PromQL expression (or a Grafana ``label_values(metric, label)`` query)."""
    labels = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*\w+\s*\)\s*", expr)
    if labels:
        return {labels.group(1)}
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGES.sub("", text)
    text = _GROUPING.sub("", text)
    text = re.sub(r"\$\w+", "", text)  # Grafana variables
    return {name for name, call in _IDENT.findall(text) if not call and name not in KEYWORDS}


def test_metric_name_extraction() -> None:
    expr = ("histogram_quantile(0.99, sum by (le, op) "
            '(rate(a_seconds_bucket{x=~"$i",o="by"}[$__rate_interval])))'
            " / on (op) group_left b_total - time() + max without (rule) (c{rule=\"r\"}) offset 5m")
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c"}
    assert metric_names("label_values(mqproxy_connections_open, instance)") == {"mqproxy_connections_open"}


def dashboard_queries(dashboard: dict[str, Any]) -> Iterator[str]:
    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            yield query["query"] if isinstance(query, dict) else query


def exported_names(exposition: str) -> set[str]:
    """Every sample name a family of ``exposition`` has or would have (a labelled family with no child yet
    shows only its HELP/TYPE lines)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(sample.name for sample in family.samples)
        suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                    "summary": ("_sum", "_count", "_created")}.get(family.type, ("",))
        names.update(family.name + suffix for suffix in suffixes)
    return names


async def _proxy_metrics() -> str:
    async with trio.open_nursery() as nursery:
        handle: ServerHandle = await nursery.start(
            lambda task_status: serve(Settings.for_tests(metrics={"lag_refresh_s": 0.0}),
                                      install_signal_handlers=False, task_status=task_status)
        )
        broker = handle.state.broker
        assert broker is not None
        await broker.send(SendRequest(Message(topic="DashTopic", body=b"x", queue_id=0), create_queues=1))
        await broker.commit_consumer_offset("DashGroup", "DashTopic", 0, 0)
        mqtt = await trio.open_tcp_stream(*handle.address)  # one MQTT session: the gateway's families exist
        await mqtt.send_all(b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04dash")
        with trio.fail_after(5):
            assert await mqtt.receive_some(4) == b"\x20\x02\x00\x00"
        http = await trio.open_tcp_stream(*handle.address)
        await http.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = b""
        with trio.fail_after(5):
            while chunk := await http.receive_some(65536):
                raw += chunk
        await mqtt.aclose()
        handle.stop()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return body.decode()


async def test_every_dashboard_metric_is_exported(log_sink: Any) -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queried: set[str] = set()
    for expr in dashboard_queries(dashboard):
        found = metric_names(expr)
        assert found, f"no metric in {expr!r}"
        queried |= found
    exported = exported_names(await _proxy_metrics())
    exported |= exported_names(ConnectorMetrics("dash").render().decode())
    assert not queried - exported, f"queried but not exported: {sorted(queried - exported)}"
    # the dashboard covers what the issue lists: protocols, rates, latency, errors, lag, connector delay
    assert {"mqproxy_connections_open", "mqproxy_requests_total", "mqproxy_request_latency_seconds_bucket",
            "mqproxy_consumer_queue_lag_messages", "mqproxy_consumer_group_lag_messages",
            "mqproxy_connector_replication_delay_seconds_bucket"} <= queried
