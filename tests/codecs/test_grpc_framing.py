"""The gRPC framing and request validation (:mod:`mqproxy.codecs.grpc_framing`), through a
:class:`GrpcServerConnection` driven by an in-memory h2 client."""

from __future__ import annotations

import ast
import pathlib
import struct

import pytest
from google.protobuf.message import DecodeError
from h2.errors import ErrorCodes
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.codecs import grpc_framing, grpc_wire
from mqproxy.codecs import rocketmq_v2 as v2
from mqproxy.codecs.grpc_framing import (
    GrpcStatus,
    MessageReceived,
    RequestEnded,
    RequestReceived,
    RequestRejected,
    encode_message,
    parse_grpc_timeout,
    percent_encode,
)

from .grpc_peer import Peer, of, request_headers  # type: ignore[import-not-found]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("3S", 3.0), ("3010m", 3.01), ("8760H", 8760 * 3600.0), ("1M", 60.0), ("250u", 250e-6), ("7n", 7e-9),
     ("0S", 0.0), ("99999999S", 99999999.0), ("00000001m", 1e-3),
     ("", None), ("S", None), ("123456789S", None), ("3s", None), ("3", None), ("-1S", None), (" 3S", None),
     ("3.5S", None), ("3SS", None), ("\uff13S", None)]  # a fullwidth digit three,
)
def test_parse_grpc_timeout(value: str, seconds: float | None) -> None:
    assert parse_grpc_timeout(value) == (pytest.approx(seconds) if seconds is not None else None)


def test_percent_encode_and_message_prefix() -> None:
    assert percent_encode("no new message") == "no new message"
    assert percent_encode("100% é\n") == "100%25 %C3%A9%0A"
    assert encode_message(b"\x08\x01") == b"\x00\x00\x00\x00\x02\x08\x01"
    assert encode_message(b"") == b"\x00\x00\x00\x00\x00"


def test_codec_modules_are_sans_io() -> None:
    forbidden = {"trio", "socket", "ssl", "time", "asyncio", "selectors", "threading"}
    for module in (grpc_framing, grpc_wire, v2):
        tree = ast.parse(pathlib.Path(module.__file__ or "").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not {a.name.split(".")[0] for a in node.names} & forbidden, module.__name__
            elif isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] not in forbidden, module.__name__


def test_long_status_message_is_truncated() -> None:
    peer = Peer()
    sid = peer.open(request_headers(), end_stream=True)
    peer.pump()
    peer.server.end_response(sid, GrpcStatus.INTERNAL, "x" * 100_000)
    peer.pump()
    [block] = peer.response_headers(sid)
    assert dict(block)["grpc-message"] == "x" * 1021 + "..."


def test_message_split_across_many_data_frames_and_many_messages_per_frame() -> None:
    peer = Peer()
    sid = peer.open(request_headers("/apache.rocketmq.v2.MessagingService/Telemetry"))
    payloads = [b"", b"a", b"b" * 70_000, b"c" * 3]
    for byte in b"".join(encode_message(p) for p in payloads[:2]):  # one byte per DATA frame
        peer.send(sid, bytes([byte]))
    peer.send(sid, encode_message(payloads[2]) + encode_message(payloads[3]), end_stream=True)
    events = peer.pump()
    assert [e.payload for e in of(events, MessageReceived)] == payloads  # type: ignore[attr-defined]
    assert isinstance(events[-1], RequestEnded)


def test_empty_message_is_a_five_byte_frame() -> None:
    peer = Peer()
    sid = peer.open(request_headers("/apache.rocketmq.v2.MessagingService/NotifyClientTermination"))
    peer.send(sid, b"\x00\x00\x00\x00\x00", end_stream=True)
    events = peer.pump()
    [msg] = of(events, MessageReceived)
    assert isinstance(msg, MessageReceived)
    assert msg.payload == b""
    assert v2.NotifyClientTerminationRequest.FromString(msg.payload).HasField("group") is False


def test_unparseable_protobuf_is_exposed_raw_and_decode_raises() -> None:
    peer = Peer()
    sid = peer.open(request_headers())
    garbage = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, length-delimited, absurd length
    peer.send(sid, encode_message(garbage), end_stream=True)
    [msg] = of(peer.pump(), MessageReceived)
    assert isinstance(msg, MessageReceived)
    assert msg.payload == garbage
    with pytest.raises(DecodeError):
        v2.SendMessageRequest.FromString(msg.payload)


@pytest.mark.parametrize(
    ("overrides", "http_status", "grpc_status"),
    [
        ({":method": "GET"}, 405, GrpcStatus.INTERNAL),
        ({"content-type": "application/json"}, 415, GrpcStatus.INVALID_ARGUMENT),
        ({"content-type": None}, 415, GrpcStatus.INVALID_ARGUMENT),
        ({"content-type": "application/grpcx"}, 415, GrpcStatus.INVALID_ARGUMENT),
        ({"te": None}, 400, GrpcStatus.INTERNAL),
        ({"grpc-timeout": "123456789S"}, 200, GrpcStatus.INTERNAL),
        ({":path": "/nomethod"}, 200, GrpcStatus.UNIMPLEMENTED),
        ({"x-ctx-bin": "!!!"}, 200, GrpcStatus.INTERNAL),
    ],
)
def test_invalid_request_headers_are_answered_and_reset(
    overrides: dict[str, str | None], http_status: int, grpc_status: GrpcStatus,
) -> None:
    peer = Peer()
    headers = dict(request_headers())
    for k, val in overrides.items():
        if val is None:
            headers.pop(k)
        else:
            headers[k] = val
    sid = peer.open(list(headers.items()))
    peer.send(sid, encode_message(b"x"))
    events = peer.pump()
    assert not of(events, RequestReceived)
    assert not of(events, MessageReceived)
    [rej] = of(events, RequestRejected)
    assert isinstance(rej, RequestRejected)
    assert (rej.stream_id, rej.http_status, rej.grpc_status) == (sid, http_status, grpc_status)
    [block] = peer.response_headers(sid)
    assert block[0] == (":status", str(http_status))
    assert ("grpc-status", str(int(grpc_status))) in block
    assert peer.ended(sid)
    assert peer.resets()[sid] == ErrorCodes.NO_ERROR  # the request body was still open
    assert peer.server.open_streams == 0


def test_content_type_with_subtype_is_accepted() -> None:
    peer = Peer()
    for ctype in ("application/grpc+proto", "application/grpc;charset=utf-8"):
        peer.open(request_headers(content_type=ctype), end_stream=True)
    assert len(of(peer.pump(), RequestReceived)) == 2


def test_rejected_request_already_half_closed_gets_no_reset() -> None:
    peer = Peer()
    sid = peer.open(request_headers(**{"te": None}), end_stream=True)
    events = peer.pump()
    assert of(events, RequestRejected)
    assert sid not in peer.resets()
    assert peer.ended(sid)


def test_oversized_message_resource_exhausted() -> None:
    peer = Peer(max_message_bytes=1024)
    sid = peer.open(request_headers())
    peer.send(sid, encode_message(b"x" * 1024))  # exactly the limit is fine
    peer.send(sid, struct.pack(">BI", 0, 1025) + b"y" * 100)
    events = peer.pump()
    assert [type(e) for e in events] == [RequestReceived, MessageReceived, RequestRejected]
    rej = events[-1]
    assert isinstance(rej, RequestRejected)
    assert rej.grpc_status is GrpcStatus.RESOURCE_EXHAUSTED
    assert ("grpc-status", "8") in peer.response_headers(sid)[0]
    assert peer.resets()[sid] == ErrorCodes.NO_ERROR
    # later DATA for the finished stream is discarded; the connection stays usable
    sid2 = peer.open(request_headers(), end_stream=True)
    assert of(peer.pump(), RequestReceived)[0].stream_id == sid2  # type: ignore[attr-defined]


def test_oversized_after_response_headers_uses_trailers() -> None:
    peer = Peer(max_message_bytes=10)
    sid = peer.open(request_headers("/apache.rocketmq.v2.MessagingService/Telemetry"))
    peer.pump()
    peer.server.send_message(sid, b"settings")
    peer.send(sid, struct.pack(">BI", 0, 11))
    events = peer.pump()
    assert of(events, RequestRejected)
    headers, trailers = peer.response_headers(sid)
    assert headers[0] == (":status", "200")
    assert trailers[0] == ("grpc-status", "8")


def test_truncated_message_then_end_stream_is_internal() -> None:
    peer = Peer()
    sid = peer.open(request_headers())
    peer.send(sid, encode_message(b"0123456789")[:-3], end_stream=True)
    events = peer.pump()
    assert [type(e) for e in events] == [RequestReceived, RequestRejected]
    rej = events[-1]
    assert isinstance(rej, RequestRejected)
    assert rej.grpc_status is GrpcStatus.INTERNAL
    assert peer.response_headers(sid) == [[(":status", "200"), ("content-type", "application/grpc"),
                                           ("grpc-status", "13"),
                                           ("grpc-message", "request ended inside a message")]]
    assert sid not in peer.resets()


@pytest.mark.parametrize(
    ("encoding", "flag", "status"),
    [(None, 1, GrpcStatus.INTERNAL), ("identity", 1, GrpcStatus.INTERNAL),
     ("gzip", 1, GrpcStatus.UNIMPLEMENTED), ("gzip", 2, GrpcStatus.INTERNAL)],
)
def test_compressed_messages_rejected(encoding: str | None, flag: int, status: GrpcStatus) -> None:
    peer = Peer()
    sid = peer.open(request_headers(grpc_encoding=encoding))
    peer.send(sid, struct.pack(">BI", flag, 3) + b"abc")
    events = peer.pump()
    [rej] = of(events, RequestRejected)
    assert isinstance(rej, RequestRejected)
    assert rej.grpc_status is status
    block = peer.response_headers(sid)[0]
    assert ("grpc-status", str(int(status))) in block
    if status is GrpcStatus.UNIMPLEMENTED:
        assert ("grpc-accept-encoding", "identity") in block


def test_gzip_encoding_header_with_uncompressed_messages_is_fine() -> None:
    peer = Peer()
    sid = peer.open(request_headers(grpc_encoding="gzip"))
    peer.send(sid, encode_message(b"abc"), end_stream=True)
    assert [type(e) for e in peer.pump()] == [RequestReceived, MessageReceived, RequestEnded]
    assert sid in peer.server._streams


def test_connection_buffer_budget() -> None:
    peer = Peer(max_message_bytes=1000, max_buffered_bytes=1500)
    a = peer.open(request_headers())
    b = peer.open(request_headers())
    peer.send(a, struct.pack(">BI", 0, 1000) + b"x" * 900)
    events = peer.pump()
    assert not of(events, RequestRejected)
    peer.send(b, struct.pack(">BI", 0, 1000) + b"x" * 900)
    [rej] = of(peer.pump(), RequestRejected)
    assert isinstance(rej, RequestRejected)
    assert rej.stream_id == b
    assert rej.grpc_status is GrpcStatus.RESOURCE_EXHAUSTED
    peer.send(a, b"x" * 100, end_stream=True)  # stream a still completes
    assert [type(e) for e in peer.pump()] == [MessageReceived, RequestEnded]
    assert peer.server._buffered == 0


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=63))
def test_fuzz_stream_bodies_never_raise(body: bytes, cut: int) -> None:
    peer = Peer(max_message_bytes=32)
    sid = peer.open(request_headers())
    peer.send(sid, body[:cut])
    peer.send(sid, body[cut:], end_stream=True)
    events = peer.pump()
    assert isinstance(events[0], RequestReceived)
    assert isinstance(events[-1], RequestEnded | RequestRejected)
    assert peer.server.open_streams <= 1
    assert peer.server._buffered == 0
