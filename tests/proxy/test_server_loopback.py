"""Loopback tier: the real server on 127.0.0.1:0, real sockets, every route and every bad input."""

from __future__ import annotations

import json
import os
import random
import socket
import ssl
import struct
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
import trio
import trio.testing
import trustme

from mqproxy.settings import Settings

from ..conftest import read_until_eof  # type: ignore[import-not-found]

pytestmark = pytest.mark.usefixtures("log_sink")


async def _connect(handle: Any) -> trio.SocketStream:
    return await trio.open_tcp_stream(*handle.address)


def _remoting_frame(header: dict[str, Any], body: bytes = b"") -> bytes:
    h = json.dumps(header).encode()
    return struct.pack(">ii", 4 + len(h) + len(body), len(h)) + h + body


async def _http_get(stream: trio.abc.Stream, path: str, close: bool = True) -> bytes:
    conn = "Connection: close\r\n" if close else ""
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n{conn}\r\n".encode())
    if close:
        return await read_until_eof(stream)
    buf = bytearray()
    with trio.fail_after(5):
        while b"\r\n\r\n" not in buf or len(buf.split(b"\r\n\r\n", 1)[1]) < _content_length(buf):
            buf += await stream.receive_some(65536)
    return bytes(buf)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def _closed_events(sink: Any) -> list[dict[str, Any]]:
    return sink.named("conn.closed") + sink.named("conn.rejected")


async def test_healthz_and_404(server: Any, log_sink: Any, wait_for: Any) -> None:
    s = await _connect(server)
    reply = await _http_get(s, "/healthz")
    assert reply.startswith(b"HTTP/1.1 200 ")
    assert reply.endswith(b'{"status":"ok"}')
    s = await _connect(server)
    assert (await _http_get(s, "/nope")).startswith(b"HTTP/1.1 404 ")
    await wait_for(lambda: len(log_sink.named("conn.closed")) == 2)
    negotiated = log_sink.named("conn.negotiated")
    assert [e["protocol"] for e in negotiated] == ["http", "http"]
    assert all(e["tls"] is False and e["sniff_ms"] >= 0 for e in negotiated)
    closed = log_sink.named("conn.closed")[0]
    assert closed["bytes_in"] > 0
    assert closed["bytes_out"] > 0
    assert closed["requests"] == 1
    assert closed["error"] is None
    conn_ids = {e["conn_id"] for e in log_sink.events if e["event"].startswith("conn.")}
    assert len(conn_ids) == 2


async def test_http_keep_alive_serves_two_requests(server: Any) -> None:
    s = await _connect(server)
    first = await _http_get(s, "/healthz", close=False)
    assert first.startswith(b"HTTP/1.1 200")
    second = await _http_get(s, "/healthz", close=True)
    assert second.startswith(b"HTTP/1.1 200")


async def test_metrics_endpoint_counts_connections(server: Any) -> None:
    s = await _connect(server)
    await _http_get(s, "/healthz")
    s = await _connect(server)
    await s.send_all(b"\xff\xfe garbage")
    await read_until_eof(s)
    s = await _connect(server)
    text = (await _http_get(s, "/metrics")).decode()
    assert 'mqproxy_connections_total{protocol="http"}' in text
    assert 'mqproxy_negotiation_failures_total{reason="unknown_protocol"} 1.0' in text


async def test_proxy_protocol_v1_and_v2_set_the_peer(server: Any, log_sink: Any, wait_for: Any) -> None:
    s = await _connect(server)
    await s.send_all(b"PROXY TCP4 203.0.113.7 127.0.0.1 40000 9876\r\n")
    assert (await _http_get(s, "/healthz")).startswith(b"HTTP/1.1 200")
    v2 = (
        b"\r\n\r\n\x00\r\nQUIT\n"
        + bytes([0x21, 0x11])
        + struct.pack(">H", 12)
        + socket.inet_aton("198.51.100.9")
        + socket.inet_aton("127.0.0.1")
        + struct.pack(">HH", 5555, 9876)
    )
    s = await _connect(server)
    await s.send_all(v2)
    assert (await _http_get(s, "/healthz")).startswith(b"HTTP/1.1 200")
    await wait_for(lambda: len(log_sink.named("conn.negotiated")) == 2)
    peers = [(e["peer"], e["proxied"]) for e in log_sink.named("conn.negotiated")]
    assert peers == [("203.0.113.7:40000", True), ("198.51.100.9:5555", True)]


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[trustme.CA, Path, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    return ca, cert_file, key_file


async def test_tls_on_the_same_port(start_server: Any, tls_files: Any, log_sink: Any, wait_for: Any) -> None:
    ca, cert_file, key_file = tls_files
    settings = Settings.for_tests(tls={"cert_file": str(cert_file), "key_file": str(key_file)})
    async with start_server(settings) as handle:
        client_ctx = ssl.create_default_context()
        ca.configure_trust(client_ctx)
        client_ctx.set_alpn_protocols(["http/1.1"])
        raw = await _connect(handle)
        tls = trio.SSLStream(raw, client_ctx, server_hostname="localhost")
        await tls.do_handshake()
        assert tls.selected_alpn_protocol() == "http/1.1"
        assert (await _http_get(tls, "/healthz")).startswith(b"HTTP/1.1 200")
        # garbage after a ClientHello-looking record header: handshake fails, server keeps serving
        s = await _connect(handle)
        await s.send_all(b"\x16\x03\x01\x00\x40\x01" + b"\x00" * 64)
        await read_until_eof(s)
        s = await _connect(handle)
        assert (await _http_get(s, "/healthz")).startswith(b"HTTP/1.1 200")
        await wait_for(lambda: len(log_sink.named("conn.rejected")) == 1)
    negotiated = log_sink.named("conn.negotiated")
    assert negotiated[0]["tls"] is True
    assert negotiated[0]["alpn"] == "http/1.1"
    assert log_sink.named("conn.rejected")[0]["reason"] == "tls_handshake_failed"


async def test_tls_without_certificate_is_rejected(server: Any, log_sink: Any, wait_for: Any) -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    tls = trio.SSLStream(await _connect(server), ctx, server_hostname="localhost")
    with pytest.raises(trio.BrokenResourceError):
        await tls.do_handshake()
    await wait_for(lambda: len(log_sink.named("conn.rejected")) == 1)
    assert log_sink.named("conn.rejected")[0]["reason"] == "tls_not_configured"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "empty_connection"),
        (bytes(random.Random(7).randrange(1, 256) for _ in range(65536)), "unknown_protocol"),
        (b"PROXY TCP4 1.2.3.4", "eof_during_sniff"),
        (b"\x10", "eof_during_sniff"),
    ],
    ids=["empty", "random-64k", "half-proxy-header", "one-byte-then-eof"],
)
async def test_bad_first_bytes_are_rejected_once(
    server: Any, log_sink: Any, wait_for: Any, payload: bytes, reason: str
) -> None:
    s = await _connect(server)
    if payload:
        try:
            await s.send_all(payload)
        except trio.BrokenResourceError:
            pass
    if reason != "unknown_protocol":
        await s.send_eof()
    await read_until_eof(s)
    await wait_for(lambda: len(_closed_events(log_sink)) == 1)
    rejected = log_sink.named("conn.rejected")
    assert len(rejected) == 1
    assert rejected[0]["reason"] == reason
    assert rejected[0]["bytes_in"] <= len(payload)
    s = await _connect(server)
    assert (await _http_get(s, "/healthz")).startswith(b"HTTP/1.1 200")


async def test_silence_and_one_byte_hit_the_sniff_timeout(
    start_server: Any, log_sink: Any, wait_for: Any
) -> None:
    async with start_server(Settings.for_tests(server={"sniff_timeout_s": 0.3})) as handle:
        silent = await _connect(handle)
        one = await _connect(handle)
        await one.send_all(b"\x00")
        assert await read_until_eof(silent) == b""
        assert await read_until_eof(one) == b""
        await wait_for(lambda: len(log_sink.named("conn.rejected")) == 2)
    assert {e["reason"] for e in log_sink.named("conn.rejected")} == {"sniff_timeout"}


async def test_huge_remoting_length_closes_cleanly(server: Any, log_sink: Any, wait_for: Any) -> None:
    s = await _connect(server)
    await s.send_all(struct.pack(">ii", 0x7FFFFFF0, 20) + b'{"code":105,"flag":0}')
    assert await read_until_eof(s) == b""
    await wait_for(lambda: len(_closed_events(log_sink)) == 1)
    (event,) = _closed_events(log_sink)
    assert (event.get("error") or event.get("reason")) == "frame_too_large"


async def test_http_header_of_one_megabyte_gets_431(server: Any, log_sink: Any, wait_for: Any) -> None:
    s = await _connect(server)
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    try:
        await s.send_all(request)
    except trio.BrokenResourceError:
        pass
    reply = await read_until_eof(s)
    assert reply.startswith(b"HTTP/1.1 431 ")
    await wait_for(lambda: len(log_sink.named("conn.closed")) == 1)
    assert log_sink.named("conn.closed")[0]["error"] == "bad_http_request"


async def test_graceful_stop_closes_idle_connections_and_logs(
    start_server: Any, log_sink: Any, wait_for: Any
) -> None:
    async with start_server(Settings.for_tests(server={"shutdown_grace_s": 5.0})) as handle:
        idle = await _connect(handle)
        assert (await _http_get(idle, "/healthz", close=False)).startswith(b"HTTP/1.1 200")
        with trio.fail_after(3):
            handle.stop("test")
            assert await read_until_eof(idle) == b""
    names = [e["event"] for e in log_sink.events]
    assert names.index("proxy.stopping") < names.index("proxy.stopped")
    stopping = log_sink.named("proxy.stopping")[0]
    assert stopping["open_connections"] == 1
    assert stopping["reason"] == "test"
    assert log_sink.named("proxy.stopped")[0]["connections_total"] == 1


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
async def test_thousand_killed_connections_leak_nothing(server: Any, log_sink: Any, wait_for: Any) -> None:
    s = await _connect(server)
    await _http_get(s, "/healthz")
    await wait_for(lambda: server.state.open_connections == 0)
    before = _open_fds()
    payloads = [
        b"",
        b"\x00",
        b"PROXY TCP4",
        b"\x16\x03\x01\x00\x05\x01",
        b"GET /healthz HTTP/1.1\r\n",
        b"\xff" * 100,
    ]
    for i in range(1000):
        sock = await _connect(server)
        if payloads[i % len(payloads)]:
            await sock.send_all(payloads[i % len(payloads)])
        sock.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await sock.aclose()  # RST
    await wait_for(lambda: server.state.open_connections == 0, limit_s=30)
    assert server.state.connections_total == 1001
    assert _open_fds() == before
    assert len(_closed_events(log_sink)) == 1001


async def _remoting_call(
    stream: trio.abc.Stream, header: dict[str, Any], body: bytes = b""
) -> tuple[dict[str, Any], bytes]:
    await stream.send_all(_remoting_frame(header, body))
    buf = bytearray()
    with trio.fail_after(5):
        while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
            buf += await stream.receive_some(65536)
    total, header_len = struct.unpack_from(">ii", buf)
    header_len &= 0xFFFFFF
    return json.loads(buf[8 : 8 + header_len]), bytes(buf[8 + header_len : 4 + total])


async def test_remoting_frame_is_routed_and_answered_as_name_server(
    server: Any, log_sink: Any, wait_for: Any
) -> None:
    s = await _connect(server)
    header, body = await _remoting_call(
        s,
        {
            "code": 105,
            "language": "JAVA",
            "version": 401,
            "opaque": 7,
            "flag": 0,
            "extFields": {"topic": "T1"},
        },
    )
    assert (header["code"], header["opaque"], header["flag"] & 1) == (0, 7, 1)
    route = json.loads(body)
    host, port = server.address
    assert route["brokerDatas"][0]["brokerAddrs"]["0"] == f"{host}:{port}"
    unknown, _ = await _remoting_call(s, {"code": 99999, "opaque": 8, "flag": 0, "extFields": {}})
    assert unknown["code"] == 3
    assert "99999" in unknown["remark"]
    await s.aclose()
    await wait_for(lambda: len(log_sink.named("conn.closed")) == 1)
    requests = log_sink.named("request")
    assert [(r["op"], r["outcome"]) for r in requests] == [
        ("GET_ROUTEINFO_BY_TOPIC", "ok"),
        ("UNKNOWN_99999", "error"),
    ]
    closed = log_sink.named("conn.closed")[0]
    assert closed["protocol"] == "remoting"
    assert closed["requests"] == 2
    assert closed["error"] is None


async def test_graceful_stop_answers_a_held_long_poll_at_once(start_server: Any, log_sink: Any) -> None:
    """A pull held for 20 s when the server stops (grace 10 s) is answered PULL_NOT_FOUND at once, as a
    broker answers its held pulls when it shuts down, instead of being cut when the grace runs out."""
    async with start_server(Settings.for_tests(server={"shutdown_grace_s": 10.0})) as handle:
        s = await _connect(handle)
        await _remoting_call(s, {"code": 105, "opaque": 1, "flag": 0, "extFields": {"topic": "Drain"}})
        pull = {
            "code": 11,
            "opaque": 2,
            "flag": 0,
            "extFields": {
                "consumerGroup": "G",
                "topic": "Drain",
                "queueId": "0",
                "queueOffset": "0",
                "maxMsgNums": "32",
                "sysFlag": "6",
                "commitOffset": "0",
                "suspendTimeoutMillis": "20000",
                "subscription": "*",
                "subVersion": "0",
            },
        }
        await s.send_all(_remoting_frame(pull))
        await trio.testing.wait_all_tasks_blocked()  # the pull is now held by the long poll
        handle.stop("test")
        started = trio.current_time()
        reply = await read_until_eof(s)
        waited = trio.current_time() - started
    total, header_len = struct.unpack_from(">ii", reply)
    header = json.loads(reply[8 : 8 + (header_len & 0xFFFFFF)])
    assert (header["code"], header["opaque"]) == (19, 2)  # PULL_NOT_FOUND, not a cut
    assert len(reply) == 4 + total  # one answer, then a clean close
    assert waited < 5
    closed = log_sink.named("conn.closed")
    assert closed[0]["error"] is None
    assert closed[0]["requests"] == 2


async def test_metrics_report_store_size_and_consumer_lag(server: Any) -> None:
    from mqproxy.facade.api import SendRequest
    from mqproxy.model.types import Message

    broker = server.state.broker
    for _ in range(3):
        message = Message(topic="LagTopic", body=b"0123456789", queue_id=0)
        await broker.send(SendRequest(message, create_queues=1))
    await broker.commit_consumer_offset("GroupA", "LagTopic", 0, 1)
    s = await _connect(server)
    text = (await _http_get(s, "/metrics")).decode()
    assert 'mqproxy_consumer_lag_messages{group="GroupA",topic="LagTopic"} 2.0' in text
    store_line = next(line for line in text.splitlines() if line.startswith("mqproxy_store_bytes "))
    assert float(store_line.split()[1]) >= 30


async def test_mqtt_connect_is_routed_to_the_mqtt_gateway(server: Any, log_sink: Any, wait_for: Any) -> None:
    s = await _connect(server)
    await s.send_all(b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04dev1")
    with trio.fail_after(5):
        connack = await s.receive_some(4)
    assert connack == b"\x20\x02\x00\x00"  # CONNACK, session not present, accepted
    await s.send_all(b"\xe0\x00")  # DISCONNECT
    await read_until_eof(s)
    await wait_for(lambda: len(log_sink.named("conn.closed")) == 1)
    assert log_sink.named("conn.negotiated")[0]["protocol"] == "mqtt"
    assert log_sink.named("conn.closed")[0]["error"] is None


async def test_metrics_report_the_mqtt_gateway(server: Any) -> None:
    mqtt = await _connect(server)
    await mqtt.send_all(b"\x10\x10\x00\x04MQTT\x04\x00\x00\x3c\x00\x04dev1")  # clean session 0
    with trio.fail_after(5):
        assert await mqtt.receive_some(4) == b"\x20\x02\x00\x00"
    await mqtt.send_all(b"\x82\x08\x00\x01\x00\x03a/+\x01")  # SUBSCRIBE a/+ QoS 1
    with trio.fail_after(5):
        assert await mqtt.receive_some(5) == b"\x90\x03\x00\x01\x01"
    s = await _connect(server)
    text = (await _http_get(s, "/metrics")).decode()
    assert 'mqproxy_mqtt_sessions{state="online"} 1.0' in text
    assert 'mqproxy_mqtt_sessions{state="offline"} 0.0' in text
    assert "mqproxy_mqtt_subscriptions 1.0" in text
    assert "mqproxy_mqtt_wildcard_filters 1.0" in text
    assert 'mqproxy_mqtt_read_cache_requests_total{result="miss"}' in text
    assert "mqproxy_mqtt_pushed_deliveries_total 0.0" in text
    await mqtt.send_all(b"\xe0\x00")
    await read_until_eof(mqtt)


async def test_h2_preface_is_routed_to_the_grpc_service(server: Any, log_sink: Any, wait_for: Any) -> None:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    s = await _connect(server)
    await s.send_all(client.data_to_send())
    with trio.fail_after(5):
        events = client.receive_data(await s.receive_some(65536))
    assert any(isinstance(e, h2.events.RemoteSettingsChanged) for e in events)
    await s.aclose()
    await wait_for(lambda: len(log_sink.named("conn.closed")) == 1)
    assert log_sink.named("conn.negotiated")[0]["protocol"] == "grpc"


async def test_rocketmq_send_with_mqtt_topic_reaches_an_mqtt_wildcard_subscriber(server: Any) -> None:
    mqtt = await _connect(server)
    await mqtt.send_all(b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04dev1")
    with trio.fail_after(5):
        assert await mqtt.receive_some(4) == b"\x20\x02\x00\x00"
        await mqtt.send_all(b"\x82\x0a\x00\x01\x00\x05a/+/c\x00")  # SUBSCRIBE a/+/c QoS 0
        assert await mqtt.receive_some(5) == b"\x90\x03\x00\x01\x00"  # SUBACK granted QoS 0
    producer = await _connect(server)
    ext = {
        "a": "PG",
        "b": "a",
        "c": "TBW102",
        "d": "4",
        "e": "0",
        "f": "0",
        "g": "0",
        "h": "0",
        "i": "MQTT_TOPIC\x01a/b/c\x02TAGS\x01t\x02",
        "j": "0",
        "k": "false",
    }
    header, _ = await _remoting_call(
        producer, {"code": 310, "opaque": 1, "flag": 0, "extFields": ext}, b"hello"
    )
    assert header["code"] == 0
    expected = b"\x30\x0c\x00\x05a/b/chello"  # PUBLISH QoS 0, topic a/b/c, payload "hello"
    buf = b""
    with trio.fail_after(5):
        while len(buf) < len(expected):
            buf += await mqtt.receive_some(65536)
    assert buf == expected
