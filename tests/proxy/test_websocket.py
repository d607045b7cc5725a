"""MQTT over WebSocket: the upgrade decision, the stream adapter over memory streams, and loopback runs
(plain and TLS) with a wsproto client speaking raw MQTT packets."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
import trio.testing
import trustme
from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto import ConnectionType, WSConnection
from wsproto.connection import Connection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from mqproxy.codecs.mqtt import Connack, Connect, MqttDecoder, PingReq, PingResp, ReasonCode, encode
from mqproxy.settings import Settings
from mqproxy.websocket import WebSocketStream, upgrade_response

KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # RFC 6455 section 1.3 example


def _headers(**extra: str) -> list[tuple[bytes, bytes]]:
    base = {
        "host": "x",
        "upgrade": "websocket",
        "connection": "keep-alive, Upgrade",
        "sec-websocket-version": "13",
        "sec-websocket-key": KEY,
        "sec-websocket-protocol": "mqtt",
    }
    base.update({k.replace("_", "-"): v for k, v in extra.items()})
    return [(k.encode(), v.encode()) for k, v in base.items() if v]


def test_accept_token_and_subprotocol_are_rfc_6455() -> None:
    status, headers, chosen = upgrade_response(_headers())
    assert (status, chosen) == (101, "mqtt")
    assert ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=") in headers
    assert ("sec-websocket-protocol", "mqtt") in headers
    _, _, chosen = upgrade_response(_headers(sec_websocket_protocol="chat, MQTTv3.1, mqtt"))
    assert chosen == "mqttv3.1"  # the client's first MQTT choice


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        ({"sec_websocket_protocol": ""}, 400),
        ({"sec_websocket_protocol": "chat"}, 400),
        ({"upgrade": ""}, 426),
        ({"connection": "keep-alive"}, 426),
        ({"sec_websocket_version": "8"}, 426),
        ({"sec_websocket_key": "short"}, 400),
        ({"sec_websocket_key": ""}, 400),
    ],
)
def test_upgrade_refusals(extra: dict[str, str], status: int) -> None:
    assert upgrade_response(_headers(**extra))[0] == status


def test_wsproto_client_handshake_is_accepted() -> None:
    client = WSConnection(ConnectionType.CLIENT)
    raw = client.send(Request(host="127.0.0.1", target="/mqtt", subprotocols=["mqtt"]))
    parser = h11.Connection(h11.SERVER)
    parser.receive_data(raw)
    request = parser.next_event()
    assert isinstance(request, h11.Request)
    status, headers, _ = upgrade_response(list(request.headers))
    assert status == 101
    client.receive_data(
        b"HTTP/1.1 101 Switching Protocols\r\n"
        + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers)
        + b"\r\n"
    )
    (accepted,) = list(client.events())
    assert isinstance(accepted, AcceptConnection)
    assert accepted.subprotocol == "mqtt"


# --- the adapter over memory streams -----------------------------------------------------------


def _pair(max_bytes: int = 1024, trailing: bytes = b"") -> tuple[WebSocketStream, Any, Connection]:
    server_side, client_side = trio.testing.memory_stream_pair()
    return WebSocketStream(server_side, trailing, max_bytes), client_side, Connection(ConnectionType.CLIENT)


async def _client_events(stream: Any, ws: Connection) -> list[Any]:
    with trio.fail_after(2):
        ws.receive_data(await stream.receive_some(65536))
    return list(ws.events())


async def test_binary_messages_become_a_byte_stream_at_every_split() -> None:
    client = Connection(ConnectionType.CLIENT)
    wire = client.send(BytesMessage(b"abc")) + client.send(BytesMessage(b"", message_finished=False))
    wire += client.send(BytesMessage(b"de", message_finished=False)) + client.send(BytesMessage(b"f"))
    for cut in range(len(wire) + 1):
        server, peer, _ = _pair(trailing=wire[:cut])
        await peer.send_all(wire[cut:])
        got = b""
        with trio.fail_after(2):
            while len(got) < 6:
                got += await server.receive_some(4)
        assert got == b"abcdef"


async def test_send_all_is_one_binary_message_and_pings_are_answered() -> None:
    server, peer, client = _pair()
    await server.send_all(b"\x20\x02\x00\x00")
    (message,) = await _client_events(peer, client)
    assert isinstance(message, BytesMessage)
    assert message.data == b"\x20\x02\x00\x00"
    await peer.send_all(client.send(Ping(b"hi")) + client.send(BytesMessage(b"x")))
    assert await server.receive_some() == b"x"
    (pong,) = await _client_events(peer, client)
    assert isinstance(pong, Pong)
    assert pong.payload == b"hi"


@pytest.mark.parametrize(
    ("event", "code"),
    [(TextMessage("hello"), 1003), (BytesMessage(b"y" * 1025), 1009)],
    ids=["text", "too_big"],
)
async def test_text_and_oversize_messages_close(event: Any, code: int) -> None:
    server, peer, client = _pair(max_bytes=1024)
    await peer.send_all(client.send(BytesMessage(b"ok")) + client.send(event))
    assert await server.receive_some() == b"ok"
    assert await server.receive_some() == b""
    assert server.close_code == code
    (close,) = await _client_events(peer, client)
    assert isinstance(close, CloseConnection)
    assert close.code == code
    with pytest.raises(trio.ClosedResourceError):
        await server.send_all(b"late")


async def test_oversize_counts_fragments_of_one_message() -> None:
    server, peer, client = _pair(max_bytes=10)
    await peer.send_all(client.send(BytesMessage(b"123456", message_finished=False)))
    assert await server.receive_some() == b"123456"
    await peer.send_all(client.send(BytesMessage(b"7890X")))
    assert await server.receive_some() == b""
    assert server.close_code == 1009


async def test_unmasked_frame_is_a_protocol_error() -> None:
    server, peer, _ = _pair()
    await peer.send_all(b"\x82\x01x")  # a client frame must be masked
    assert await server.receive_some() == b""
    assert server.close_code == 1002


async def test_peer_close_is_echoed_and_ends_reads() -> None:
    server, peer, client = _pair()
    await peer.send_all(client.send(CloseConnection(1001, "bye")))
    assert await server.receive_some() == b""
    (echo,) = await _client_events(peer, client)
    assert isinstance(echo, CloseConnection)
    assert echo.code == 1001
    assert server.close_code is None


async def test_finish_sends_normal_close_and_waits_for_the_answer() -> None:
    server, peer, client = _pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.finish)
        (close,) = await _client_events(peer, client)
        assert isinstance(close, CloseConnection)
        assert close.code == 1000
        await peer.send_all(client.send(close.response()))
    assert server.close_code == 1000


def _binary_payload(wire: bytes) -> bytes:
    """The payload of the binary frames a server reads from ``wire`` before a text frame, a close or a
    framing error: random "garbage" can hold a valid frame too."""
    ws = Connection(ConnectionType.SERVER)
    ws.receive_data(wire)
    payload = b""
    for event in ws.events():
        if isinstance(event, BytesMessage):
            payload += event.data
        elif not isinstance(event, Ping | Pong):
            break
    return payload


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=6), st.binary(max_size=120))
def test_garbage_after_valid_frames_never_raises_or_hangs(payloads: list[bytes], garbage: bytes) -> None:
    async def scenario() -> None:
        server, peer, client = _pair(max_bytes=64)
        wire = b"".join(client.send(BytesMessage(p)) for p in payloads) + garbage
        await peer.send_all(wire)
        await peer.send_stream.aclose()
        got = b""
        with trio.fail_after(2):
            while chunk := await server.receive_some(7):
                got += chunk
        assert _binary_payload(wire).startswith(got)  # only real payload, in order
        if not garbage:
            assert got == b"".join(payloads)

    trio.run(scenario)


# --- loopback through the server ---------------------------------------------------------------


class WsMqttClient:
    """A wsproto client on a trio stream that sends and receives MQTT packets in binary messages."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.decoder = MqttDecoder(1 << 20, protocol_level=5)
        self.events: list[Any] = []

    async def handshake(self, target: str = "/mqtt", subprotocols: tuple[str, ...] = ("mqtt",)) -> Any:
        await self.stream.send_all(
            self.ws.send(Request(host="127.0.0.1", target=target, subprotocols=list(subprotocols)))
        )
        return await self.next_event()

    async def next_event(self) -> Any:
        with trio.fail_after(5):
            while not self.events:
                data = await self.stream.receive_some(65536)
                self.ws.receive_data(data or None)
                self.events.extend(self.ws.events())
        return self.events.pop(0)

    async def send(self, packet: Any) -> None:
        await self.stream.send_all(self.ws.send(BytesMessage(encode(packet, 5))))

    async def receive(self) -> Any:
        event = await self.next_event()
        assert isinstance(event, BytesMessage), event
        (packet,) = self.decoder.receive_data(event.data)
        return packet


async def _mqtt_round_trip(client: WsMqttClient, target: str) -> None:
    accepted = await client.handshake(target)
    assert isinstance(accepted, AcceptConnection)
    assert accepted.subprotocol == "mqtt"
    await client.send(Connect("ws-client", 5))
    connack = await client.receive()
    assert isinstance(connack, Connack)
    assert connack.reason_code == ReasonCode.SUCCESS
    await client.send(PingReq())
    assert isinstance(await client.receive(), PingResp)
    await client.stream.send_all(client.ws.send(CloseConnection(1000)))
    close = await client.next_event()
    assert isinstance(close, CloseConnection)


@pytest.mark.parametrize("target", ["/mqtt", "/"])
async def test_mqtt_over_websocket_loopback(server: Any, log_sink: Any, wait_for: Any, target: str) -> None:
    stream = await trio.open_tcp_stream(*server.address)
    await _mqtt_round_trip(WsMqttClient(stream), target)
    await stream.aclose()
    await wait_for(lambda: len(log_sink.named("conn.closed")) == 1)
    (negotiated,) = log_sink.named("conn.negotiated")
    (closed,) = log_sink.named("conn.closed")
    assert negotiated["protocol"] == "http"
    assert closed["protocol"] == "mqtt"
    assert closed["error"] is None
    ops = [(e["protocol"], e["op"], e["code"]) for e in log_sink.named("request")]
    assert ops[0] == ("http", f"GET {target}", 101)
    assert ("mqtt", "CONNECT") in [(p, op) for p, op, _ in ops]
    assert server.state.metrics.connections_open.labels("mqtt")._value.get() == 0
    assert server.state.metrics.connections_open.labels("http")._value.get() == 0


async def test_upgrade_without_mqtt_subprotocol_is_refused(server: Any, log_sink: Any, wait_for: Any) -> None:
    stream = await trio.open_tcp_stream(*server.address)
    client = WsMqttClient(stream)
    rejected = await client.handshake(subprotocols=("chat",))
    assert isinstance(rejected, RejectConnection)
    assert rejected.status_code == 400
    body = await client.next_event()
    assert isinstance(body, RejectData)
    await wait_for(lambda: len(log_sink.named("conn.closed")) == 1)
    assert log_sink.named("conn.closed")[0]["error"] == "websocket_refused"
    plain = await trio.open_tcp_stream(*server.address)
    await plain.send_all(b"GET /mqtt HTTP/1.1\r\nhost: x\r\n\r\n")
    with trio.fail_after(5):
        assert (await plain.receive_some(4096)).startswith(b"HTTP/1.1 426 ")


async def test_oversize_message_closes_with_1009(start_server: Any, log_sink: Any, wait_for: Any) -> None:
    async with start_server(Settings.for_tests(mqtt={"max_packet_size": 1000})) as handle:
        stream = await trio.open_tcp_stream(*handle.address)
        client = WsMqttClient(stream)
        assert isinstance(await client.handshake(), AcceptConnection)
        await client.send(Connect("big", 5))
        assert isinstance(await client.receive(), Connack)
        await stream.send_all(client.ws.send(BytesMessage(b"\x30" + b"\x00" * 2000)))
        event = await client.next_event()
        assert isinstance(event, CloseConnection)
        assert event.code == 1009
        await stream.send_all(client.ws.send(event.response()))  # completes the close handshake
        with trio.fail_after(1):
            assert await stream.receive_some(10) == b""  # the server then closes the TCP connection
        await wait_for(lambda: len(log_sink.named("conn.closed")) == 1)
    assert log_sink.named("conn.closed")[0]["error"] == "websocket_closed"


@pytest.fixture
def tls_settings(tmp_path: Path) -> tuple[trustme.CA, Settings]:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    return ca, Settings.for_tests(tls={"cert_file": str(cert_file), "key_file": str(key_file)})


async def test_mqtt_over_secure_websocket(
    start_server: Any, tls_settings: Any, log_sink: Any, wait_for: Any
) -> None:
    ca, settings = tls_settings
    async with start_server(settings) as handle:
        context = ssl.create_default_context()
        ca.configure_trust(context)
        context.set_alpn_protocols(["http/1.1"])
        raw = await trio.open_tcp_stream(*handle.address)
        tls = trio.SSLStream(raw, context, server_hostname="localhost")
        await tls.do_handshake()
        await _mqtt_round_trip(WsMqttClient(tls), "/mqtt")
        await tls.aclose()
        await wait_for(lambda: len(log_sink.named("conn.closed")) == 1)
    (negotiated,) = log_sink.named("conn.negotiated")
    assert negotiated["tls"] is True
    assert log_sink.named("conn.closed")[0]["protocol"] == "mqtt"
