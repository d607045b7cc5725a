"""GrpcServerConnection driven by a real in-memory h2 client (no sockets)."""

from __future__ import annotations

import gc
import struct
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import pytest
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.codecs import rocketmq_v2 as v2
from mqproxy.codecs.grpc_framing import (
    ConnectionTerminated,
    GrpcEvent,
    GrpcStatus,
    GrpcWireError,
    MessageReceived,
    RequestEnded,
    RequestReceived,
    RequestRejected,
    StreamReset,
    encode_message,
)
from mqproxy.codecs.grpc_wire import GrpcServerConnection

from .grpc_peer import PREFACE, RECEIVE, SEND, Peer, of, request_headers, send_request  # type: ignore[import-not-found]


def test_server_preface_settings() -> None:
    server = GrpcServerConnection(max_concurrent_streams=7, max_header_list_size=4096)
    server.initiate()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    events = client.receive_data(server.data_to_send())
    changed = next(e for e in events if isinstance(e, h2.events.RemoteSettingsChanged)).changed_settings
    assert changed[SettingCodes.MAX_CONCURRENT_STREAMS].new_value == 7
    assert changed[SettingCodes.MAX_HEADER_LIST_SIZE].new_value == 4096
    assert changed[SettingCodes.ENABLE_PUSH].new_value == 0
    # the connection window was opened beyond the 65535 default
    opened = [e for e in events if isinstance(e, h2.events.WindowUpdated) and e.stream_id == 0]
    assert opened
    assert opened[0].delta > 65_535


def _literal(name: bytes, value: bytes) -> bytes:
    """HPACK "literal header field without indexing, new name", no Huffman (RFC 7541 §6.2.2)."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


# A complete client byte stream written by hand: preface, empty SETTINGS, HEADERS(END_HEADERS) on stream 1,
# DATA(END_STREAM) carrying one gRPC message with Resource{name: "T"}.
_GOLDEN_BLOCK = b"".join(_literal(n, v) for n, v in [
    (b":method", b"POST"), (b":scheme", b"http"), (b":path", SEND.encode()), (b":authority", b"mq"),
    (b"content-type", b"application/grpc"), (b"te", b"trailers"), (b"grpc-timeout", b"2990m"),
    (b"x-mq-language", b"PYTHON"),
])


GOLDEN_REQUEST = (
    PREFACE
    + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    + len(_GOLDEN_BLOCK).to_bytes(3, "big") + b"\x01\x04\x00\x00\x00\x01" + _GOLDEN_BLOCK
    + b"\x00\x00\x08\x00\x01\x00\x00\x00\x01" + b"\x00\x00\x00\x00\x03\x12\x01T"
)


GOLDEN_EVENTS = [
    RequestReceived(stream_id=1, method=SEND, authority="mq", metadata=(("x-mq-language", "PYTHON"),),
                    deadline_s=pytest.approx(2.99)),  # type: ignore[arg-type]
    MessageReceived(stream_id=1, payload=b"\x12\x01T"),
    RequestEnded(stream_id=1),
]


def test_golden_request_bytes() -> None:
    server = GrpcServerConnection()
    server.initiate()
    assert server.receive_data(GOLDEN_REQUEST) == GOLDEN_EVENTS
    assert v2.Resource.FromString(b"\x12\x01T").name == "T"


def test_grpc_python_style_preface_settings_ping_and_large_frames() -> None:
    """grpc-python's SETTINGS (spec/grpc.md §2, incl. the unknown 0xFE03), WINDOW_UPDATE, PING, a request."""
    settings_payload = b"".join(struct.pack(">HI", k, v) for k, v in [
        (0x2, 0), (0x3, 0), (0x4, 4_194_304), (0x5, 4_194_304), (0x6, 16_384), (0xFE03, 1)])
    settings_frame = len(settings_payload).to_bytes(3, "big") + b"\x04\x00\x00\x00\x00\x00" + settings_payload
    wire = (PREFACE + settings_frame
            + b"\x00\x00\x04\x08\x00\x00\x00\x00\x00" + (4_128_769).to_bytes(4, "big")  # WINDOW_UPDATE
            + b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"12345678")  # PING
    server = GrpcServerConnection()
    server.initiate()
    server.data_to_send()
    assert server.receive_data(wire + GOLDEN_REQUEST[len(PREFACE) + 9:]) == GOLDEN_EVENTS
    frames = _frames(server.data_to_send())
    assert (0x4, 0x1, 0, b"") in frames  # SETTINGS ACK
    assert (0x6, 0x1, 0, b"12345678") in frames  # PING ACK
    body = b"z" * 1_000_000
    server.send_message(1, body)
    server.end_response(1, GrpcStatus.OK)
    frames = _frames(server.data_to_send())
    data = [f for f in frames if f[0] == 0x0]
    assert len(data) == 1
    assert data[0][3] == encode_message(body)
    assert frames[-1][0] == 0x1
    assert frames[-1][1] & 0x1


def test_golden_request_split_at_every_offset() -> None:
    for cut in range(1, len(GOLDEN_REQUEST)):
        server = GrpcServerConnection()
        server.initiate()
        events = server.receive_data(GOLDEN_REQUEST[:cut]) + server.receive_data(GOLDEN_REQUEST[cut:])
        assert events == GOLDEN_EVENTS, cut


def test_golden_request_one_byte_at_a_time() -> None:
    server = GrpcServerConnection()
    server.initiate()
    events: list[GrpcEvent] = []
    for i in range(len(GOLDEN_REQUEST)):
        events += server.receive_data(GOLDEN_REQUEST[i:i + 1])
    assert events == GOLDEN_EVENTS


def test_stock_h2_would_kill_the_connection_on_too_many_streams() -> None:
    """Why _ServerH2Connection refuses streams itself: h2 4.x answers with a connection-wide GOAWAY."""
    stock = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    stock.local_settings = h2.settings.Settings(client=False,
                                                initial_values={SettingCodes.MAX_CONCURRENT_STREAMS: 1})
    stock.initiate_connection()
    two_streams = GOLDEN_REQUEST[:-17] + (len(_GOLDEN_BLOCK).to_bytes(3, "big") + b"\x01\x04\x00\x00\x00\x03"
                                          + _GOLDEN_BLOCK)
    with pytest.raises(h2.exceptions.TooManyStreamsError):
        stock.receive_data(two_streams)
    server = GrpcServerConnection(max_concurrent_streams=1)
    server.initiate()
    events = server.receive_data(two_streams)
    assert [type(e) for e in events] == [RequestReceived]
    assert b"\x00\x00\x04\x03\x00\x00\x00\x00\x03\x00\x00\x00\x07" in server.data_to_send()  # RST(3, REFUSED)


def test_unary_round_trip_with_protobuf() -> None:
    peer = Peer()
    sid = peer.open(request_headers(x_trace_bin="AAEC", user_agent="grpc-python/1.85"))
    peer.send(sid, encode_message(send_request()), end_stream=True)
    events = peer.pump()
    assert [type(e) for e in events] == [RequestReceived, MessageReceived, RequestEnded]
    req = events[0]
    assert isinstance(req, RequestReceived)
    assert (req.stream_id, req.method, req.authority, req.deadline_s) == (sid, SEND, "127.0.0.1:8081", 3.0)
    assert ("x-mq-client-id", "host@1@0") in req.metadata
    assert ("x-trace-bin", b"\x00\x01\x02") in req.metadata
    assert ("user-agent", "grpc-python/1.85") in req.metadata
    names = {name for name, _ in req.metadata}
    assert not names & {"te", "content-type", "grpc-timeout"}
    assert not any(n.startswith(":") for n in names)
    msg = events[1]
    assert isinstance(msg, MessageReceived)
    decoded = v2.SendMessageRequest.FromString(msg.payload)
    assert decoded.messages[0].topic.name == "TopicTest"
    assert decoded.messages[0].user_properties["p1"] == "v1"

    response = v2.SendMessageResponse()
    response.status.code = v2.Code.OK
    entry = response.entries.add()
    entry.status.code = v2.Code.OK
    entry.message_id = "01ABC"
    peer.server.start_response(sid, [("x-mq-request-id", "r1"), ("x-bin", b"\xff")])
    peer.server.send_message(sid, response.SerializeToString())
    peer.server.end_response(sid, GrpcStatus.OK)
    peer.pump()
    headers, trailers = peer.response_headers(sid)
    assert headers[:2] == [(":status", "200"), ("content-type", "application/grpc")]
    assert ("x-mq-request-id", "r1") in headers
    assert ("x-bin", "/w") in headers
    assert trailers == [("grpc-status", "0")]
    [body] = peer.messages(sid)
    assert v2.SendMessageResponse.FromString(body).entries[0].message_id == "01ABC"
    assert peer.ended(sid)
    assert peer.server.open_streams == 0
    assert sid not in peer.resets()


def test_server_streaming_response() -> None:
    peer = Peer()
    sid = peer.open(request_headers(RECEIVE, grpc_timeout="8010m"))
    request = v2.ReceiveMessageRequest(batch_size=16).SerializeToString()
    peer.send(sid, encode_message(request), end_stream=True)
    events = peer.pump()
    assert isinstance(events[0], RequestReceived)
    assert events[0].deadline_s == pytest.approx(8.01)
    parts = [v2.ReceiveMessageResponse(status=v2.Status(code=v2.Code.OK))]
    for i in range(3):
        r = v2.ReceiveMessageResponse()
        r.message.topic.name = "T"
        r.message.body = bytes([i]) * 100
        parts.append(r)
    ts = v2.ReceiveMessageResponse()
    ts.delivery_timestamp.FromSeconds(1_700_000_000)
    parts.append(ts)
    for p in parts:
        peer.server.send_message(sid, p.SerializeToString())
        peer.pump()
    peer.server.end_response(sid, GrpcStatus.OK)
    peer.pump()
    got = [v2.ReceiveMessageResponse.FromString(b) for b in peer.messages(sid)]
    assert [g.WhichOneof("content") for g in got] == [
        "status", "message", "message", "message", "delivery_timestamp"]
    assert got[2].message.body == b"\x01" * 100
    assert peer.response_headers(sid)[-1] == [("grpc-status", "0")]


def test_trailers_only_error_with_percent_encoded_message() -> None:
    peer = Peer()
    sid = peer.open(request_headers(), end_stream=True)
    peer.pump()
    peer.server.end_response(sid, GrpcStatus.UNIMPLEMENTED, "no such method: ü 100%", [("x-reason", "r")])
    peer.pump()
    [block] = peer.response_headers(sid)
    assert block == [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "12"),
                     ("grpc-message", "no such method: %C3%BC 100%25"), ("x-reason", "r")]
    assert peer.ended(sid)


def test_three_mib_both_directions_with_small_windows() -> None:
    body = bytes(range(256)) * (3 * 1024 * 1024 // 256)
    # server stream window 64 KiB, client stream window 65535: both directions must chunk and resume
    peer = Peer(client_window=65_535, initial_window_bytes=65_535, connection_window_bytes=65_535)
    sid = peer.open(request_headers())
    peer.send(sid, encode_message(body), end_stream=True)
    events = peer.pump()
    [msg] = of(events, MessageReceived)
    assert isinstance(msg, MessageReceived)
    assert msg.payload == body
    peer.server.send_message(sid, body)
    assert peer.server.pending_outbound_bytes(sid) > 0  # did not fit in the client's window
    peer.server.end_response(sid, GrpcStatus.OK)
    peer.pump()
    assert peer.messages(sid) == [body]
    assert peer.response_headers(sid)[-1] == [("grpc-status", "0")]
    assert peer.server.pending_outbound_bytes() == 0
    assert peer.server.open_streams == 0


def test_rst_stream_mid_request_drops_state() -> None:
    peer = Peer()
    sid = peer.open(request_headers("/apache.rocketmq.v2.MessagingService/Telemetry", grpc_timeout=None))
    peer.send(sid, encode_message(b"abcdef")[:4])
    events = peer.pump()
    assert events[0].deadline_s is None  # type: ignore[attr-defined]
    peer.server.send_message(sid, b"x" * 200_000)  # some of it is queued behind the window
    peer.client.reset_stream(sid, ErrorCodes.CANCEL)
    events = peer.pump()
    assert events == [StreamReset(stream_id=sid, error_code=ErrorCodes.CANCEL, remote=True)]
    assert peer.server.open_streams == 0
    assert peer.server._buffered == 0
    assert peer.server.pending_outbound_bytes() == 0
    # a late answer for the reset stream is ignored, not an error
    peer.server.send_message(sid, b"late")
    peer.server.end_response(sid, GrpcStatus.OK)
    assert peer.server.data_to_send() == b""


def _frames(wire: bytes) -> list[tuple[int, int, int, bytes]]:
    """Split raw HTTP/2 bytes into (type, flags, stream id, payload)."""
    frames = []
    while wire:
        length = int.from_bytes(wire[:3], "big")
        frames.append((wire[3], wire[4], int.from_bytes(wire[5:9], "big") & 0x7FFFFFFF, wire[9:9 + length]))
        wire = wire[9 + length:]
    return frames


def test_client_goaway_lets_in_flight_streams_finish() -> None:
    """grpc-js sends GOAWAY(NO_ERROR, last=0) then DATA END_STREAM on its telemetry stream."""
    peer = Peer()
    sid = peer.open(request_headers("/apache.rocketmq.v2.MessagingService/Telemetry"))
    peer.send(sid, encode_message(b"settings"))
    peer.pump()
    peer.client.close_connection(ErrorCodes.NO_ERROR, last_stream_id=0)
    # h2's client refuses to send after its own GOAWAY: craft the trailing DATA frame by hand
    data = encode_message(b"bye")
    frame = struct.pack(">I", len(data))[1:] + b"\x00\x01" + struct.pack(">I", sid) + data
    events = peer.server.receive_data(peer.client.data_to_send() + frame)
    assert events == [ConnectionTerminated(error_code=0, last_stream_id=0),
                      MessageReceived(stream_id=sid, payload=b"bye"), RequestEnded(stream_id=sid)]
    peer.server.end_response(sid, GrpcStatus.OK)
    frames = _frames(peer.server.data_to_send())  # h2's client is CLOSED after its own GOAWAY: split by hand
    final = [f for f in frames if f[0] == 0x1 and f[2] == sid][-1]  # HEADERS on the telemetry stream
    assert final[1] & 0x1  # END_STREAM
    # the client's HPACK decoder shares the dynamic table the server's encoder used
    assert peer.client.decoder.decode(final[3]) == [(":status", "200"), ("content-type", "application/grpc"),
                                                    ("grpc-status", "0")]  # Trailers-Only
    assert peer.server.open_streams == 0


def test_graceful_shutdown_finishes_in_flight_calls_and_refuses_new_ones() -> None:
    server = GrpcServerConnection()
    server.initiate()
    assert [type(e) for e in server.receive_data(GOLDEN_REQUEST[:-17])] == [RequestReceived]  # stream 1 open
    server.data_to_send()
    server.shutdown()
    [goaway] = _frames(server.data_to_send())
    assert goaway[:3] == (0x7, 0, 0)
    assert goaway[3] == b"\x00\x00\x00\x01\x00\x00\x00\x00"
    # a new stream after our GOAWAY is refused; stream 1 still completes
    late = len(_GOLDEN_BLOCK).to_bytes(3, "big") + b"\x01\x05\x00\x00\x00\x03" + _GOLDEN_BLOCK
    events = server.receive_data(late + GOLDEN_REQUEST[-17:])
    assert events == GOLDEN_EVENTS[1:]
    server.send_message(1, b"ok")
    server.end_response(1, GrpcStatus.OK)
    frames = _frames(server.data_to_send())
    assert (0x3, 0, 3, b"\x00\x00\x00\x07") in frames  # RST_STREAM(3, REFUSED_STREAM)
    assert [f[0] for f in frames if f[2] == 1] == [0x1, 0x0, 0x1]  # HEADERS, DATA, HEADERS (trailers)
    assert frames[-1][1] & 0x1  # END_STREAM
    assert server.open_streams == 0
    server.close()
    assert _frames(server.data_to_send())[0][0] == 0x7


def test_close_sends_goaway_and_ignores_later_calls() -> None:
    peer = Peer()
    sid = peer.open(request_headers(), end_stream=True)
    peer.pump()
    peer.server.close()
    peer.pump()
    terminated = [e for e in peer.client_events if isinstance(e, h2.events.ConnectionTerminated)]
    assert terminated
    assert (terminated[0].error_code, terminated[0].last_stream_id) == (ErrorCodes.NO_ERROR, sid)
    peer.server.end_response(sid, GrpcStatus.OK)
    assert peer.server.data_to_send() == b""
    assert peer.server.receive_data(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00") == []


def test_garbage_preface_is_a_wire_error_with_goaway_queued() -> None:
    server = GrpcServerConnection()
    server.initiate()
    server.data_to_send()
    with pytest.raises(GrpcWireError) as info:
        server.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert info.value.error_code == ErrorCodes.PROTOCOL_ERROR
    assert server.data_to_send()[3] == 0x7  # a GOAWAY frame is queued


SETTINGS_EMPTY = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@pytest.mark.parametrize(
    ("after_preface", "error_code"),
    [
        (SETTINGS_EMPTY + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01", ErrorCodes.FRAME_SIZE_ERROR),
        (b"\x00\x00\x08\x06\x00\x00\x00\x00\x00", ErrorCodes.PROTOCOL_ERROR),  # PING first, not SETTINGS
    ],
    ids=["16mib-data-header", "first-frame-not-settings"],
)
def test_bad_frame_header_is_a_wire_error_before_its_body(
    after_preface: bytes, error_code: ErrorCodes
) -> None:
    server = GrpcServerConnection()
    server.initiate()
    server.data_to_send()
    with pytest.raises(GrpcWireError) as info:
        server.receive_data(PREFACE + after_preface)  # the 9-byte header only: no body follows
    assert info.value.error_code == error_code
    sent = server.data_to_send()  # (a SETTINGS ACK first when the client's SETTINGS came)
    goaway = sent[-17:]
    assert goaway[:4] == b"\x00\x00\x08\x07"  # the last frame is GOAWAY with the error code
    assert int.from_bytes(goaway[-4:], "big") == error_code


def test_hpack_bomb_over_header_list_limit_is_enhance_your_calm() -> None:
    peer = Peer(max_header_list_size=16 * 1024)
    peer.pump()
    big = "a" * 4000
    # the first copy is indexed; the other 19 cost one byte each on the wire but 4 KB each when decoded
    headers = request_headers() + [("x-bomb", big)] * 20
    sid = peer.client.get_next_available_stream_id()
    peer.client.send_headers(sid, headers)
    wire = peer.client.data_to_send()
    assert len(wire) < 5000
    with pytest.raises(GrpcWireError) as info:
        peer.server.receive_data(wire)
    assert info.value.error_code == ErrorCodes.ENHANCE_YOUR_CALM
    goaway = peer.server.data_to_send()
    assert goaway[3] == 0x7
    assert int.from_bytes(goaway[9 + 4:9 + 8], "big") == ErrorCodes.ENHANCE_YOUR_CALM


def test_refuses_streams_beyond_max_concurrent_and_stays_usable() -> None:
    peer = Peer(max_concurrent_streams=10)
    # the client has not seen our SETTINGS yet, so its own h2 does not stop it from opening 15 streams
    sids = [peer.open(request_headers()) for _ in range(15)]
    events = peer.server.receive_data(peer.client.data_to_send())
    assert [e.stream_id for e in of(events, RequestReceived)] == sids[:10]  # type: ignore[attr-defined]
    peer.pump()
    resets = peer.resets()
    assert {sid: resets.get(sid) for sid in sids[10:]} == dict.fromkeys(sids[10:], ErrorCodes.REFUSED_STREAM)
    # DATA in flight on a refused stream is answered with RST_STREAM, not a connection error
    peer.server.receive_data(b"\x00\x00\x05\x00\x00" + sids[-1].to_bytes(4, "big") + encode_message(b""))
    for sid in sids[:10]:
        peer.server.end_response(sid, GrpcStatus.OK)
    peer.pump()
    sid = peer.open(request_headers(), end_stream=True)
    assert of(peer.pump(), RequestReceived)[0].stream_id == sid  # type: ignore[attr-defined]


def test_late_headers_on_a_reset_stream_at_the_limit_are_a_stream_error() -> None:
    server = GrpcServerConnection(max_concurrent_streams=1)
    server.initiate()
    no_te = b"".join(_literal(n, v) for n, v in [(b":method", b"POST"), (b":scheme", b"http"),
                                                   (b":path", SEND.encode()), (b":authority", b"mq"),
                                                   (b"content-type", b"application/grpc")])

    def headers(sid: int, block: bytes, flags: int) -> bytes:
        return len(block).to_bytes(3, "big") + bytes([1, flags]) + sid.to_bytes(4, "big") + block

    events = server.receive_data(PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + headers(1, no_te, 0x4))
    assert [type(e) for e in events] == [RequestRejected]  # answered 400 + RST(NO_ERROR)
    events = server.receive_data(headers(3, _GOLDEN_BLOCK, 0x4))
    assert [type(e) for e in events] == [RequestReceived]  # stream 3 now holds the only slot
    _ = server._h2.open_inbound_streams  # let h2 forget closed stream 1, as it does during normal traffic
    assert 1 not in server._h2.streams
    server.data_to_send()
    events = server.receive_data(headers(1, _literal(b"x-trailer", b"1"), 0x5))  # late trailers for stream 1
    assert events == []
    rst_stream_closed = b"\x00\x00\x04\x03\x00\x00\x00\x00\x01\x00\x00\x00\x05"  # RST_STREAM(1, 0x5)
    assert server.data_to_send() == rst_stream_closed
    server.end_response(3, GrpcStatus.OK)
    assert server.data_to_send()  # the connection is still alive


@pytest.mark.parametrize("batches", [pytest.param(100, marks=pytest.mark.slow), 10])
def test_ten_thousand_streams_bounded_memory(batches: int) -> None:
    """10,000 calls (1,000 in the fast tier) on one connection, 100 in flight at a time: bounded state."""
    peer = Peer(max_concurrent_streams=100)
    peer.pump()
    minimal = [(":method", "POST"), (":scheme", "http"), (":path", SEND), (":authority", "a"),
               ("content-type", "application/grpc"), ("te", "trailers")]
    objects_at: dict[int, int] = {}
    for batch in range(batches):
        sids = [peer.open(minimal) for _ in range(100)]
        for sid in sids:
            peer.client.send_data(sid, b"\x00\x00\x00\x00\x00", end_stream=True)
        events = peer.pump()
        assert len(of(events, RequestReceived)) == 100
        assert len(of(events, RequestEnded)) == 100
        assert peer.server.open_streams == 100
        for sid in sids:
            peer.server.end_response(sid, GrpcStatus.OK)
        peer.pump()
        ended = {e.stream_id for e in peer.client_events if isinstance(e, h2.events.StreamEnded)}
        assert ended == set(sids)
        assert not peer.resets()
        peer.client_events.clear()
        if batch in (5, batches - 1):
            gc.collect()
            objects_at[batch] = len(gc.get_objects())
    assert peer.server.open_streams == 0
    assert peer.server._buffered == 0
    assert len(peer.server._h2.streams) <= 100
    # 9,000 more calls leave no per-call objects behind (h2 keeps only a size-limited id -> reason table)
    assert objects_at[batches - 1] - objects_at[5] < 500


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_after_preface_only_wire_error(data: bytes) -> None:
    server = GrpcServerConnection()
    server.initiate()
    try:
        server.receive_data(PREFACE + data)
    except GrpcWireError:
        pass
    server.data_to_send()


def test_measure_unary_round_trip_and_throughput(capsys: pytest.CaptureFixture[str]) -> None:
    """Prints figures (CPU time of this process, so a busy shared machine skews them less); loose bounds."""
    peer = Peer()
    peer.pump()
    request = send_request()
    response = v2.SendMessageResponse(status=v2.Status(code=v2.Code.OK))
    response.entries.add(message_id="01ABC", status=v2.Status(code=v2.Code.OK))
    n = 200
    server_s = 0.0
    t0 = time.process_time()
    for _ in range(n):
        sid = peer.open(request_headers())
        peer.send(sid, encode_message(request), end_stream=True)
        wire = peer.client.data_to_send()
        t1 = time.process_time()
        events = peer.server.receive_data(wire)
        v2.SendMessageRequest.FromString(events[1].payload)  # type: ignore[attr-defined]
        peer.server.send_message(sid, response.SerializeToString())
        peer.server.end_response(sid, GrpcStatus.OK)
        out = peer.server.data_to_send()
        server_s += time.process_time() - t1
        peer.deliver(out)
        peer.pump()
        assert peer.messages(sid)
        peer.client_events.clear()
        peer.received.clear()
    total_us = (time.process_time() - t0) / n * 1e6
    server_us = server_s / n * 1e6

    body = b"m" * (3 * 1024 * 1024)
    big = Peer(client_window=4 * 1024 * 1024, initial_window_bytes=4 * 1024 * 1024)
    big.pump()
    sid = big.open(request_headers())
    big.send(sid, encode_message(body))
    wire = big.client.data_to_send()
    t0 = time.process_time()
    [msg] = of(big.server.receive_data(wire), MessageReceived)
    inbound_s = time.process_time() - t0
    big.client.end_stream(sid)
    big.pump()
    big.server_s = 0.0
    t0 = time.process_time()
    big.server.send_message(sid, msg.payload)  # type: ignore[attr-defined]
    big.server.end_response(sid, GrpcStatus.OK)
    outbound_s = time.process_time() - t0
    big.pump()  # the rest goes out as the client's WINDOW_UPDATEs arrive
    outbound_s += big.server_s
    assert big.messages(sid) == [body]
    mib = len(body) / 1e6
    with capsys.disabled():
        print(f"\n[grpc_wire] unary SendMessage: server side {server_us:.0f} us/call "
              f"(h2 + framing + protobuf decode/encode), client+server {total_us:.0f} us/call; "
              f"3 MiB message through the server codec: in {mib / inbound_s:.0f} MB/s, "
              f"out {mib / outbound_s:.0f} MB/s")
    assert server_us < 20_000
    assert mib / inbound_s > 5
    assert mib / outbound_s > 5
