"""``mqproxy_bytes_received_total`` / ``mqproxy_bytes_sent_total`` count an open connection's bytes at each
scrape (a long-lived MQTT connection shows while it lasts), and every byte once: the rest at close."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from ..conftest import read_until_eof  # type: ignore[import-not-found,misc]

pytestmark = pytest.mark.usefixtures("log_sink")

CONNECT = b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04dev1"  # 18 bytes, clean session
CONNACK = b"\x20\x02\x00\x00"
DISCONNECT = b"\xe0\x00"


async def _bytes(server: Any, protocol: str) -> tuple[float, float]:
    """(received, sent) of ``protocol`` on a fresh scrape of ``/metrics``."""
    stream = await trio.open_tcp_stream(*server.address)
    await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    text = (await read_until_eof(stream)).partition(b"\r\n\r\n")[2].decode()
    values = {
        (s.name, s.labels.get("protocol")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return (values.get(("mqproxy_bytes_received_total", protocol), 0.0),
            values.get(("mqproxy_bytes_sent_total", protocol), 0.0))


async def test_open_connections_count_at_each_scrape_and_every_byte_once(
    server: Any, log_sink: Any, wait_for: Any
) -> None:
    mqtt = await trio.open_tcp_stream(*server.address)
    await mqtt.send_all(CONNECT)
    with trio.fail_after(5):
        assert await mqtt.receive_some(4) == CONNACK
    assert await _bytes(server, "mqtt") == (len(CONNECT), len(CONNACK))  # still open
    assert await _bytes(server, "mqtt") == (len(CONNECT), len(CONNACK))  # a second scrape adds nothing
    await mqtt.send_all(DISCONNECT)
    await read_until_eof(mqtt)
    def mqtt_closed() -> list[dict[str, Any]]:
        return [e for e in log_sink.named("conn.closed") if e["protocol"] == "mqtt"]

    await wait_for(mqtt_closed)
    closed = mqtt_closed()[0]
    assert closed["bytes_in"] == len(CONNECT) + len(DISCONNECT)
    assert await _bytes(server, "mqtt") == (closed["bytes_in"], closed["bytes_out"])


def test_connection_series_are_the_labelled_children_made_once_per_protocol() -> None:
    from mqproxy.metrics import Metrics

    metrics = Metrics()
    series = metrics.connection_series("mqtt")
    assert metrics.connection_series("mqtt") is series
    assert series.opened is metrics.connections_total.labels("mqtt")
    assert series.open is metrics.connections_open.labels("mqtt")
    assert series.bytes_in is metrics.bytes_in.labels("mqtt")
    assert series.bytes_out is metrics.bytes_out.labels("mqtt")
    assert metrics.connection_series("remoting").open is not series.open
    series.opened.inc()
    series.open.inc()
    series.open.dec()
    assert metrics.registry.get_sample_value("mqproxy_connections_total", {"protocol": "mqtt"}) == 1
    assert metrics.registry.get_sample_value("mqproxy_connections_open", {"protocol": "mqtt"}) == 0
