"""Loopback tier: connection limits in total and per source address (issue 19, item 9). A connection over a
limit is refused in its protocol where that is cheap, logged as ``conn.refused`` and counted."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from h2.errors import ErrorCodes
from hyperframe.frame import Frame, GoAwayFrame, SettingsFrame

from mqproxy.limits import ConnectionLimiter
from mqproxy.settings import Settings

from ..conftest import read_until_eof  # type: ignore[import-not-found]
from .conftest import keep_alive_healthz  # type: ignore[import-not-found]

pytestmark = pytest.mark.usefixtures("log_sink")

MQTT5_CONNECT = b"\x10\x11\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x04dev5"
MQTT311_CONNECT = b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04dev4"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SettingsFrame(0).serialize()
REMOTING_ROUTE = b'\x00\x00\x00\x30\x00\x00\x00\x2c{"code":105,"flag":0,"opaque":1,"version":479}'


def _h2_frames(data: bytes) -> list[Frame]:
    frames, pos = [], 0
    while pos + 9 <= len(data):
        frame, length = Frame.parse_frame_header(memoryview(data[pos : pos + 9]))
        frame.parse_body(memoryview(data[pos + 9 : pos + 9 + length]))
        frames.append(frame)
        pos += 9 + length
    return frames


def _check_mqtt5(reply: bytes) -> None:
    assert reply[0] == 0x20  # CONNACK
    assert reply[3] == 0x97  # quota exceeded
    assert b"too many connections" in reply  # the Reason String


def _check_mqtt311(reply: bytes) -> None:
    assert reply == b"\x20\x02\x00\x03"  # CONNACK, server unavailable


def _check_http(reply: bytes) -> None:
    assert reply.startswith(b"HTTP/1.1 503 ")
    assert b"Connection: close" in reply


def _check_grpc(reply: bytes) -> None:
    frames = _h2_frames(reply)
    assert isinstance(frames[0], SettingsFrame)
    assert isinstance(frames[-1], GoAwayFrame)
    assert frames[-1].error_code == ErrorCodes.ENHANCE_YOUR_CALM
    assert frames[-1].last_stream_id == 0


def _check_plain(reply: bytes) -> None:
    assert reply == b""


REFUSALS = {
    "mqtt5": (MQTT5_CONNECT, "mqtt", True, _check_mqtt5),
    "mqtt311": (MQTT311_CONNECT, "mqtt", True, _check_mqtt311),
    "http": (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "http", True, _check_http),
    "grpc": (H2_PREFACE, "grpc", True, _check_grpc),
    "remoting": (REMOTING_ROUTE, "remoting", False, _check_plain),
}


@pytest.mark.parametrize("name", list(REFUSALS))
async def test_a_connection_over_max_connections_is_refused_in_its_protocol(
    start_server: Any, log_sink: Any, wait_for: Any, name: str
) -> None:
    opening, protocol, answered, check = REFUSALS[name]
    settings = Settings.for_tests(server={"max_connections": 2})
    async with start_server(settings) as handle:
        held = [await trio.open_tcp_stream(*handle.address) for _ in range(2)]
        for stream in held:
            assert (await keep_alive_healthz(stream)).startswith(b"HTTP/1.1 200")
        extra = await trio.open_tcp_stream(*handle.address)
        await extra.send_all(opening)
        check(await read_until_eof(extra, 10))
        await wait_for(lambda: log_sink.named("conn.refused"))
        (refused,) = log_sink.named("conn.refused")
        assert (refused["reason"], refused["protocol"], refused["answered"]) == (
            "max_connections",
            protocol,
            answered,
        )
        assert refused["peer"].startswith("127.0.0.1:")
        registry = handle.state.metrics.registry
        labels = {"reason": "max_connections"}
        assert registry.get_sample_value("mqproxy_connections_refused_total", labels) == 1
        await held[0].aclose()  # a slot frees: the next connection is served
        await wait_for(lambda: handle.state.limiter.total == 1)
        again = await trio.open_tcp_stream(*handle.address)
        assert (await keep_alive_healthz(again)).startswith(b"HTTP/1.1 200")
        for stream in (again, held[1], extra):
            await stream.aclose()


async def test_per_address_limit_counts_the_proxy_header_source(
    start_server: Any, log_sink: Any, wait_for: Any
) -> None:
    """Behind a load balancer every TCP peer is the balancer: the limit applies to the PROXY header's
    source."""
    settings = Settings.for_tests(server={"max_connections_per_address": 1})

    def proxied(source: str) -> bytes:  # a CONNECT with client id "dev" + the source's last digit
        connect = MQTT311_CONNECT[:-1] + source[-1:].encode()
        return f"PROXY TCP4 {source} 127.0.0.1 40000 9876\r\n".encode() + connect

    async with start_server(settings) as handle:
        first = await trio.open_tcp_stream(*handle.address)
        await first.send_all(proxied("10.0.0.1"))
        assert await first.receive_some(4) == b"\x20\x02\x00\x00"  # accepted
        other = await trio.open_tcp_stream(*handle.address)
        await other.send_all(proxied("10.0.0.2"))
        assert await other.receive_some(4) == b"\x20\x02\x00\x00"  # another source: accepted too
        same = await trio.open_tcp_stream(*handle.address)
        await same.send_all(proxied("10.0.0.1"))
        assert await read_until_eof(same, 10) == b"\x20\x02\x00\x03"
        await wait_for(lambda: log_sink.named("conn.refused"))
        (refused,) = log_sink.named("conn.refused")
        assert refused["reason"] == "max_connections_per_address"
        assert refused["peer"] == "10.0.0.1:40000"
        assert handle.state.limiter.per_address == {"10.0.0.1": 1, "10.0.0.2": 1}
        for stream in (first, other, same):
            await stream.aclose()
        await wait_for(lambda: not handle.state.limiter.per_address)


def test_limiter_bookkeeping() -> None:
    limiter = ConnectionLimiter(max_total=2, max_per_address=1)
    assert limiter.open_total()
    assert limiter.open_total()
    assert not limiter.open_total()
    limiter.close_total()
    assert limiter.open_total()
    assert limiter.open_address("a")
    assert limiter.open_address("b")
    assert not limiter.open_address("a")
    limiter.close_address("a")
    assert limiter.per_address == {"b": 1}  # only addresses with open connections are kept
    unlimited = ConnectionLimiter()
    assert all(unlimited.open_total() and unlimited.open_address("a") for _ in range(1000))
    assert all(limiter.begin_refusal() for _ in range(64))
    assert not limiter.begin_refusal()  # beyond MAX_POLITE_REFUSALS: closed without reading
