"""Loopback tier: malformed frames and stalled requests are ended at once or by their deadline, never by the
idle timeout (regressions found by probing: issue 19)."""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest
import trio
from h2.errors import ErrorCodes
from hyperframe.frame import Frame, GoAwayFrame, SettingsFrame

from mqproxy.settings import Settings

from ..conftest import read_until_eof  # type: ignore[import-not-found]
from .conftest import keep_alive_healthz  # type: ignore[import-not-found]

pytestmark = pytest.mark.usefixtures("log_sink")

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = SettingsFrame(0).serialize()


def _h2_frames(data: bytes) -> list[Frame]:
    frames, pos = [], 0
    while pos + 9 <= len(data):
        frame, length = Frame.parse_frame_header(memoryview(data[pos : pos + 9]))
        frame.parse_body(memoryview(data[pos + 9 : pos + 9 + length]))
        frames.append(frame)
        pos += 9 + length
    return frames


@pytest.mark.parametrize(
    ("after_preface", "error_codes"),
    [
        # frame headers alone, their bodies never sent: SETTINGS of 16 MiB - 1, DATA of 64 KiB + 1
        (EMPTY_SETTINGS + b"\xff\xff\xff\x04\x00\x00\x00\x00\x00", {ErrorCodes.FRAME_SIZE_ERROR}),
        (EMPTY_SETTINGS + b"\x01\x00\x01\x00\x00\x00\x00\x00\x01", {ErrorCodes.FRAME_SIZE_ERROR}),
        (b"\xff\xff\xff\x04\x00\x00\x00\x00\x00", {ErrorCodes.FRAME_SIZE_ERROR}),
        # random bytes read as a frame header: not SETTINGS, or too long, whichever is noticed first
        (
            bytes(random.Random(19).randrange(256) for _ in range(64)),
            {ErrorCodes.FRAME_SIZE_ERROR, ErrorCodes.PROTOCOL_ERROR},
        ),
    ],
    ids=["16mib-settings-header", "oversized-data-header", "16mib-first-frame", "random-bytes"],
)
async def test_h2_oversized_or_malformed_frame_gets_goaway_at_once(
    server: Any, log_sink: Any, wait_for: Any, after_preface: bytes, error_codes: set[ErrorCodes]
) -> None:
    """SETTINGS, then GOAWAY with the error and a clean close, before any body arrives."""
    stream = await trio.open_tcp_stream(*server.address)
    await stream.send_all(H2_PREFACE + after_preface)
    frames = _h2_frames(await read_until_eof(stream, 10))
    goaways = [f for f in frames if isinstance(f, GoAwayFrame)]
    assert len(goaways) == 1, frames
    assert frames[-1] is goaways[0]
    assert isinstance(frames[0], SettingsFrame)
    assert goaways[0].error_code in error_codes
    await wait_for(lambda: len(log_sink.named("conn.closed")) == 1)
    (closed,) = log_sink.named("conn.closed")
    assert (closed["protocol"], closed["error"]) == ("grpc", "protocol_error")
    assert closed["detail"]


#: Openings of a request or frame that never complete (each is enough for the sniffer to pick the protocol).
STALLED = {
    "half-http-request": (b"GET /healthz HTTP/1.1\r\nHost: x\r\nAcc", "http"),
    "half-websocket-upgrade": (b"GET /mqtt HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConne", "http"),
    "half-remoting-frame": (struct.pack(">ii", 200, 60) + b'{"code":105,"flag":0,"opaque":1,', "remoting"),
    "h2-preface-without-settings": (H2_PREFACE, "grpc"),
    "half-h2-frame": (H2_PREFACE + EMPTY_SETTINGS + b"\x00\x00\x08\x06\x00", "grpc"),
}


@pytest.mark.parametrize("name", list(STALLED))
async def test_request_stalled_mid_frame_is_closed_at_the_frame_timeout(
    start_server: Any, log_sink: Any, wait_for: Any, name: str
) -> None:
    """A started request or frame that stops arriving is closed after ``server.frame_timeout_s`` (HTTP with
    a 408, gRPC with a GOAWAY), logged as ``conn.closed`` error ``frame_timeout``; a connection idle between
    requests since before it is still served (the idle timeout is untouched)."""
    opening, protocol = STALLED[name]
    settings = Settings.for_tests(server={"frame_timeout_s": 0.3, "idle_timeout_s": 60.0})
    async with start_server(settings) as handle:
        idle = await trio.open_tcp_stream(*handle.address)
        assert (await keep_alive_healthz(idle)).startswith(b"HTTP/1.1 200")
        stalled = await trio.open_tcp_stream(*handle.address)
        await stalled.send_all(opening)
        reply = await read_until_eof(stalled, 10)
        if protocol == "http":
            assert reply.startswith(b"HTTP/1.1 408 ")
        elif protocol == "grpc":
            goaway = _h2_frames(reply)[-1]
            assert isinstance(goaway, GoAwayFrame)
            assert goaway.error_code == ErrorCodes.PROTOCOL_ERROR
        else:
            assert reply == b""
        await wait_for(lambda: len(log_sink.named("conn.closed")) == 1)
        (closed,) = log_sink.named("conn.closed")
        assert (closed["protocol"], closed["error"]) == (protocol, "frame_timeout")
        assert (await keep_alive_healthz(idle)).startswith(b"HTTP/1.1 200")
