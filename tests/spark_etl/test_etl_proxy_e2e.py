"""End to end: run the real proxy, drive its protocols, then run the batch job on its own log file and
check the tables count exactly what was sent."""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ..conftest import serve_proxy, wait_proxy_started  # type: ignore[import-not-found]

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

SENDS = 5
HEALTH_CHECKS = 3
GARBAGE_CONNECTIONS = 2
MQTT_PUBLISHES = 4


def _frame(header: dict[str, Any], body: bytes = b"") -> bytes:
    h = json.dumps(header).encode()
    return struct.pack(">ii", 4 + len(h) + len(body), len(h)) + h + body


def _read_frame(sock: socket.socket) -> dict[str, Any]:
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
        chunk = sock.recv(65536)
        assert chunk, "proxy closed the remoting connection"
        buf += chunk
    header_len = struct.unpack_from(">i", buf, 4)[0] & 0xFFFFFF
    return json.loads(buf[8 : 8 + header_len])


def _drive_mqtt(addr: tuple[str, int]) -> None:
    """One MQTT 3.1.1 client: CONNECT, MQTT_PUBLISHES QoS 1 publishes (the first alone, the rest in one
    write: a run logged as one ``request.run``), each PUBACKed, DISCONNECT."""
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04etl1")
        assert s.recv(4) == b"\x20\x02\x00\x00"
        packets = []
        for i in range(1, MQTT_PUBLISHES + 1):
            topic, payload = b"etl/dev", b"reading-%d" % i
            body = struct.pack(">H", len(topic)) + topic + struct.pack(">H", i) + payload
            packets.append(bytes([0x32, len(body)]) + body)
        for first, last in ((1, 1), (2, MQTT_PUBLISHES)):
            s.sendall(b"".join(packets[first - 1 : last]))
            expected = b"".join(b"\x40\x02" + struct.pack(">H", i) for i in range(first, last + 1))
            got = b""
            while len(got) < len(expected):
                got += s.recv(len(expected) - len(got)) or b"!"  # PUBACKs, in order
            assert got == expected
        s.sendall(b"\xe0\x00")


def _drive_grpc(addr: tuple[str, int]) -> None:
    """One gRPC QueryRoute call over h2c, answered with a v2 status OK."""
    import h2.config
    import h2.connection
    import h2.events

    from mqproxy.codecs import rocketmq_v2 as v2
    from mqproxy.codecs.grpc_framing import encode_message

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    request = v2.QueryRouteRequest(topic=v2.Resource(name="EtlTopic"))
    stream_id = conn.get_next_available_stream_id()
    conn.send_headers(
        stream_id,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":authority", f"{addr[0]}:{addr[1]}"),
            (":path", "/apache.rocketmq.v2.MessagingService/QueryRoute"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("x-mq-client-id", "etl-grpc"),
        ],
    )
    conn.send_data(stream_id, encode_message(request.SerializeToString()), end_stream=True)
    data, trailers = b"", None
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(conn.data_to_send())
        while trailers is None:
            chunk = s.recv(65536)
            assert chunk, "gRPC connection closed before the trailers"
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.DataReceived):
                    data += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
                elif isinstance(event, h2.events.TrailersReceived):
                    trailers = dict(event.headers)
            s.sendall(conn.data_to_send())
    assert trailers[b"grpc-status"] == b"0"
    response = v2.QueryRouteResponse.FromString(data[5:])
    assert response.status.code == v2.Code.OK


def _drive(addr: tuple[str, int]) -> None:
    for _ in range(HEALTH_CHECKS):
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
    for _ in range(GARBAGE_CONNECTIONS):
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(b"\xffgarbage\xfe")
            assert s.recv(65536) == b""
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(_frame({"code": 105, "opaque": 1, "flag": 0, "extFields": {"topic": "EtlTopic"}}))
        assert _read_frame(s)["code"] == 0
        for i in range(SENDS):
            ext = {
                "a": "EtlProducers",
                "b": "EtlTopic",
                "c": "TBW102",
                "d": "4",
                "e": "0",
                "f": "0",
                "g": str(int(time.time() * 1000)),
                "h": "0",
                "i": "TAGS\x01t\x02",
                "j": "0",
                "k": "false",
            }
            s.sendall(_frame({"code": 310, "opaque": 10 + i, "flag": 0, "extFields": ext}, b"body-%d" % i))
            assert _read_frame(s)["code"] == 0
    _drive_mqtt(addr)
    _drive_grpc(addr)


def test_batch_job_counts_what_the_proxy_served(spark: Any, tmp_path: Path) -> None:
    from mqproxy.spark_etl.batch import run_batch

    log = tmp_path / "logs" / "mqproxy.log"
    proc = serve_proxy(tmp_path / "data", stdout=subprocess.DEVNULL, env={"MQPROXY_LOG_FILE": str(log)})
    try:
        _drive(wait_proxy_started(proc, log))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    out = tmp_path / "tables"
    summary = run_batch(spark, str(log.parent), str(out))
    assert summary.malformed == 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert summary.valid_events == len(lines)
    runs = [e for e in lines if e["event"] == "request.run" and e["op"] == "PUBLISH"]
    assert [r["count"] for r in runs] == [MQTT_PUBLISHES - 1]  # expanded below: one row per PUBLISH

    connections = spark.read.parquet(str(out / "connections"))
    by_protocol = {r["protocol"]: r["count"] for r in connections.groupBy("protocol").count().collect()}
    assert by_protocol.get("http") == HEALTH_CHECKS
    assert by_protocol.get("remoting") == 1
    assert by_protocol.get("mqtt") == 1
    assert by_protocol.get("grpc") == 1

    failures = spark.read.parquet(str(out / "negotiation_failures")).collect()
    assert sum(r["failures"] for r in failures) == GARBAGE_CONNECTIONS
    assert {r["reason"] for r in failures} == {"unknown_protocol"}

    requests = spark.read.parquet(str(out / "requests"))
    sends = requests.where((requests.protocol == "remoting") & (requests.op == "SEND_MESSAGE_V2")).collect()
    assert len(sends) == SENDS
    assert all(
        r["outcome"] == "ok" and r["topic"] == "EtlTopic" and r["group"] == "EtlProducers" for r in sends
    )
    health = requests.where(requests.protocol == "http").count()
    assert health == HEALTH_CHECKS
    publishes = requests.where((requests.protocol == "mqtt") & (requests.op == "PUBLISH")).count()
    assert publishes == MQTT_PUBLISHES
    routes = requests.where((requests.protocol == "grpc") & (requests.op == "QueryRoute")).collect()
    assert [(r["outcome"], r["client_id"]) for r in routes] == [("ok", "etl-grpc")]
