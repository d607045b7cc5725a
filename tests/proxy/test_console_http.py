"""The console over a real loopback socket, in one process: access (401/403/429/404, never data), the page,
the snapshot JSON, the event stream following a connecting MQTT client, and refusals listed."""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import h11
import orjson
import pytest
import trio

from mqproxy import console
from mqproxy.codecs.mqtt import Connack, Connect, MqttDecoder, ReasonCode, encode
from mqproxy.codecs.remoting import FrameDecoder, RemotingCommand, encode_command
from mqproxy.codecs.remoting_codes import RequestCode
from mqproxy.server import ServerHandle
from mqproxy.settings import Settings, SettingsError, build_settings

from ..conftest import read_until_eof  # type: ignore[import-not-found]

pytestmark = pytest.mark.usefixtures("log_sink")

ACL = """\
accounts:
  - accessKey: root
    secretKey: root-secret-1
    admin: true
  - accessKey: app
    secretKey: app-secret-1
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
"""
INJECTED = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def _get(
    address: tuple[str, int], path: str, authorization: str | None = None, prefix: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    stream = await trio.open_tcp_stream(*address)
    auth = f"Authorization: {authorization}\r\n" if authorization else ""
    await stream.send_all(
        prefix + f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n".encode()
    )
    raw = await read_until_eof(stream)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


class EventStream:
    """A ``/console/events`` reader: h11 client, SSE ``data:`` lines parsed as JSON."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)
        self.buf = b""
        self.status = 0

    @classmethod
    async def open(cls, address: tuple[str, int], authorization: str | None = None) -> EventStream:
        reader = cls(await trio.open_tcp_stream(*address))
        headers = [("host", "x"), ("accept", "text/event-stream")]
        if authorization:
            headers.append(("authorization", authorization))
        request = h11.Request(method="GET", target="/console/events", headers=headers)
        await reader.stream.send_all(reader.conn.send(request) + reader.conn.send(h11.EndOfMessage()))
        return reader

    async def _event(self) -> object:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.conn.receive_data(await self.stream.receive_some(65536))

    async def next_snapshot(self) -> dict[str, Any]:
        with trio.fail_after(10):
            while True:
                message, sep, rest = self.buf.partition(b"\n\n")
                if sep:
                    self.buf = rest
                    for line in message.split(b"\n"):
                        if line.startswith(b"data: "):
                            data: dict[str, Any] = orjson.loads(line[6:])
                            return data
                    continue
                event = await self._event()
                if isinstance(event, h11.Response):
                    self.status = event.status_code
                    assert (b"content-type", b"text/event-stream") in list(event.headers)
                elif isinstance(event, h11.Data):
                    self.buf += bytes(event.data)
                else:
                    raise AssertionError(f"stream ended: {event!r}")

    async def until(self, predicate: Any) -> dict[str, Any]:
        with trio.fail_after(15):
            while True:
                data = await self.next_snapshot()
                if predicate(data):
                    return data


async def _mqtt_connect(
    address: tuple[str, int], client_id: str, username: str | None = None, password: bytes | None = None
) -> tuple[trio.SocketStream, Connack]:
    stream = await trio.open_tcp_stream(*address)
    await stream.send_all(encode(Connect(client_id, 5, username=username, password=password), 5))
    decoder = MqttDecoder(1 << 20, protocol_level=5)
    with trio.fail_after(5):
        while True:
            packets = decoder.receive_data(await stream.receive_some(65536))
            if packets:
                assert isinstance(packets[0], Connack)
                return stream, packets[0]


@pytest.fixture
async def open_server(start_server: Any) -> AsyncIterator[ServerHandle]:
    async with start_server(Settings.for_tests()) as handle:
        yield handle


@pytest.fixture
async def acl_server(start_server: Any, tmp_path: Path) -> AsyncIterator[ServerHandle]:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    async with start_server(Settings.for_tests(acl={"file": str(acl_file)})) as handle:
        yield handle


async def test_open_console_on_loopback_serves_page_script_and_snapshot(open_server: ServerHandle) -> None:
    status, headers, body = await _get(open_server.address, "/console")
    assert status == 200
    assert headers["content-type"] == "text/html; charset=utf-8"
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert b'<tbody id="connections">' in body
    assert b'data-events="/console/events"' in body
    status, headers, body = await _get(open_server.address, "/console/console.js")
    assert status == 200
    assert headers["content-type"].startswith("text/javascript")
    assert b"EventSource" in body
    status, _, body = await _get(open_server.address, "/console/snapshot.json")
    data = orjson.loads(body)
    assert status == 200
    assert data["snapshot"]["backend"] == "memory"
    assert data["snapshot"]["open_connections"] >= 1  # this request's own connection
    status, _, _ = await _get(open_server.address, "/console/nothing")
    assert status == 404


async def test_stream_follows_an_mqtt_client_and_escapes_its_id(open_server: ServerHandle) -> None:
    events = await EventStream.open(open_server.address)
    first = await events.next_snapshot()
    assert events.status == 200
    assert all(row[0] != "mqtt" for row in first["tables"]["connections"])
    mqtt, connack = await _mqtt_connect(open_server.address, INJECTED)
    assert connack.reason_code == ReasonCode.SUCCESS
    seen = await events.until(lambda d: any(row[1] == INJECTED for row in d["tables"]["connections"]))
    row = next(r for r in seen["tables"]["connections"] if r[1] == INJECTED)
    assert row[0] == "mqtt"
    assert row[2].startswith("127.0.0.1:")
    assert int(row[4]) > 0
    assert "mqtt 1" in seen["live"]["by_protocol"]
    # the page renders the id as text
    _, _, page = await _get(open_server.address, "/console")
    assert INJECTED.encode() not in page
    assert b"&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in page
    await mqtt.aclose()
    await events.until(lambda d: all(row[1] != INJECTED for row in d["tables"]["connections"]))
    await events.stream.aclose()


async def test_rejected_connections_are_listed(open_server: ServerHandle) -> None:
    garbage = await trio.open_tcp_stream(*open_server.address)
    await garbage.send_all(b"\x16\x03\x01\x00\x05hello" + b"\xff" * 64)  # TLS record, no TLS configured
    await read_until_eof(garbage)
    _, _, body = await _get(open_server.address, "/console/snapshot.json")
    rows = orjson.loads(body)["tables"]["rejections"]
    assert rows
    assert rows[0][0] == "conn.rejected"
    assert rows[0][4]


async def test_remote_source_without_acl_is_refused(open_server: ServerHandle) -> None:
    proxied = b"PROXY TCP4 10.1.2.3 127.0.0.1 40000 9876\r\n"
    status, headers, body = await _get(open_server.address, "/console", prefix=proxied)
    assert status == 403
    assert b"loopback only" in body
    assert b"<table" not in body
    assert "www-authenticate" not in headers


async def test_acl_console_needs_an_admin(acl_server: ServerHandle, log_sink: Any) -> None:
    address = acl_server.address
    for path in ("/console", "/console/events", "/console/snapshot.json", "/console/console.js"):
        status, headers, body = await _get(address, path)
        assert status == 401, path
        assert headers["www-authenticate"] == 'Basic realm="mqproxy console", charset="UTF-8"'
        assert b"<table" not in body
        assert b"snapshot" not in body
        assert b"EventSource" not in body
    status, _, body = await _get(address, "/console", _basic("app", "app-secret-1"))
    assert status == 403
    assert b"<table" not in body
    status, headers, body = await _get(address, "/console", _basic("root", "not-it"))
    assert status == 401
    assert b"<table" not in body
    denied = log_sink.named("auth.denied")
    assert [(e["protocol"], e["reason"], e["access_key"]) for e in denied] == [
        ("http", "admin_required", "app"),
        ("http", "bad_signature", "root"),
    ]
    status, _, body = await _get(address, "/console/snapshot.json", _basic("root", "root-secret-1"))
    assert status == 200
    rejections = orjson.loads(body)["tables"]["rejections"]
    assert [r[4] for r in rejections[:2]] == ["bad_signature", "admin_required"]
    assert all("not-it" not in cell for row in rejections for cell in row)
    # an MQTT client with an account shows up on the admin's stream
    events = await EventStream.open(address, _basic("root", "root-secret-1"))
    mqtt, connack = await _mqtt_connect(address, "app-device-1", "app", b"app-secret-1")
    assert connack.reason_code == ReasonCode.SUCCESS
    await events.until(lambda d: any(row[1] == "app-device-1" for row in d["tables"]["connections"]))
    await mqtt.aclose()
    await events.stream.aclose()
    text = (await _get(address, "/metrics"))[2].decode()
    assert 'mqproxy_auth_denied_total{protocol="http",reason="bad_signature"} 1.0' in text


async def test_guessing_backs_off(acl_server: ServerHandle) -> None:
    acl_server.state.acl.throttle.base_delay = 30.0  # the back-off outlasts the test however slow it runs
    statuses = [
        (await _get(acl_server.address, "/console", _basic("root", f"guess-{i}")))[0] for i in range(5)
    ]
    assert statuses == [401, 401, 401, 401, 429]  # 3 free failures, the 4th starts the back-off
    status, headers, body = await _get(acl_server.address, "/console", _basic("root", "root-secret-1"))
    assert status == 429
    assert int(headers["retry-after"]) >= 1
    assert b"<table" not in body


async def test_disabled_console_is_not_found(start_server: Any) -> None:
    async with start_server(Settings.for_tests(console={"enabled": False})) as handle:
        status, _, _ = await _get(handle.address, "/console")
        assert status == 404
        status, _, _ = await _get(handle.address, "/healthz")
        assert status == 200


def test_bad_console_setting_names_it() -> None:
    with pytest.raises(SettingsError, match=r"console\.allow_remote"):
        build_settings({"console": {"allow_remote": "yes"}})


async def test_a_remoting_client_is_listed_by_its_heartbeat_id(open_server: ServerHandle) -> None:
    stream = await trio.open_tcp_stream(*open_server.address)
    body = orjson.dumps({"clientID": "10.0.0.7@4242#<b>x</b>", "consumerDataSet": [], "producerDataSet": []})
    await stream.send_all(encode_command(RemotingCommand(RequestCode.HEART_BEAT, opaque=1, body=body)))
    decoder = FrameDecoder()
    with trio.fail_after(5):
        while not decoder.receive_data(await stream.receive_some(65536)):
            pass
    _, _, raw = await _get(open_server.address, "/console/snapshot.json")
    rows = orjson.loads(raw)["tables"]["connections"]
    assert ["remoting", "10.0.0.7@4242#<b>x</b>"] in [row[:2] for row in rows]
    await stream.aclose()


async def test_a_reload_that_drops_admin_ends_the_stream(start_server: Any, tmp_path: Path) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    settings = Settings.for_tests(acl={"file": str(acl_file), "reload_interval_s": 0.05})
    async with start_server(settings) as handle:
        events = await EventStream.open(handle.address, _basic("root", "root-secret-1"))
        await events.next_snapshot()
        before = acl_file.stat().st_mtime_ns
        acl_file.write_text(ACL.replace("admin: true", "admin: false"))
        os.utime(acl_file, ns=(before + 2_000_000_000, before + 2_000_000_000))
        await read_until_eof(events.stream, 10)  # the server ends the stream and closes
        assert handle.state.console_streams == 0


async def test_event_streams_are_bounded(open_server: ServerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console, "MAX_STREAMS", 1)
    first = await EventStream.open(open_server.address)
    await first.next_snapshot()
    status, headers, body = await _get(open_server.address, "/console/events")
    assert status == 503
    assert headers["retry-after"] == "5"
    assert b"snapshot" not in body
    await first.stream.aclose()
