"""Regressions found by the fuzzing campaign (``python -m mqproxy.fuzz --targets h2``): minimal inputs."""

from __future__ import annotations

import hpack
from h2.errors import ErrorCodes
from hyperframe.frame import Frame, HeadersFrame, RstStreamFrame, SettingsFrame

from mqproxy.codecs.grpc_framing import RequestReceived
from mqproxy.codecs.grpc_wire import GrpcServerConnection

from .grpc_peer import PREFACE, request_headers  # type: ignore[import-not-found]


def _server() -> GrpcServerConnection:
    server = GrpcServerConnection()
    server.initiate()
    server.data_to_send()
    return server


def _frames(data: bytes) -> list[Frame]:
    frames = []
    while len(data) >= 9:
        frame, length = Frame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9 : 9 + length]))
        frames.append(frame)
        data = data[9 + length :]
    return frames


def _resets(data: bytes) -> list[tuple[int, int]]:
    return [(f.stream_id, f.error_code) for f in _frames(data) if isinstance(f, RstStreamFrame)]


def test_bad_request_reset_by_trailers_in_the_same_read() -> None:
    """Found: a GET with END_STREAM and a second HEADERS on the same stream in one read made the codec
    answer the GET on a stream h2 had already reset: h2's StreamClosedError escaped receive_data."""
    enc = hpack.Encoder()
    get = enc.encode([(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "a")])
    data = (PREFACE + SettingsFrame(0).serialize()
            + HeadersFrame(1, get, flags=["END_HEADERS", "END_STREAM"]).serialize()
            + HeadersFrame(1, enc.encode([("x", "y")]), flags=["END_HEADERS"]).serialize())
    assert data.hex() == (
        "505249202a20485454502f322e300d0a0d0a534d0d0a0d0a000000040000000000000006010500000001828684418"
        "11f0000050104000000014081f381f5"
    )
    server = _server()
    assert server.receive_data(data) == []
    assert _resets(server.data_to_send()) == [(1, ErrorCodes.STREAM_CLOSED)]
    assert server.open_streams == 0


def test_valid_call_reset_in_the_same_read_is_not_reported() -> None:
    """The same with a valid call: no RequestReceived for a stream that is already gone."""
    enc = hpack.Encoder()
    block = enc.encode(request_headers())
    data = (PREFACE + SettingsFrame(0).serialize()
            + HeadersFrame(1, block, flags=["END_HEADERS", "END_STREAM"]).serialize()
            + HeadersFrame(1, enc.encode([("x", "y")]), flags=["END_HEADERS"]).serialize())
    server = _server()
    assert server.receive_data(data) == []
    assert server.open_streams == 0


def test_answering_a_call_h2_reset_later_is_ignored() -> None:
    """A call h2 resets on a later read (a stream error emits no event): answering it must not raise."""
    enc = hpack.Encoder()
    server = _server()
    opened = server.receive_data(
        PREFACE + SettingsFrame(0).serialize()
        + HeadersFrame(1, enc.encode(request_headers()), flags=["END_HEADERS", "END_STREAM"]).serialize()
    )
    assert isinstance(opened[0], RequestReceived)
    server.receive_data(HeadersFrame(1, enc.encode([("x", "y")]), flags=["END_HEADERS"]).serialize())
    server.start_response(1)
    server.send_message(1, b"reply")
    server.end_response(1, 0)
    assert _resets(server.data_to_send()) == [(1, ErrorCodes.STREAM_CLOSED)]
    assert server.open_streams == 0
