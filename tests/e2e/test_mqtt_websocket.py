"""paho-mqtt 2.x over WebSocket (``transport="websockets"``, ws and wss) against the shared port, with and
without credentials; messages cross between WebSocket and plain TCP clients.

The proxy runs in-process (trio); each paho client runs its network loop in a thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from mqproxy.mqtt.auth import hash_password
from mqproxy.settings import Settings

from ..mqtt.conftest import running_server  # type: ignore[import-not-found]
from .paho_driver import PROTOCOLS, V5, V311, PahoClient  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e
WS = "websockets"


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_paho_websocket_and_tcp_exchange_messages(log_sink: Any, protocol: int) -> None:
    async with running_server(Settings.for_tests()) as handle:
        port = handle.address[1]

        def scenario() -> None:
            ws_sub = PahoClient(port, "ws-sub", protocol, transport=WS)
            assert ws_sub.rc == 0
            assert ws_sub.subscribe(("ws/#", 1)) == [1]
            tcp_pub = PahoClient(port, "tcp-pub", protocol)
            tcp_pub.publish("ws/a", b"from tcp", 1)
            big = bytes(range(256)) * 400  # 100 KiB: several WebSocket frames' worth
            ws_pub = PahoClient(port, "ws-pub", protocol, transport=WS)
            ws_pub.publish("ws/b", big, 1)
            first, second = ws_sub.get(), ws_sub.get()
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
            refused = PahoClient(port, "bad", V5, transport=WS, credentials=("alice", "wrong"))
            assert refused.rc == 0x86
            refused.paho.loop_stop()
            anonymous = PahoClient(port, "anon", V311, transport=WS)
            assert str(anonymous.rc) == "Not authorized"  # 3.1.1 return code 5, as paho names it
            anonymous.paho.loop_stop()
            alice = PahoClient(port, "alice-1", V5, transport=WS, credentials=("alice", "wonderland"))
            assert alice.rc == 0
            assert alice.subscribe(("alice/#", 1)) == [1]
            assert alice.subscribe(("bob/#", 1)) == [0x87]
            alice.publish("alice/x", b"mine", 1)
            assert alice.get().payload == b"mine"
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
            client = PahoClient(port, "wss", V5, transport=WS, ca=ca)
            assert client.rc == 0
            assert client.subscribe(("secure/#", 2)) == [2]
            client.publish("secure/x", b"over wss", 2)
            assert client.get().payload == b"over wss"
            client.close()

        await trio.to_thread.run_sync(scenario)
    (negotiated,) = log_sink.named("conn.negotiated")
    assert negotiated["tls"] is True
    assert log_sink.named("conn.closed")[0]["protocol"] == "mqtt"
