"""
mqproxy.fuzz.grpc_target
~~~~~~~~~~~~~~~~~~~~~~~~

Fuzz targets for gRPC: the h2-driven connection core (:class:`~mqproxy.codecs.grpc_wire.GrpcServerConnection`:
preface, every frame type, HPACK, request validation, gRPC message framing, flow control, with each
accepted call answered so the outbound paths run too) and the RocketMQ v2 protobuf bodies (every request
message of ``MessagingService`` plus ``TelemetryCommand``; a SendMessageRequest's messages also go through
the store conversion).

Documented errors: :class:`~mqproxy.codecs.grpc_framing.GrpcWireError` for the connection;
``google.protobuf.message.DecodeError`` and :class:`~mqproxy.grpc_service.errors.GrpcServiceError` for bodies.
"""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import hpack
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError
from hyperframe.frame import ContinuationFrame, HeadersFrame, PriorityFrame

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.codecs.grpc_framing import GrpcWireError, MessageReceived, RequestReceived, encode_message
from mqproxy.codecs.grpc_wire import GrpcServerConnection
from mqproxy.fuzz.mutator import Field, Seed
from mqproxy.grpc_service.convert import to_broker_message
from mqproxy.grpc_service.errors import GrpcServiceError

__all__ = ["H2_ERRORS", "PROTOBUF_ERRORS", "h2_run", "h2_seeds", "protobuf_run", "protobuf_seeds"]

H2_ERRORS: tuple[type[BaseException], ...] = (GrpcWireError,)
PROTOBUF_ERRORS: tuple[type[BaseException], ...] = (DecodeError, GrpcServiceError)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SEND = "/apache.rocketmq.v2.MessagingService/SendMessage"
_METHODS = {info.path: info for info in pb.METHODS.values()}
#: The classes the protobuf target decodes: byte 0 of an input picks one.
_CLASSES: tuple[Any, ...] = (*(info.request for info in pb.METHODS.values()), pb.TelemetryCommand)


def h2_run(data: bytes, split: int) -> None:
    """Feed ``data`` (cut at ``split``) to a fresh server connection; answer every call it accepts."""
    conn = GrpcServerConnection(max_message_bytes=64 * 1024, max_buffered_bytes=256 * 1024,
                                max_concurrent_streams=8)
    conn.initiate()
    conn.data_to_send()
    for chunk in (data[:split], data[split:]) if split else (data,):
        for event in conn.receive_data(chunk):
            if isinstance(event, RequestReceived):
                conn.start_response(event.stream_id, [("x-echo", event.method[:32])])
            elif isinstance(event, MessageReceived):
                conn.send_message(event.stream_id, event.payload[:256])
                conn.end_response(event.stream_id, 0, "ok")
        conn.data_to_send()
    conn.shutdown()
    conn.data_to_send()


def protobuf_run(data: bytes, split: int) -> None:
    """Decode ``data[1:]`` as the request class ``data[0]`` picks; convert a SendMessageRequest's messages."""
    if not data:
        return
    cls = _CLASSES[data[0] % len(_CLASSES)]
    message = cls.FromString(data[1:])
    if cls is pb.SendMessageRequest:
        for item in message.messages:
            to_broker_message(item, born_host=("127.0.0.1", 4242), max_body_bytes=4096)


# --- seeds ---------------------------------------------------------------------------------------


def _populate(message: Any, depth: int = 0) -> Any:
    """Set every field of ``message`` (nested messages to depth 3, one map entry, two repeated items)."""
    for field in message.DESCRIPTOR.fields:
        name = field.name
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= 3:
                continue
            if field.message_type.GetOptions().map_entry:
                getattr(message, name)["key"] = "value"
            elif field.is_repeated:
                for _ in range(2):
                    _populate(getattr(message, name).add(), depth + 1)
            else:
                getattr(message, name).SetInParent()
                _populate(getattr(message, name), depth + 1)
            continue
        value = _scalar(field)
        if field.is_repeated:
            getattr(message, name).extend([value, value])
        else:
            setattr(message, name, value)
    return message


def _scalar(field: FieldDescriptor) -> object:
    if field.type == FieldDescriptor.TYPE_ENUM:
        values = field.enum_type.values
        return values[min(1, len(values) - 1)].number
    if field.type == FieldDescriptor.TYPE_STRING:
        return "TopicA" if "topic" in field.name or "name" in field.name else "s-1"
    if field.type == FieldDescriptor.TYPE_BYTES:
        return b"body bytes"
    if field.type == FieldDescriptor.TYPE_BOOL:
        return True
    if field.cpp_type in (FieldDescriptor.CPPTYPE_FLOAT, FieldDescriptor.CPPTYPE_DOUBLE):
        return 1.5
    return 300


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        shift += 7
        if not byte & 0x80:
            return value, at


def _protobuf_fields(data: bytes, start: int, end: int, depth: int = 0) -> list[Field]:
    """The length varints of the length-delimited fields in ``data[start:end]``, nested ones included."""
    out: list[Field] = []
    at = start
    try:
        while at < end:
            tag, at = _read_varint(data, at)
            wire = tag & 7
            if wire == 0:
                _, at = _read_varint(data, at)
            elif wire == 1:
                at += 8
            elif wire == 5:
                at += 4
            elif wire == 2:
                length, body = _read_varint(data, at)
                out.append(Field(at, body - at, varint=True))
                if depth < 3:
                    out += _protobuf_fields(data, body, body + length, depth + 1)
                at = body + length
            else:
                break
    except IndexError:
        pass
    return out


def protobuf_seeds() -> list[Seed]:
    """Each request class fully populated, and empty."""
    out: list[Seed] = []
    for index, cls in enumerate(_CLASSES):
        full = b"%c" % index + _populate(cls()).SerializeToString()
        out.append(Seed(full, tuple(_protobuf_fields(full, 1, len(full)))))
        out.append(Seed(b"%c" % index))
    return out


def _client() -> h2.connection.H2Connection:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    client.initiate_connection()
    return client


def _headers(path: str = _SEND, extra: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "127.0.0.1"),
            ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-timeout", "3S"),
            ("x-mq-client-id", "c@1"), ("trace-bin", "AAEC"), *extra]


def _h2_streams() -> list[bytes]:
    body = encode_message(_populate(pb.SendMessageRequest()).SerializeToString()[:400])
    out: list[bytes] = []
    client = _client()  # one unary call
    sid = client.get_next_available_stream_id()
    client.send_headers(sid, _headers())
    client.send_data(sid, body, end_stream=True)
    out.append(client.data_to_send())
    client = _client()  # two streams, a message split over two DATA frames, PING, WINDOW_UPDATE, RST
    a, b = 1, 3
    client.send_headers(a, _headers("/apache.rocketmq.v2.MessagingService/Telemetry"))
    client.send_headers(b, _headers("/apache.rocketmq.v2.MessagingService/QueryRoute"))
    client.send_data(a, body[:7])
    client.send_data(a, body[7:])
    client.ping(b"12345678")
    client.increment_flow_control_window(1000)
    client.reset_stream(b)
    client.update_settings({4: 1 << 20, 5: 1 << 15})
    client.send_data(a, encode_message(b""), end_stream=True)
    client.close_connection()
    out.append(client.data_to_send())
    client = _client()  # bad requests the codec answers: GET, wrong content type
    client.send_headers(1, [(":method", "GET"), (":scheme", "http"), (":path", "/x"), (":authority", "a")],
                        end_stream=True)
    client.send_headers(3, _headers(extra=(("grpc-encoding", "gzip"),)))
    client.send_data(3, b"\x01" + body[1:], end_stream=True)
    out.append(client.data_to_send())
    # frames h2's client will not send: PRIORITY, HEADERS split into CONTINUATION
    block = hpack.Encoder().encode(_headers())
    headers = HeadersFrame(5, block[:10])
    continuation = ContinuationFrame(5, block[10:], flags=["END_HEADERS"])
    out.append(PREFACE + _EMPTY_SETTINGS + PriorityFrame(1, depends_on=0, stream_weight=16).serialize()
               + headers.serialize() + continuation.serialize())
    return out


def _frame_fields(data: bytes) -> list[Field]:
    """Length (3 bytes) and stream id (4 bytes) of every frame after the preface."""
    out: list[Field] = []
    at = len(PREFACE) if data.startswith(PREFACE) else 0
    while at + 9 <= len(data):
        out += [Field(at, 3), Field(at + 5, 4)]
        at += 9 + int.from_bytes(data[at : at + 3], "big")
    return out


def h2_seeds() -> list[Seed]:
    return [Seed(raw, tuple(_frame_fields(raw))) for raw in _h2_streams()]
