"""The apache.rocketmq.v2 schema: field numbers/types per spec/grpc.md, enums, round trips, golden bytes."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.codecs import rocketmq_v2 as v2

# Transcribed independently from spec/grpc.md §1 (the telemetry sub-commands at the end from upstream
# service.proto): "Message: field=number:type" where the type has a suffix
# `*` (repeated), `?` (proto3 optional), `@group` (member of oneof `group`); `map` is map<string,string>.
EXPECTED = """
Resource: resource_namespace=1:string name=2:string
Address: host=1:string port=2:int32
Endpoints: scheme=1:AddressScheme addresses=2:Address*
Broker: name=1:string id=2:int32 endpoints=3:Endpoints
MessageQueue: topic=1:Resource id=2:int32 permission=3:Permission broker=4:Broker
  accept_message_types=5:MessageType*
Message: topic=1:Resource user_properties=2:map system_properties=3:SystemProperties body=4:bytes
SystemProperties: tag=1:string? keys=2:string* message_id=3:string body_digest=4:Digest
  body_encoding=5:Encoding message_type=6:MessageType born_timestamp=7:Timestamp born_host=8:string
  store_timestamp=9:Timestamp? store_host=10:string delivery_timestamp=11:Timestamp?
  receipt_handle=12:string? queue_id=13:int32 queue_offset=14:int64? invisible_duration=15:Duration?
  delivery_attempt=16:int32? message_group=17:string? trace_context=18:string?
  orphaned_transaction_recovery_duration=19:Duration? dead_letter_queue=20:DeadLetterQueue?
  lite_topic=21:string? priority=22:int32?
DeadLetterQueue: topic=1:string message_id=2:string
Digest: type=1:DigestType checksum=2:string
FilterExpression: type=1:FilterType expression=2:string
SubscriptionEntry: topic=1:Resource expression=2:FilterExpression
UA: language=1:Language version=2:string platform=3:string hostname=4:string
RetryPolicy: max_attempts=1:int32 exponential_backoff=2:ExponentialBackoff@strategy
  customized_backoff=3:CustomizedBackoff@strategy
ExponentialBackoff: initial=1:Duration max=2:Duration multiplier=3:float
CustomizedBackoff: next=1:Duration*
Settings: client_type=1:ClientType? access_point=2:Endpoints? backoff_policy=3:RetryPolicy?
  request_timeout=4:Duration? publishing=5:Publishing@pub_sub subscription=6:Subscription@pub_sub
  user_agent=7:UA metric=8:Metric client_properties=9:map
Publishing: topics=1:Resource* max_body_size=2:int32 validate_message_type=3:bool
Subscription: group=1:Resource? subscriptions=2:SubscriptionEntry* fifo=3:bool? receive_batch_size=4:int32?
  long_polling_timeout=5:Duration? lite_subscription_quota=6:int32? max_lite_topic_size=7:int32?
Metric: on=1:bool endpoints=2:Endpoints?
OffsetOption: policy=1:Policy@offset_type offset=2:int64@offset_type tail_n=3:int64@offset_type
  timestamp=4:int64@offset_type
Status: code=1:Code message=2:string
Assignment: message_queue=1:MessageQueue
QueryRouteRequest: topic=1:Resource endpoints=2:Endpoints
QueryRouteResponse: status=1:Status message_queues=2:MessageQueue*
HeartbeatRequest: group=1:Resource? client_type=2:ClientType
HeartbeatResponse: status=1:Status
SendMessageRequest: messages=1:Message*
SendMessageResponse: status=1:Status entries=2:SendResultEntry*
SendResultEntry: status=1:Status message_id=2:string transaction_id=3:string offset=4:int64
  recall_handle=5:string
QueryAssignmentRequest: topic=1:Resource group=2:Resource endpoints=3:Endpoints
QueryAssignmentResponse: status=1:Status assignments=2:Assignment*
ReceiveMessageRequest: group=1:Resource message_queue=2:MessageQueue filter_expression=3:FilterExpression
  batch_size=4:int32 invisible_duration=5:Duration? auto_renew=6:bool long_polling_timeout=7:Duration?
  attempt_id=8:string?
ReceiveMessageResponse: status=1:Status@content message=2:Message@content
  delivery_timestamp=3:Timestamp@content
AckMessageRequest: group=1:Resource topic=2:Resource entries=3:AckMessageEntry*
AckMessageEntry: message_id=1:string receipt_handle=2:string lite_topic=3:string?
AckMessageResponse: status=1:Status entries=2:AckMessageResultEntry*
AckMessageResultEntry: message_id=1:string receipt_handle=2:string status=3:Status
ChangeInvisibleDurationRequest: group=1:Resource topic=2:Resource receipt_handle=3:string
  invisible_duration=4:Duration message_id=5:string lite_topic=6:string? suspend=7:bool?
ChangeInvisibleDurationResponse: status=1:Status receipt_handle=2:string
ForwardMessageToDeadLetterQueueRequest: group=1:Resource topic=2:Resource receipt_handle=3:string
  message_id=4:string delivery_attempt=5:int32 max_delivery_attempts=6:int32 lite_topic=7:string?
ForwardMessageToDeadLetterQueueResponse: status=1:Status
EndTransactionRequest: topic=1:Resource message_id=2:string transaction_id=3:string
  resolution=4:TransactionResolution source=5:TransactionSource trace_context=6:string
EndTransactionResponse: status=1:Status
NotifyClientTerminationRequest: group=1:Resource?
NotifyClientTerminationResponse: status=1:Status
PullMessageRequest: group=1:Resource message_queue=2:MessageQueue offset=3:int64 batch_size=4:int32
  filter_expression=5:FilterExpression long_polling_timeout=6:Duration
PullMessageResponse: status=1:Status@content message=2:Message@content next_offset=3:int64@content
UpdateOffsetRequest: group=1:Resource message_queue=2:MessageQueue offset=3:int64
UpdateOffsetResponse: status=1:Status
GetOffsetRequest: group=1:Resource message_queue=2:MessageQueue
GetOffsetResponse: status=1:Status offset=2:int64
QueryOffsetRequest: message_queue=1:MessageQueue query_offset_policy=2:QueryOffsetPolicy
  timestamp=3:Timestamp?
QueryOffsetResponse: status=1:Status offset=2:int64
RecallMessageRequest: topic=1:Resource recall_handle=2:string
RecallMessageResponse: status=1:Status message_id=2:string
SyncLiteSubscriptionRequest: action=1:LiteSubscriptionAction topic=2:Resource group=3:Resource
  lite_topic_set=4:string* version=5:int64? offset_option=6:OffsetOption?
SyncLiteSubscriptionResponse: status=1:Status
TelemetryCommand: status=1:Status? settings=2:Settings@command thread_stack_trace=3:ThreadStackTrace@command
  verify_message_result=4:VerifyMessageResult@command
  recover_orphaned_transaction_command=5:RecoverOrphanedTransactionCommand@command
  print_thread_stack_trace_command=6:PrintThreadStackTraceCommand@command
  verify_message_command=7:VerifyMessageCommand@command
  reconnect_endpoints_command=8:ReconnectEndpointsCommand@command
  notify_unsubscribe_lite_command=9:NotifyUnsubscribeLiteCommand@command
PrintThreadStackTraceCommand: nonce=1:string
ReconnectEndpointsCommand: nonce=1:string
ThreadStackTrace: nonce=1:string thread_stack_trace=2:string?
VerifyMessageCommand: nonce=1:string message=2:Message
VerifyMessageResult: nonce=1:string
RecoverOrphanedTransactionCommand: message=1:Message transaction_id=2:string
NotifyUnsubscribeLiteCommand: lite_topic=1:string
"""

_SCALAR_TYPES = {
    "string": FieldDescriptor.TYPE_STRING,
    "bytes": FieldDescriptor.TYPE_BYTES,
    "bool": FieldDescriptor.TYPE_BOOL,
    "int32": FieldDescriptor.TYPE_INT32,
    "int64": FieldDescriptor.TYPE_INT64,
    "float": FieldDescriptor.TYPE_FLOAT,
}


def _expected_rows() -> list[tuple[str, str, int, str, str]]:
    rows, message = [], ""
    for token in EXPECTED.split():
        if token.endswith(":") and "=" not in token:
            message = token[:-1]
            continue
        name, rest = token.split("=")
        number, type_spec = rest.split(":")
        kind = ""
        if type_spec.endswith(("*", "?")):
            type_spec, kind = type_spec[:-1], type_spec[-1]
        elif "@" in type_spec:
            type_spec, group = type_spec.split("@")
            kind = "@" + group
        rows.append((message, name, int(number), type_spec, kind))
    return rows


ROWS = _expected_rows()


def _descriptor(message: str) -> Descriptor:
    return v2.POOL.FindMessageTypeByName(f"apache.rocketmq.v2.{message}")


def test_expected_table_covers_every_message_in_the_pool() -> None:
    file = v2.POOL.FindFileByName(v2.FILE_NAME)
    assert set(file.message_types_by_name) == {row[0] for row in ROWS} == set(v2.MESSAGES)


@pytest.mark.parametrize(
    ("message", "name", "number", "type_name", "kind"), ROWS, ids=[f"{r[0]}.{r[1]}" for r in ROWS]
)
def test_field(message: str, name: str, number: int, type_name: str, kind: str) -> None:
    field = _descriptor(message).fields_by_name[name]
    assert field.number == number
    if type_name == "map":
        entry = field.message_type
        assert entry.GetOptions().map_entry
        assert [(f.name, f.number, f.type) for f in entry.fields] == [
            ("key", 1, FieldDescriptor.TYPE_STRING),
            ("value", 2, FieldDescriptor.TYPE_STRING),
        ]
        return
    if type_name in _SCALAR_TYPES:
        assert field.type == _SCALAR_TYPES[type_name]
    elif field.type == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type.name == type_name
    else:
        assert field.type == FieldDescriptor.TYPE_MESSAGE
        assert field.message_type.name == type_name
    assert field.is_repeated == (kind == "*")
    if kind == "?":
        assert field.has_presence
        assert field.containing_oneof is not None
        assert field.containing_oneof.name == f"_{name}"  # synthetic oneof of proto3 `optional`
    elif kind.startswith("@"):
        assert field.containing_oneof is not None
        assert field.containing_oneof.name == kind[1:]
    else:
        assert field.containing_oneof is None


def test_no_undeclared_fields() -> None:
    by_message: dict[str, set[str]] = {}
    for message, name, *_ in ROWS:
        by_message.setdefault(message, set()).add(name)
    for message, names in by_message.items():
        assert set(_descriptor(message).fields_by_name) == names, message


@pytest.mark.parametrize(
    ("enum", "values"),
    [
        (
            v2.Code,
            {
                "CODE_UNSPECIFIED": 0,
                "OK": 20000,
                "MULTIPLE_RESULTS": 30000,
                "BAD_REQUEST": 40000,
                "ILLEGAL_TOPIC": 40002,
                "ILLEGAL_MESSAGE_ID": 40009,
                "INVALID_RECEIPT_HANDLE": 40013,
                "UNRECOGNIZED_CLIENT_TYPE": 40015,
                "INVALID_CLIENT_PROPERTIES": 40021,
                "UNAUTHORIZED": 40100,
                "FORBIDDEN": 40300,
                "NOT_FOUND": 40400,
                "MESSAGE_NOT_FOUND": 40401,
                "TOPIC_NOT_FOUND": 40402,
                "CONSUMER_GROUP_NOT_FOUND": 40403,
                "REQUEST_TIMEOUT": 40800,
                "PAYLOAD_TOO_LARGE": 41300,
                "MESSAGE_BODY_TOO_LARGE": 41301,
                "MESSAGE_BODY_EMPTY": 41302,
                "TOO_MANY_REQUESTS": 42900,
                "MESSAGE_PROPERTIES_TOO_LARGE": 43101,
                "INTERNAL_ERROR": 50000,
                "INTERNAL_SERVER_ERROR": 50001,
                "NOT_IMPLEMENTED": 50100,
                "PROXY_TIMEOUT": 50400,
                "UNSUPPORTED": 50500,
                "VERIFY_FIFO_MESSAGE_UNSUPPORTED": 50502,
                "FAILED_TO_CONSUME_MESSAGE": 60000,
            },
        ),
        (
            v2.MessageType,
            {
                "MESSAGE_TYPE_UNSPECIFIED": 0,
                "NORMAL": 1,
                "FIFO": 2,
                "DELAY": 3,
                "TRANSACTION": 4,
                "LITE": 5,
                "PRIORITY": 6,
            },
        ),
        (v2.Permission, {"PERMISSION_UNSPECIFIED": 0, "NONE": 1, "READ": 2, "WRITE": 3, "READ_WRITE": 4}),
        (
            v2.ClientType,
            {
                "CLIENT_TYPE_UNSPECIFIED": 0,
                "PRODUCER": 1,
                "PUSH_CONSUMER": 2,
                "SIMPLE_CONSUMER": 3,
                "PULL_CONSUMER": 4,
                "LITE_PUSH_CONSUMER": 5,
                "LITE_SIMPLE_CONSUMER": 6,
            },
        ),
        (v2.AddressScheme, {"ADDRESS_SCHEME_UNSPECIFIED": 0, "IPv4": 1, "IPv6": 2, "DOMAIN_NAME": 3}),
        (v2.DigestType, {"DIGEST_TYPE_UNSPECIFIED": 0, "CRC32": 1, "MD5": 2, "SHA1": 3}),
        (v2.Encoding, {"ENCODING_UNSPECIFIED": 0, "IDENTITY": 1, "GZIP": 2}),
        (v2.FilterType, {"FILTER_TYPE_UNSPECIFIED": 0, "TAG": 1, "SQL": 2}),
        (v2.TransactionResolution, {"TRANSACTION_RESOLUTION_UNSPECIFIED": 0, "COMMIT": 1, "ROLLBACK": 2}),
        (v2.TransactionSource, {"SOURCE_UNSPECIFIED": 0, "SOURCE_CLIENT": 1, "SOURCE_SERVER_CHECK": 2}),
        (
            v2.Language,
            {
                "LANGUAGE_UNSPECIFIED": 0,
                "JAVA": 1,
                "CPP": 2,
                "DOT_NET": 3,
                "GOLANG": 4,
                "RUST": 5,
                "PYTHON": 6,
                "PHP": 7,
                "NODE_JS": 8,
                "RUBY": 9,
                "OBJECTIVE_C": 10,
                "DART": 11,
                "KOTLIN": 12,
            },
        ),
        (v2.QueryOffsetPolicy, {"BEGINNING": 0, "END": 1, "TIMESTAMP": 2}),
        (
            v2.LiteSubscriptionAction,
            {"PARTIAL_ADD": 0, "PARTIAL_REMOVE": 1, "COMPLETE_ADD": 2, "COMPLETE_REMOVE": 3},
        ),
        (v2.OffsetPolicy, {"LAST": 0, "MIN": 1, "MAX": 2}),
    ],
)
def test_enum_values(enum: type, values: dict[str, int]) -> None:
    for name, number in values.items():
        assert enum[name] == number  # type: ignore[index]
    name = "OffsetOption.Policy" if enum is v2.OffsetPolicy else enum.__name__
    full = f"apache.rocketmq.v2.{name}"
    descriptor = v2.POOL.FindEnumTypeByName(full)
    members = {m.name: int(m) for m in enum}  # type: ignore[attr-defined]
    assert {v.name: v.number for v in descriptor.values} == members
    if enum is v2.Code:
        assert len(descriptor.values) == 54


def test_service_methods_and_streaming_flags() -> None:
    assert len(v2.METHODS) == 17
    streaming = {m.name: (m.client_streaming, m.server_streaming) for m in v2.METHODS.values()}
    assert streaming.pop("ReceiveMessage") == (False, True)
    assert streaming.pop("PullMessage") == (False, True)
    assert streaming.pop("Telemetry") == (True, True)
    assert set(streaming.values()) == {(False, False)}
    send = v2.METHODS["/apache.rocketmq.v2.MessagingService/SendMessage"]
    assert (send.request, send.response) == (v2.SendMessageRequest, v2.SendMessageResponse)
    assert v2.METHODS["/apache.rocketmq.v2.MessagingService/Telemetry"].request is v2.TelemetryCommand


def test_schema_lives_in_a_private_pool() -> None:
    with pytest.raises(KeyError):
        descriptor_pool.Default().FindMessageTypeByName("apache.rocketmq.v2.Message")
    assert v2.RmqMessage.DESCRIPTOR.full_name == "apache.rocketmq.v2.Message"


# ------------------------------------------------------------------------------------- golden bytes


def test_golden_bytes() -> None:
    assert v2.Status(code=v2.Code.OK, message="ok").SerializeToString() == b"\x08\xa0\x9c\x01\x12\x02ok"
    assert v2.Resource(name="T").SerializeToString() == b"\x12\x01T"
    msg = v2.RmqMessage(body=b"x")
    msg.user_properties["a"] = "b"
    assert msg.SerializeToString() == b"\x12\x06\x0a\x01a\x12\x01b\x22\x01x"
    # proto3 `optional`: an explicitly set empty tag is on the wire, an unset one is not
    props = v2.SystemProperties(tag="")
    assert props.HasField("tag")
    assert props.SerializeToString() == b"\x0a\x00"
    assert v2.SystemProperties().SerializeToString() == b""
    assert v2.SendResultEntry(offset=-1).SerializeToString() == b"\x20" + b"\xff" * 9 + b"\x01"
    assert v2.ReceiveMessageRequest(batch_size=32).SerializeToString() == b"\x20\x20"


def test_golden_decode_of_a_python_client_heartbeat() -> None:
    # HeartbeatRequest{group{name "GroupTest"}, client_type SIMPLE_CONSUMER} as the Python client encodes it
    wire = b"\x0a\x0b\x12\x09GroupTest\x10\x03"
    hb = v2.HeartbeatRequest.FromString(wire)
    assert hb.HasField("group")
    assert hb.group.name == "GroupTest"
    assert hb.client_type == v2.ClientType.SIMPLE_CONSUMER


# ---------------------------------------------------------------------------------------- round trips


def _message(body: bytes = b"hello") -> object:
    m = v2.RmqMessage()
    m.topic.resource_namespace = "ns"
    m.topic.name = "TopicTest"
    m.user_properties["p1"] = "v1"
    m.user_properties["中文"] = "值"
    sp = m.system_properties
    sp.tag = "TagA"
    sp.keys.extend(["k1", "k2"])
    sp.message_id = "01AABBCCDDEEFF"
    sp.body_digest.type = v2.DigestType.MD5
    sp.body_digest.checksum = "5D41402ABC4B2A76B9719D911017C592"
    sp.body_encoding = v2.Encoding.IDENTITY
    sp.message_type = v2.MessageType.NORMAL
    sp.born_timestamp.FromMilliseconds(1_700_000_000_123)
    sp.born_host = "10.0.0.1"
    sp.queue_id = 0
    sp.queue_offset = 0
    sp.delivery_attempt = 1
    sp.invisible_duration.FromSeconds(15)
    m.body = body
    return m


def test_send_message_request_round_trip() -> None:
    req = v2.SendMessageRequest()
    req.messages.append(_message())
    req.messages.append(_message(b"\x00" * 3 * 1024 * 1024))
    back = v2.SendMessageRequest.FromString(req.SerializeToString())
    assert back == req
    sp = back.messages[0].system_properties
    assert sp.HasField("queue_offset")
    assert sp.queue_offset == 0
    assert not sp.HasField("receipt_handle")
    assert not sp.HasField("message_group")
    assert sp.born_timestamp.ToMilliseconds() == 1_700_000_000_123
    assert sp.invisible_duration.ToSeconds() == 15
    assert dict(back.messages[0].user_properties) == {"p1": "v1", "中文": "值"}
    assert len(back.messages[1].body) == 3 * 1024 * 1024


def test_receive_message_response_oneof_round_trips() -> None:
    not_found = v2.Status(code=v2.Code.MESSAGE_NOT_FOUND, message="no new message")
    status = v2.ReceiveMessageResponse(status=not_found)
    message = v2.ReceiveMessageResponse(message=_message())
    stamp = v2.ReceiveMessageResponse()
    stamp.delivery_timestamp.GetCurrentTime()
    for original, case in ((status, "status"), (message, "message"), (stamp, "delivery_timestamp")):
        back = v2.ReceiveMessageResponse.FromString(original.SerializeToString())
        assert back == original
        assert back.WhichOneof("content") == case
    # setting another member clears the previous one
    status.message.body = b"x"
    assert status.WhichOneof("content") == "message"
    assert not status.HasField("status")


def test_telemetry_command_with_settings_round_trip() -> None:
    cmd = v2.TelemetryCommand()
    s = cmd.settings
    s.client_type = v2.ClientType.PRODUCER
    s.access_point.scheme = v2.AddressScheme.IPv4
    s.access_point.addresses.add(host="127.0.0.1", port=8081)
    s.request_timeout.FromSeconds(3)
    s.publishing.topics.add(name="TopicTest")
    s.publishing.max_body_size = 4 * 1024 * 1024
    s.publishing.validate_message_type = True
    s.user_agent.language = v2.Language.PYTHON
    s.user_agent.version = "5.1.2"
    s.metric.on = False
    s.client_properties["k"] = "v"
    reply = v2.TelemetryCommand()
    reply.CopyFrom(cmd)
    reply.status.code = v2.Code.OK
    backoff = reply.settings.backoff_policy
    backoff.max_attempts = 3
    backoff.exponential_backoff.initial.FromMilliseconds(10)
    backoff.exponential_backoff.max.FromSeconds(1)
    backoff.exponential_backoff.multiplier = 2.0
    for original in (cmd, reply):
        back = v2.TelemetryCommand.FromString(original.SerializeToString())
        assert back == original
        assert back.WhichOneof("command") == "settings"
        assert back.settings.WhichOneof("pub_sub") == "publishing"
    back = v2.TelemetryCommand.FromString(reply.SerializeToString())
    assert back.HasField("status")
    assert back.status.code == v2.Code.OK
    assert back.settings.backoff_policy.WhichOneof("strategy") == "exponential_backoff"
    assert back.settings.backoff_policy.exponential_backoff.multiplier == 2.0
    assert not v2.TelemetryCommand.FromString(cmd.SerializeToString()).HasField("status")


def test_lite_and_offset_messages_round_trip() -> None:
    req = v2.SyncLiteSubscriptionRequest(action=v2.LiteSubscriptionAction.COMPLETE_ADD, version=0)
    req.lite_topic_set.extend(["a", "b"])
    req.offset_option.policy = v2.OffsetPolicy.MIN
    back = v2.SyncLiteSubscriptionRequest.FromString(req.SerializeToString())
    assert back == req
    assert back.HasField("version")
    assert back.offset_option.WhichOneof("offset_type") == "policy"


# ------------------------------------------------------------------------------------------ bad input


def test_truncated_protobuf_raises_decode_error() -> None:
    wire = v2.SendMessageRequest(messages=[_message()]).SerializeToString()
    with pytest.raises(DecodeError):
        v2.SendMessageRequest.FromString(wire[:-3])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=128))
def test_fuzz_decode_only_decode_error(data: bytes) -> None:
    for cls in (v2.SendMessageRequest, v2.TelemetryCommand, v2.ReceiveMessageRequest):
        try:
            cls.FromString(data)
        except DecodeError:
            pass
