"""``[backend] kind = "rocketmq"`` as the server core wires it, without a cluster: ``/healthz`` reports the
backend's health, a node whose name server nobody listens on still starts (503 with the reason, no data
directory) and, until its cluster answers, refuses MQTT (paho, 3.1.1 and 5.0, TCP and WebSocket) with Server
unavailable and the reason."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any, Literal

import pytest
import trio

from mqproxy.server import ServerHandle
from mqproxy.settings import Settings

from ..conftest import wait_until  # type: ignore[import-not-found]
from ..e2e.paho_driver import PROTOCOLS, V5, PahoClient  # type: ignore[import-not-found]
from .conftest import running_server  # type: ignore[import-not-found]

pytestmark = pytest.mark.usefixtures("log_sink")


async def _healthz(handle: ServerHandle) -> tuple[int, dict[str, Any]]:
    """Status code and JSON body of ``GET /healthz``."""
    stream = await trio.open_tcp_stream(*handle.address)
    async with stream:
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = bytearray()
        with trio.fail_after(5):
            while data := await stream.receive_some(65536):
                reply += data
    head, _, body = bytes(reply).partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def _unused_port() -> int:
    """A loopback port nobody listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _cluster_settings(namesrv: str, **sections: Any) -> Settings:
    return Settings.for_tests(
        backend={"kind": "rocketmq", "namesrv": namesrv, "request_timeout_s": 0.5}, **sections
    )


async def test_healthz_is_503_with_the_reason_while_the_backend_reports_one(server: ServerHandle) -> None:
    assert await _healthz(server) == (200, {"status": "ok"})
    reasons = iter(["name server 127.0.0.1:1 unreachable: connect failed", None])
    server.state.backend_health = lambda: next(reasons)
    assert await _healthz(server) == (
        503,
        {"status": "unavailable", "reason": "name server 127.0.0.1:1 unreachable: connect failed"},
    )
    assert await _healthz(server) == (200, {"status": "ok"}), "healthy again once the backend says so"


async def test_a_node_starts_without_its_cluster_and_says_why(tmp_path: Path, log_sink: Any) -> None:
    namesrv = f"127.0.0.1:{_unused_port()}"
    data_dir = tmp_path / "data"
    settings = _cluster_settings(namesrv, store={"backend": "embedded", "data_dir": str(data_dir)})
    async with running_server(settings) as handle:
        assert handle.store is None, "messages live in the cluster"
        assert handle.state.backend_name == "rocketmq"

        async def unavailable() -> bool:
            return (await _healthz(handle))[0] == 503

        await wait_until(unavailable)
        _, body = await _healthz(handle)
        assert body["status"] == "unavailable"
        assert namesrv in body["reason"], "the reason names the name server"
    (started,) = log_sink.named("proxy.started")
    assert (started["backend"], started["namesrv"], started["data_dir"]) == ("rocketmq", namesrv, None)
    assert not data_dir.exists(), "a cluster node keeps no data directory"
    failed = log_sink.named("mqtt.cluster_sync_failed")
    assert failed, "MQTT keeps trying to load its state from the cluster"
    assert failed[0]["log"] == "load"
    assert namesrv in failed[0]["detail"]


@pytest.mark.parametrize("transport", ["tcp", "websockets"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_mqtt_connect_is_refused_as_server_unavailable(
    log_sink: Any, protocol: int, transport: Literal["tcp", "websockets"]
) -> None:
    namesrv = f"127.0.0.1:{_unused_port()}"
    async with running_server(_cluster_settings(namesrv)) as handle:

        def connect() -> PahoClient:
            client = PahoClient(handle.address[1], "refused", protocol, transport=transport)
            client.close()  # before paho's loop connects again
            return client

        client = await trio.to_thread.run_sync(connect)

        def refusal_logged() -> bool:
            return any(e["error"] == "mqtt_unavailable" for e in log_sink.named("conn.closed"))

        await wait_until(refusal_logged)
    # 3.1.1: paho reads CONNACK return code 3 as Server unavailable (0x88), the only code it maps there.
    assert (client.rc.value, str(client.rc)) == (0x88, "Server unavailable")
    if protocol == V5:
        assert namesrv in client.connack_properties.ReasonString, "the reason names what is unreachable"
    closed = next(e for e in log_sink.named("conn.closed") if e["error"] == "mqtt_unavailable")
    assert closed["protocol"] == "mqtt"
    assert namesrv in closed["detail"]
    connects = [e for e in log_sink.named("request") if e["op"] == "CONNECT"]
    assert connects
    assert all(e["status"] == "SERVER_UNAVAILABLE" for e in connects)
