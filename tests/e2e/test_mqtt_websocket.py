"""paho-mqtt 2.x over WebSocket (``transport="websockets"``, ws and wss) against the shared port, with and
without credentials; messages cross between WebSocket and plain TCP clients.

The proxy runs in-process (trio); each paho client runs its network loop in a thread.
"""

from __future__ import annotations

import queue
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import trio
import trustme

from mqproxy.mqtt.auth import hash_password
from mqproxy.server import ServerHandle, serve
from mqproxy.settings import Settings

pytestmark = pytest.mark.e2e

V311, V5 = mqtt.MQTTv311, mqtt.MQTTv5


@asynccontextmanager
async def running_server(settings: Settings) -> AsyncIterator[ServerHandle]:
    async with trio.open_nursery() as nursery:
        handle: ServerHandle = await nursery.start(
            lambda task_status: serve(settings, install_signal_handlers=False, task_status=task_status)
        )
        try:
            yield handle
        finally:
            handle.stop("test")


class Client:
    """A paho client; ``rc`` is the CONNACK reason (paho ReasonCode), messages land in ``messages``."""

    def __init__(
        self,
        port: int,
        client_id: str,
        protocol: int,
        transport: str = "websockets",
        credentials: tuple[str, str] | None = None,
        ca: trustme.CA | None = None,
    ) -> None:
        self.paho = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol, transport=transport
        )
        if transport == "websockets":
            self.paho.ws_set_options(path="/mqtt")
        if credentials is not None:
            self.paho.username_pw_set(*credentials)
        if ca is not None:
            context = ssl.create_default_context()
            ca.configure_trust(context)
            self.paho.tls_set_context(context)
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        connected: queue.Queue[Any] = queue.Queue()
        self.paho.on_message = lambda c, u, m: self.messages.put(m)
        self.paho.on_connect = lambda c, u, flags, rc, props: connected.put(rc)
        self.paho.connect("localhost" if ca is not None else "127.0.0.1", port, keepalive=30)
        self.paho.loop_start()
        self.rc = connected.get(timeout=5)

    def subscribe(self, topic: str, qos: int) -> list[int]:
        granted: queue.Queue[list[Any]] = queue.Queue()
        self.paho.on_subscribe = lambda c, u, mid, codes, props: granted.put(codes)
        self.paho.subscribe(topic, qos)
        return [int(getattr(g, "value", g)) for g in granted.get(timeout=5)]

    def publish(self, topic: str, payload: bytes, qos: int) -> None:
        self.paho.publish(topic, payload, qos=qos).wait_for_publish(5)

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


@pytest.mark.parametrize("protocol", [pytest.param(V311, id="v311"), pytest.param(V5, id="v5")])
async def test_paho_websocket_and_tcp_exchange_messages(log_sink: Any, protocol: int) -> None:
    async with running_server(Settings.for_tests()) as handle:
        port = handle.address[1]

        def scenario() -> None:
            ws_sub = Client(port, "ws-sub", protocol)
            assert ws_sub.rc == 0
            assert ws_sub.subscribe("ws/#", 1) == [1]
            tcp_pub = Client(port, "tcp-pub", protocol, transport="tcp")
            tcp_pub.publish("ws/a", b"from tcp", 1)
            big = bytes(range(256)) * 400  # 100 KiB: several WebSocket frames' worth
            ws_pub = Client(port, "ws-pub", protocol)
            ws_pub.publish("ws/b", big, 1)
            first, second = ws_sub.messages.get(timeout=5), ws_sub.messages.get(timeout=5)
            assert (first.topic, first.payload) == ("ws/a", b"from tcp")
            assert (second.topic, second.payload) == ("ws/b", big)
            for client in (ws_sub, tcp_pub, ws_pub):
                client.close()

        await trio.to_thread.run_sync(scenario)
    closed = log_sink.named("conn.closed")
    assert sorted(e["protocol"] for e in closed) == ["mqtt", "mqtt", "mqtt"]
    upgrades = [e for e in log_sink.named("request") if e["protocol"] == "http"]
    assert [e["code"] for e in upgrades] == [101, 101]


async def test_paho_websocket_credentials_and_acl(log_sink: Any) -> None:
    settings = Settings.for_tests(
        mqtt={
            "allow_anonymous": False,
            "users": {"alice": hash_password("wonderland", 1000)},
            "acl": {"alice": {"publish": ["alice/#"], "subscribe": ["alice/#"]}},
        }
    )
    async with running_server(settings) as handle:
        port = handle.address[1]

        def scenario() -> None:
            refused = Client(port, "bad", V5, credentials=("alice", "wrong"))
            assert refused.rc == 0x86
            refused.paho.loop_stop()
            anonymous = Client(port, "anon", V311)
            assert str(anonymous.rc) == "Not authorized"  # 3.1.1 return code 5, as paho names it
            anonymous.paho.loop_stop()
            alice = Client(port, "alice-1", V5, credentials=("alice", "wonderland"))
            assert alice.rc == 0
            assert alice.subscribe("alice/#", 1) == [1]
            assert alice.subscribe("bob/#", 1) == [0x87]
            alice.publish("alice/x", b"mine", 1)
            assert alice.messages.get(timeout=5).payload == b"mine"
            alice.close()

        await trio.to_thread.run_sync(scenario)
    assert [e["error"] for e in log_sink.named("conn.closed")].count("auth_failed") == 2


async def test_paho_secure_websocket(tmp_path: Path, log_sink: Any) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    settings = Settings.for_tests(tls={"cert_file": str(cert_file), "key_file": str(key_file)})
    async with running_server(settings) as handle:
        port = handle.address[1]

        def scenario() -> None:
            client = Client(port, "wss", V5, ca=ca)
            assert client.rc == 0
            assert client.subscribe("secure/#", 2) == [2]
            client.publish("secure/x", b"over wss", 2)
            assert client.messages.get(timeout=5).payload == b"over wss"
            client.close()

        await trio.to_thread.run_sync(scenario)
    (negotiated,) = log_sink.named("conn.negotiated")
    assert negotiated["tls"] is True
    assert log_sink.named("conn.closed")[0]["protocol"] == "mqtt"
