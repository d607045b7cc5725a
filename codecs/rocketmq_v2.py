"""
mqproxy.codecs.rocketmq_v2
~~~~~~~~~~~~~~~~~~~~~~~~~~

The RocketMQ 5 ``apache.rocketmq.v2`` protobuf schema, declared as data and built at import time into a
``FileDescriptorProto`` loaded into a PRIVATE ``DescriptorPool`` (so it never clashes with another
registration of ``apache.rocketmq.v2`` in the process, e.g. rocketmq-python-client's generated modules).

On the wire only field numbers, wire types and enum numbers matter; names follow the upstream schema so
JSON/text renderings match. Enums are ``IntEnum`` types declared here (the single source of their values:
numbered from 0 in declaration order, except :class:`Code`); messages and RPCs are declared in
:mod:`.rocketmq_v2_schema`, messages in a compact proto-like line format parsed by :func:`_build_file`:

    [repeated|optional|oneof <group>] <type> <name> = <number>
    map<string,string> <name> = <number>

Public API: one module attribute per message (``SendMessageRequest``, ``TelemetryCommand``, …; the
``Message`` type is ``RmqMessage`` so it does not shadow protobuf's base class), ``Duration``/``Timestamp``
from the same pool, the enums below, :data:`METHODS` (``:path`` -> :class:`MethodInfo`), :data:`POOL` and
:func:`message_class`. Classes come from ``message_factory.GetMessageClass``; decoding bad bytes raises
``google.protobuf.message.DecodeError`` (the service layer decides what to answer).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, duration_pb2, message_factory, timestamp_pb2
from google.protobuf.message import Message

from mqproxy.codecs.rocketmq_v2_schema import MESSAGES, RPCS

PACKAGE = "apache.rocketmq.v2"
SERVICE = f"{PACKAGE}.MessagingService"
FILE_NAME = "mqproxy/apache_rocketmq_v2.proto"


# --------------------------------------------------------------------------------------------- enums

TransactionResolution = enum.IntEnum(
    "TransactionResolution", "TRANSACTION_RESOLUTION_UNSPECIFIED COMMIT ROLLBACK", start=0
)
TransactionSource = enum.IntEnum(
    "TransactionSource", "SOURCE_UNSPECIFIED SOURCE_CLIENT SOURCE_SERVER_CHECK", start=0
)
Permission = enum.IntEnum("Permission", "PERMISSION_UNSPECIFIED NONE READ WRITE READ_WRITE", start=0)
FilterType = enum.IntEnum("FilterType", "FILTER_TYPE_UNSPECIFIED TAG SQL", start=0)
AddressScheme = enum.IntEnum("AddressScheme", "ADDRESS_SCHEME_UNSPECIFIED IPv4 IPv6 DOMAIN_NAME", start=0)
MessageType = enum.IntEnum(
    "MessageType", "MESSAGE_TYPE_UNSPECIFIED NORMAL FIFO DELAY TRANSACTION LITE PRIORITY", start=0
)
DigestType = enum.IntEnum("DigestType", "DIGEST_TYPE_UNSPECIFIED CRC32 MD5 SHA1", start=0)
ClientType = enum.IntEnum(
    "ClientType",
    "CLIENT_TYPE_UNSPECIFIED PRODUCER PUSH_CONSUMER SIMPLE_CONSUMER "
    "PULL_CONSUMER LITE_PUSH_CONSUMER LITE_SIMPLE_CONSUMER",
    start=0,
)
Encoding = enum.IntEnum("Encoding", "ENCODING_UNSPECIFIED IDENTITY GZIP", start=0)


class Code(enum.IntEnum):
    """Application status carried in response bodies (``Status.code``), not in ``grpc-status``."""

    CODE_UNSPECIFIED = 0
    OK = 20000
    MULTIPLE_RESULTS = 30000
    BAD_REQUEST = 40000
    ILLEGAL_ACCESS_POINT = 40001
    ILLEGAL_TOPIC = 40002
    ILLEGAL_CONSUMER_GROUP = 40003
    ILLEGAL_MESSAGE_TAG = 40004
    ILLEGAL_MESSAGE_KEY = 40005
    ILLEGAL_MESSAGE_GROUP = 40006
    ILLEGAL_MESSAGE_PROPERTY_KEY = 40007
    INVALID_TRANSACTION_ID = 40008
    ILLEGAL_MESSAGE_ID = 40009
    ILLEGAL_FILTER_EXPRESSION = 40010
    ILLEGAL_INVISIBLE_TIME = 40011
    ILLEGAL_DELIVERY_TIME = 40012
    INVALID_RECEIPT_HANDLE = 40013
    MESSAGE_PROPERTY_CONFLICT_WITH_TYPE = 40014
    UNRECOGNIZED_CLIENT_TYPE = 40015
    MESSAGE_CORRUPTED = 40016
    CLIENT_ID_REQUIRED = 40017
    ILLEGAL_POLLING_TIME = 40018
    ILLEGAL_OFFSET = 40019
    ILLEGAL_LITE_TOPIC = 40020
    INVALID_CLIENT_PROPERTIES = 40021
    UNAUTHORIZED = 40100
    PAYMENT_REQUIRED = 40200
    FORBIDDEN = 40300
    NOT_FOUND = 40400
    MESSAGE_NOT_FOUND = 40401
    TOPIC_NOT_FOUND = 40402
    CONSUMER_GROUP_NOT_FOUND = 40403
    OFFSET_NOT_FOUND = 40404
    REQUEST_TIMEOUT = 40800
    PAYLOAD_TOO_LARGE = 41300
    MESSAGE_BODY_TOO_LARGE = 41301
    MESSAGE_BODY_EMPTY = 41302
    PRECONDITION_FAILED = 42800
    TOO_MANY_REQUESTS = 42900
    LITE_TOPIC_QUOTA_EXCEEDED = 42901
    LITE_SUBSCRIPTION_QUOTA_EXCEEDED = 42902
    REQUEST_HEADER_FIELDS_TOO_LARGE = 43100
    MESSAGE_PROPERTIES_TOO_LARGE = 43101
    INTERNAL_ERROR = 50000
    INTERNAL_SERVER_ERROR = 50001
    HA_NOT_AVAILABLE = 50002
    NOT_IMPLEMENTED = 50100
    PROXY_TIMEOUT = 50400
    MASTER_PERSISTENCE_TIMEOUT = 50401
    SLAVE_PERSISTENCE_TIMEOUT = 50402
    UNSUPPORTED = 50500
    VERSION_UNSUPPORTED = 50501
    VERIFY_FIFO_MESSAGE_UNSUPPORTED = 50502
    FAILED_TO_CONSUME_MESSAGE = 60000


Language = enum.IntEnum(
    "Language",
    "LANGUAGE_UNSPECIFIED JAVA CPP DOT_NET GOLANG RUST PYTHON PHP NODE_JS RUBY OBJECTIVE_C DART KOTLIN",
    start=0,
)
QueryOffsetPolicy = enum.IntEnum("QueryOffsetPolicy", "BEGINNING END TIMESTAMP", start=0)
LiteSubscriptionAction = enum.IntEnum(
    "LiteSubscriptionAction", "PARTIAL_ADD PARTIAL_REMOVE COMPLETE_ADD COMPLETE_REMOVE", start=0
)
#: ``OffsetOption.Policy`` (a nested enum upstream).
OffsetPolicy = enum.IntEnum("OffsetPolicy", "LAST MIN MAX", start=0)


#: Top-level enums of the package, by proto name.
ENUMS: Mapping[str, type[enum.IntEnum]] = {
    e.__name__: e
    for e in (
        TransactionResolution, TransactionSource, Permission, FilterType, AddressScheme, MessageType,
        DigestType, ClientType, Encoding, Code, Language, QueryOffsetPolicy, LiteSubscriptionAction,
    )
}
#: Nested enums: (containing message, enum name) -> values.
_NESTED_ENUMS: Mapping[tuple[str, str], type[enum.IntEnum]] = {("OffsetOption", "Policy"): OffsetPolicy}


@dataclass(frozen=True, slots=True)
class MethodInfo:
    """One RPC of ``MessagingService``; ``path`` is the HTTP/2 ``:path``."""

    name: str
    path: str
    request: type[Message]
    response: type[Message]
    client_streaming: bool
    server_streaming: bool


_F = descriptor_pb2.FieldDescriptorProto
_SCALARS: Mapping[str, int] = {
    "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES, "bool": _F.TYPE_BOOL, "int32": _F.TYPE_INT32,
    "int64": _F.TYPE_INT64, "float": _F.TYPE_FLOAT,
}
_WELL_KNOWN: Mapping[str, str] = {
    "Duration": ".google.protobuf.Duration", "Timestamp": ".google.protobuf.Timestamp",
}


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _set_type(field: descriptor_pb2.FieldDescriptorProto, type_name: str) -> None:
    if type_name in _SCALARS:
        field.type = _SCALARS[type_name]  # type: ignore[assignment]
    elif type_name in _WELL_KNOWN:
        field.type = _F.TYPE_MESSAGE
        field.type_name = _WELL_KNOWN[type_name]
    elif type_name in ENUMS or tuple(type_name.split(".")) in _NESTED_ENUMS:
        field.type = _F.TYPE_ENUM
        field.type_name = f".{PACKAGE}.{type_name}"
    elif type_name in MESSAGES:
        field.type = _F.TYPE_MESSAGE
        field.type_name = f".{PACKAGE}.{type_name}"
    else:
        raise ValueError(f"unknown type {type_name!r}")


def _add_enum(target: descriptor_pb2.EnumDescriptorProto, name: str, values: type[enum.IntEnum]) -> None:
    target.name = name
    for member in values:
        target.value.add(name=member.name, number=int(member))


def _build_message(msg: descriptor_pb2.DescriptorProto, name: str, spec: str) -> None:
    msg.name = name
    real_oneofs: list[str] = []
    synthetic: list[tuple[descriptor_pb2.FieldDescriptorProto, str]] = []
    for line in (part.strip() for part in spec.replace("\n", " ").split(";")):
        words = line.split()
        if words[-2] != "=":
            raise ValueError(f"{name}: malformed field line {line!r}")
        number, field_name = int(words[-1]), words[-3]
        field = msg.field.add(name=field_name, number=number, label=_F.LABEL_OPTIONAL)
        head = words[:-3]
        if head[0].startswith("map<"):
            key_type, value_type = head[0][4:-1].split(",")
            entry = msg.nested_type.add(name=f"{_camel(field_name)}Entry")
            entry.options.map_entry = True
            _set_type(entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL), key_type)
            _set_type(entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL), value_type)
            field.label = _F.LABEL_REPEATED
            field.type = _F.TYPE_MESSAGE
            field.type_name = f".{PACKAGE}.{name}.{entry.name}"
            continue
        if head[0] == "repeated":
            field.label = _F.LABEL_REPEATED
        elif head[0] == "optional":
            synthetic.append((field, f"_{field_name}"))
        elif head[0] == "oneof":
            if head[1] not in real_oneofs:
                real_oneofs.append(head[1])
            field.oneof_index = real_oneofs.index(head[1])
        _set_type(field, head[-1])
    for oneof in real_oneofs:
        msg.oneof_decl.add(name=oneof)
    for field, oneof in synthetic:  # proto3 `optional`: synthetic oneofs come after the real ones
        field.proto3_optional = True
        field.oneof_index = len(msg.oneof_decl)
        msg.oneof_decl.add(name=oneof)
    for (owner, enum_name), values in _NESTED_ENUMS.items():
        if owner == name:
            _add_enum(msg.enum_type.add(), enum_name, values)


def _build_file() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(name=FILE_NAME, package=PACKAGE, syntax="proto3")
    fdp.dependency.extend([duration_pb2.DESCRIPTOR.name, timestamp_pb2.DESCRIPTOR.name])
    for enum_name, values in ENUMS.items():
        _add_enum(fdp.enum_type.add(), enum_name, values)
    for msg_name, spec in MESSAGES.items():
        _build_message(fdp.message_type.add(), msg_name, spec)
    service = fdp.service.add(name=SERVICE.rsplit(".", 1)[1])
    for rpc, (client_streaming, server_streaming) in RPCS.items():
        request, response = _rpc_types(rpc)
        service.method.add(
            name=rpc, input_type=f".{PACKAGE}.{request}", output_type=f".{PACKAGE}.{response}",
            client_streaming=client_streaming, server_streaming=server_streaming,
        )
    return fdp


def _rpc_types(rpc: str) -> tuple[str, str]:
    if rpc == "Telemetry":
        return "TelemetryCommand", "TelemetryCommand"
    return f"{rpc}Request", f"{rpc}Response"


def _build_pool() -> descriptor_pool.DescriptorPool:
    new_pool = descriptor_pool.DescriptorPool()
    for wkt in (duration_pb2.DESCRIPTOR, timestamp_pb2.DESCRIPTOR):
        proto = descriptor_pb2.FileDescriptorProto()
        wkt.CopyToProto(proto)
        new_pool.Add(proto)
    new_pool.Add(_build_file())
    return new_pool


#: The private pool holding the schema (and the Duration/Timestamp well-known types it uses).
POOL = _build_pool()


def message_class(name: str) -> type[Message]:
    """The message class for ``name`` (``"SendMessageRequest"``, ``"google.protobuf.Duration"``)."""
    full_name = name if "." in name else f"{PACKAGE}.{name}"
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(full_name))


#: ``:path`` -> method, for all 17 RPCs of ``MessagingService``.
METHODS: Mapping[str, MethodInfo] = {
    f"/{SERVICE}/{m.name}": MethodInfo(
        name=m.name, path=f"/{SERVICE}/{m.name}", request=message_class(m.input_type.name),
        response=message_class(m.output_type.name), client_streaming=m.client_streaming,
        server_streaming=m.server_streaming,
    )
    for m in POOL.FindServiceByName(SERVICE).methods
}

def _dynamic(name: str) -> Any:
    """A message class typed ``Any``: its fields exist only at runtime, so static checkers cannot see them."""
    return message_class(name)


Duration = _dynamic("google.protobuf.Duration")
Timestamp = _dynamic("google.protobuf.Timestamp")

FilterExpression = _dynamic("FilterExpression")
RetryPolicy = _dynamic("RetryPolicy")
ExponentialBackoff = _dynamic("ExponentialBackoff")
CustomizedBackoff = _dynamic("CustomizedBackoff")
Resource = _dynamic("Resource")
SubscriptionEntry = _dynamic("SubscriptionEntry")
Address = _dynamic("Address")
Endpoints = _dynamic("Endpoints")
Broker = _dynamic("Broker")
MessageQueue = _dynamic("MessageQueue")
Digest = _dynamic("Digest")
SystemProperties = _dynamic("SystemProperties")
DeadLetterQueue = _dynamic("DeadLetterQueue")
RmqMessage = _dynamic("Message")  # "Message" would shadow google.protobuf.message.Message
Assignment = _dynamic("Assignment")
Status = _dynamic("Status")
UA = _dynamic("UA")
Settings = _dynamic("Settings")
Publishing = _dynamic("Publishing")
Subscription = _dynamic("Subscription")
Metric = _dynamic("Metric")
OffsetOption = _dynamic("OffsetOption")
QueryRouteRequest = _dynamic("QueryRouteRequest")
QueryRouteResponse = _dynamic("QueryRouteResponse")
SendMessageRequest = _dynamic("SendMessageRequest")
SendResultEntry = _dynamic("SendResultEntry")
SendMessageResponse = _dynamic("SendMessageResponse")
QueryAssignmentRequest = _dynamic("QueryAssignmentRequest")
QueryAssignmentResponse = _dynamic("QueryAssignmentResponse")
ReceiveMessageRequest = _dynamic("ReceiveMessageRequest")
ReceiveMessageResponse = _dynamic("ReceiveMessageResponse")
AckMessageEntry = _dynamic("AckMessageEntry")
AckMessageRequest = _dynamic("AckMessageRequest")
AckMessageResultEntry = _dynamic("AckMessageResultEntry")
AckMessageResponse = _dynamic("AckMessageResponse")
ForwardMessageToDeadLetterQueueRequest = _dynamic("ForwardMessageToDeadLetterQueueRequest")
ForwardMessageToDeadLetterQueueResponse = _dynamic("ForwardMessageToDeadLetterQueueResponse")
HeartbeatRequest = _dynamic("HeartbeatRequest")
HeartbeatResponse = _dynamic("HeartbeatResponse")
EndTransactionRequest = _dynamic("EndTransactionRequest")
EndTransactionResponse = _dynamic("EndTransactionResponse")
PrintThreadStackTraceCommand = _dynamic("PrintThreadStackTraceCommand")
ReconnectEndpointsCommand = _dynamic("ReconnectEndpointsCommand")
ThreadStackTrace = _dynamic("ThreadStackTrace")
VerifyMessageCommand = _dynamic("VerifyMessageCommand")
VerifyMessageResult = _dynamic("VerifyMessageResult")
RecoverOrphanedTransactionCommand = _dynamic("RecoverOrphanedTransactionCommand")
NotifyUnsubscribeLiteCommand = _dynamic("NotifyUnsubscribeLiteCommand")
TelemetryCommand = _dynamic("TelemetryCommand")
NotifyClientTerminationRequest = _dynamic("NotifyClientTerminationRequest")
NotifyClientTerminationResponse = _dynamic("NotifyClientTerminationResponse")
ChangeInvisibleDurationRequest = _dynamic("ChangeInvisibleDurationRequest")
ChangeInvisibleDurationResponse = _dynamic("ChangeInvisibleDurationResponse")
PullMessageRequest = _dynamic("PullMessageRequest")
PullMessageResponse = _dynamic("PullMessageResponse")
UpdateOffsetRequest = _dynamic("UpdateOffsetRequest")
UpdateOffsetResponse = _dynamic("UpdateOffsetResponse")
GetOffsetRequest = _dynamic("GetOffsetRequest")
GetOffsetResponse = _dynamic("GetOffsetResponse")
QueryOffsetRequest = _dynamic("QueryOffsetRequest")
QueryOffsetResponse = _dynamic("QueryOffsetResponse")
RecallMessageRequest = _dynamic("RecallMessageRequest")
RecallMessageResponse = _dynamic("RecallMessageResponse")
SyncLiteSubscriptionRequest = _dynamic("SyncLiteSubscriptionRequest")
SyncLiteSubscriptionResponse = _dynamic("SyncLiteSubscriptionResponse")
