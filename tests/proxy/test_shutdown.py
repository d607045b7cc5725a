"""SIGTERM on a real ``mqproxy serve`` process with clients attached: the drain (issue 19)."""

from __future__ import annotations

import json
import signal
import socket
import struct
import time
from pathlib import Path
from typing import Any

from ..conftest import log_events, serve_proxy, wait_proxy_started, wait_until_sync  # type: ignore[import-not-found]

#: Socket timeout: far below the 20 s hold and the 30 s grace, so an answer that waits for either fails.
ANSWER_S = 8.0
MQTT5_CONNECT = b"\x10\x11\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x04dev5"


def _remoting_frame(header: dict[str, Any]) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack(">ii", 4 + len(raw), len(raw)) + raw


def _read_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, f"EOF after {len(data)} of {size} bytes"
        data += chunk
    return data


def _read_response(sock: socket.socket) -> dict[str, Any]:
    total, header_len = struct.unpack(">ii", _read_exact(sock, 8))
    body = _read_exact(sock, total - 4)
    header: dict[str, Any] = json.loads(body[: header_len & 0xFFFFFF])
    return header


def _read_to_eof(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _get_healthz(addr: tuple[str, int]) -> bytes:
    with socket.create_connection(addr, timeout=ANSWER_S) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return _read_to_eof(s)


def _pull(opaque: int) -> dict[str, Any]:
    fields = {
        "consumerGroup": "G",
        "topic": "Drain",
        "queueId": "0",
        "queueOffset": "0",
        "maxMsgNums": "32",
        "sysFlag": "6",  # suspend + subscription
        "commitOffset": "0",
        "suspendTimeoutMillis": "20000",
        "subscription": "*",
        "subVersion": "0",
    }
    return {"code": 11, "opaque": opaque, "flag": 0, "extFields": fields}


def test_sigterm_drains_answers_long_polls_and_keeps_healthz_503_until_done(tmp_path: Path) -> None:
    log = tmp_path / "stdout.jsonl"
    env = {"MQPROXY_SERVER_DRAIN_WINDOW_S": "60", "MQPROXY_SERVER_SHUTDOWN_GRACE_S": "30"}
    proc = serve_proxy(tmp_path / "data", stdout=log.open("wb"), env=env)
    try:
        addr = wait_proxy_started(proc, log)
        remoting = socket.create_connection(addr, timeout=ANSWER_S)
        remoting.sendall(
            _remoting_frame({"code": 105, "opaque": 1, "flag": 0, "extFields": {"topic": "Drain"}})
        )
        assert _read_response(remoting)["opaque"] == 1
        # the route lookup after the pull is answered only once the pull was read and dispatched
        remoting.sendall(
            _remoting_frame(_pull(2))
            + _remoting_frame({"code": 105, "opaque": 3, "flag": 0, "extFields": {"topic": "Drain"}})
        )
        assert _read_response(remoting)["opaque"] == 3
        mqtt = socket.create_connection(addr, timeout=ANSWER_S)
        mqtt.sendall(MQTT5_CONNECT)
        assert _read_exact(mqtt, 2)[0] == 0x20  # CONNACK
        mqtt.recv(65536)
        assert _get_healthz(addr).startswith(b"HTTP/1.1 200 ")

        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        held = _read_response(remoting)
        assert (held["code"], held["opaque"]) == (19, 2)  # PULL_NOT_FOUND at once, not after 20 s
        assert _read_to_eof(remoting) == b""  # then a clean close
        assert time.monotonic() - started < ANSWER_S
        goodbye = _read_to_eof(mqtt)
        assert goodbye[:1] + goodbye[2:3] == b"\xe0\x8b"  # MQTT 5 DISCONNECT, server shutting down
        # the listener stays open through the drain window: health checks see 503 "draining"
        reply = _get_healthz(addr)
        assert reply.startswith(b"HTTP/1.1 503 ")
        assert b'"status":"draining"' in reply
        wait_until_sync(lambda: any(e["event"] == "proxy.stopping" for e in log_events(log)))
        assert proc.poll() is None  # still draining: the window is 60 s

        proc.send_signal(signal.SIGTERM)  # a second signal ends the drain at once
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()
    events = log_events(log)
    names = [e["event"] for e in events]
    assert names.index("proxy.stopping") < names.index("proxy.drained") < names.index("proxy.stopped")
    assert names[-1] == "proxy.stopped"
    drained = next(e for e in events if e["event"] == "proxy.drained")
    assert drained["open_connections"] == 0
    closed = [e for e in events if e["event"] == "conn.closed" and e["protocol"] == "remoting"]
    assert closed[0]["error"] is None


MQTT311_CONNECT = b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04dev4"


def test_sigterm_closes_mqtt_311_silently_and_refuses_new_mqtt_connections_politely(tmp_path: Path) -> None:
    """Draining: a connected 3.1.1 client is closed without a packet (3.1.1 has no server DISCONNECT); a
    CONNECT that arrives while the listener stays open for the drain window is refused with CONNACK 0x89
    server busy (MQTT 5) or return code 3 server unavailable (3.1.1), so the client retries elsewhere."""
    log = tmp_path / "stdout.jsonl"
    env = {"MQPROXY_SERVER_DRAIN_WINDOW_S": "60", "MQPROXY_SERVER_SHUTDOWN_GRACE_S": "30"}
    proc = serve_proxy(tmp_path / "data", stdout=log.open("wb"), env=env)
    try:
        addr = wait_proxy_started(proc, log)
        connected = socket.create_connection(addr, timeout=ANSWER_S)
        connected.sendall(MQTT311_CONNECT)
        assert _read_exact(connected, 4) == b"\x20\x02\x00\x00"
        proc.send_signal(signal.SIGTERM)
        assert _read_to_eof(connected) == b""
        wait_until_sync(lambda: any(e["event"] == "proxy.stopping" for e in log_events(log)))

        late5 = socket.create_connection(addr, timeout=ANSWER_S)
        late5.sendall(MQTT5_CONNECT)
        connack = _read_to_eof(late5)
        assert connack[0] == 0x20  # CONNACK
        assert connack[3] == 0x89  # server busy
        assert b"server shutting down" in connack  # its Reason String
        late4 = socket.create_connection(addr, timeout=ANSWER_S)
        late4.sendall(MQTT311_CONNECT)
        assert _read_to_eof(late4) == b"\x20\x02\x00\x03"
        assert proc.poll() is None

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()
    closed = [e for e in log_events(log) if e["event"] == "conn.closed" and e["protocol"] == "mqtt"]
    assert [e["error"] for e in closed] == [None, "server_draining", "server_draining"]
