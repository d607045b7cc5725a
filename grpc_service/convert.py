"""
mqproxy.grpc_service.convert
~~~~~~~~~~~~~~~~~~~~~~~~~~~~

``apache.rocketmq.v2.Message`` <-> :class:`~mqproxy.model.types.Message` /
:class:`~mqproxy.model.types.StoredMessage`, with the property conventions the remoting side uses, so a
message crosses protocols intact (Apache proxy ``SendMessageActivity``/``GrpcConverter`` semantics):

=========================  ==========================================================
v2 ``SystemProperties``    stored property
=========================  ==========================================================
``tag``                    ``TAGS``
``keys`` (repeated)        ``KEYS`` (space-separated)
``message_id``             ``UNIQ_KEY`` (read back: ``UNIQ_KEY``, else the offset msg id)
``message_group``          ``__SHARDINGKEY`` (FIFO)
``delivery_timestamp``     ``TIMER_DELIVER_MS`` (DELAY)
``trace_context``          ``TRACE_CONTEXT``
``born_host``              ``__BORNHOST`` (the client's own name for itself; delivered back as sent,
                           else the connection's IP)
``message_type`` TRANSACT  ``TRAN_MSG=true``, ``CHECK_IMMUNITY_TIME_IN_SECONDS``, sysFlag PREPARED
=========================  ==========================================================

``user_properties`` are stored verbatim; a user key that RocketMQ reserves is refused. Bodies are stored
uncompressed (a GZIP body is inflated on send; a remoting body with the zlib sysFlag is inflated on
delivery), so both protocols read plain bytes. Pure functions; errors are :class:`ConvertError` carrying
the v2 ``Code`` to answer with.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.codecs.message_record import SYSFLAG_COMPRESSED, SYSFLAG_TRANSACTION_PREPARED
from mqproxy.grpc_service.errors import ApiError
from mqproxy.model.errors import IllegalTopic
from mqproxy.model.ids import MessageIdError, offset_msg_id
from mqproxy.model.properties import MAX_PROPERTIES_BYTES, PROPERTY_HALF_TIME_MS, properties_size
from mqproxy.model.topics import RETRY_PREFIX, is_send_forbidden, validate_send_topic
from mqproxy.model.types import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, Message, StoredMessage

__all__ = [
    "PROPERTY_SHARDING_KEY",
    "PROPERTY_TRACE_CONTEXT",
    "RESERVED_PROPERTY_KEYS",
    "ConvertError",
    "body_digest",
    "message_type_of",
    "to_broker_message",
    "to_rmq_message",
]

PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
PROPERTY_TRACE_CONTEXT = "TRACE_CONTEXT"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_DELAY_LEVEL = "DELAY"
#: The born host a gRPC client declares (``MessageConst.PROPERTY_BORN_HOST``).
PROPERTY_BORN_HOST = "__BORNHOST"

#: Property keys a client may not set as user properties (RocketMQ ``MessageConst.STRING_HASH_SET``
#: plus the keys this module maps from system properties). They are also hidden from ``user_properties``
#: on delivery.
RESERVED_PROPERTY_KEYS = frozenset(
    {
        "TRACE_ON",
        "MSG_REGION",
        "KEYS",
        "TAGS",
        "WAIT",
        "DELAY",
        "RETRY_TOPIC",
        "REAL_TOPIC",
        "REAL_QID",
        "TRAN_MSG",
        "PGROUP",
        "MIN_OFFSET",
        "MAX_OFFSET",
        "BUYER_ID",
        "ORIGIN_MESSAGE_ID",
        "TRANSFER_FLAG",
        "CORRECTION_FLAG",
        "MQ2_FLAG",
        "RECONSUME_TIME",
        "UNIQ_KEY",
        "MAX_RECONSUME_TIMES",
        "CONSUME_START_TIME",
        "POP_CK",
        "POP_CK_OFFSET",
        "1ST_POP_TIME",
        "TRAN_PREPARED_QUEUE_OFFSET",
        "DUP_INFO",
        "EXTEND_UNIQ_INFO",
        "INSTANCE_ID",
        "CORRELATION_ID",
        "REPLY_TO_CLIENT",
        "TTL",
        "ARRIVE_TIME",
        "PUSH_REPLY_TIME",
        "CLUSTER",
        "MSG_TYPE",
        "INNER_MULTI_QUEUE_OFFSET",
        "TIMER_DELAY_SEC",
        "TIMER_DELIVER_MS",
        "TIMER_ENQUEUE_MS",
        "TIMER_DEQUEUE_MS",
        "TIMER_ROLL_TIMES",
        "TIMER_OUT_MS",
        "TIMER_DEL_UNIQKEY",
        "TIMER_DELAY_LEVEL",
        PROPERTY_BORN_HOST,
        "BORN_TIMESTAMP",
        PROPERTY_SHARDING_KEY,
        PROPERTY_TRACE_CONTEXT,
        PROPERTY_CHECK_IMMUNITY,
        "INNER_MULTI_DISPATCH",
        "__transactionId__",
        "TRANSACTION_CHECK_TIMES",
        "TIMER_DELAY_MS",
        "SCHEDULE_DUE_MS",
        "DLQ_ORIGIN_TOPIC",
        "DLQ_ORIGIN_MESSAGE_ID",
        PROPERTY_HALF_TIME_MS,
    }
)
#: Properties that make a message a DELAY one.
_DELAY_PROPERTIES = (PROPERTY_DELAY_LEVEL, PROPERTY_TIMER_DELIVER_MS, "TIMER_DELAY_SEC", "TIMER_DELAY_MS")
#: Characters that would corrupt the remoting properties encoding (``k\x01v\x02``).
_SEPARATORS = ("\x01", "\x02")


class ConvertError(ApiError):
    """A message that cannot be stored; ``code`` is the v2 ``Code`` to answer with."""


def _has_separator(text: str) -> bool:
    return any(s in text for s in _SEPARATORS)


def _timestamp_ms(ts: object) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000  # type: ignore[attr-defined]


def _timestamp(ms: int) -> object:
    return pb.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def _inflate(data: bytes, wbits: int, limit: int) -> bytes | None:
    """``data`` decompressed, or None if it is corrupt or inflates beyond ``limit`` bytes."""
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error:
        return None
    if len(out) > limit or not inflater.eof:
        return None
    return out


def to_broker_message(
    msg: object,
    *,
    born_host: tuple[str, int],
    max_body_bytes: int,
) -> Message:
    """The :class:`Message` to store for a v2 ``Message``; raises :class:`ConvertError`.

    ``queue_id`` is left at -1: queue selection (FIFO hashing) is the caller's.
    """
    sp = msg.system_properties  # type: ignore[attr-defined]
    topic = msg.topic.name  # type: ignore[attr-defined]
    try:
        validate_send_topic(topic)
    except IllegalTopic as exc:
        raise ConvertError(pb.Code.ILLEGAL_TOPIC, str(exc)) from None
    if is_send_forbidden(topic):
        raise ConvertError(pb.Code.FORBIDDEN, f"sending to system topic {topic} is forbidden")
    if not sp.message_id or _has_separator(sp.message_id) or len(sp.message_id) > 128:
        raise ConvertError(pb.Code.ILLEGAL_MESSAGE_ID, "message id is empty or malformed")
    body = bytes(msg.body)  # type: ignore[attr-defined]
    sys_flag = 0
    if sp.body_encoding == pb.Encoding.GZIP:
        inflated = _inflate(body, 16 + zlib.MAX_WBITS, max_body_bytes)
        if inflated is None:
            raise ConvertError(
                pb.Code.MESSAGE_CORRUPTED, f"GZIP body is corrupt or inflates beyond {max_body_bytes} bytes"
            )
        body = inflated
    if not body:
        raise ConvertError(pb.Code.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(body) > max_body_bytes:
        raise ConvertError(
            pb.Code.MESSAGE_BODY_TOO_LARGE, f"message body is {len(body)} bytes, limit {max_body_bytes}"
        )
    properties: dict[str, str] = {}
    for key, value in msg.user_properties.items():  # type: ignore[attr-defined]
        if key in RESERVED_PROPERTY_KEYS:
            raise ConvertError(pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property is used by system: {key}")
        if not key or _has_separator(key) or _has_separator(value):
            raise ConvertError(pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"illegal property {key[:64]!r}")
        properties[key] = value
    if sp.HasField("tag"):
        tag = sp.tag
        if not tag.strip() or "|" in tag or _has_separator(tag):
            raise ConvertError(pb.Code.ILLEGAL_MESSAGE_TAG, f"illegal tag {tag[:64]!r}")
        properties[PROPERTY_TAGS] = tag
    if sp.keys:
        for key in sp.keys:
            if not key.strip() or any(c.isspace() for c in key) or _has_separator(key):
                raise ConvertError(pb.Code.ILLEGAL_MESSAGE_KEY, f"illegal message key {key[:64]!r}")
        properties[PROPERTY_KEYS] = " ".join(sp.keys)
    properties[PROPERTY_UNIQ_KEY] = sp.message_id
    if sp.HasField("message_group"):
        group = sp.message_group
        if not group.strip() or _has_separator(group):
            raise ConvertError(pb.Code.ILLEGAL_MESSAGE_GROUP, f"illegal message group {group[:64]!r}")
        properties[PROPERTY_SHARDING_KEY] = group
    if sp.HasField("delivery_timestamp"):
        properties[PROPERTY_TIMER_DELIVER_MS] = str(_timestamp_ms(sp.delivery_timestamp))
    if sp.HasField("trace_context") and sp.trace_context:
        if _has_separator(sp.trace_context):
            raise ConvertError(pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "illegal trace context")
        properties[PROPERTY_TRACE_CONTEXT] = sp.trace_context
    if sp.born_host.strip():
        if _has_separator(sp.born_host):
            raise ConvertError(pb.Code.BAD_REQUEST, "illegal born host")
        properties[PROPERTY_BORN_HOST] = sp.born_host
    if sp.message_type == pb.MessageType.TRANSACTION:
        properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        sys_flag |= SYSFLAG_TRANSACTION_PREPARED
        if sp.HasField("orphaned_transaction_recovery_duration"):
            properties[PROPERTY_CHECK_IMMUNITY] = str(int(sp.orphaned_transaction_recovery_duration.seconds))
    try:
        size = properties_size(properties)
    except UnicodeEncodeError:
        raise ConvertError(pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "property is not valid UTF-8") from None
    if size > MAX_PROPERTIES_BYTES:
        raise ConvertError(
            pb.Code.MESSAGE_PROPERTIES_TOO_LARGE, f"properties are {size} bytes, limit {MAX_PROPERTIES_BYTES}"
        )
    born_ms = _timestamp_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else 0
    return Message(
        topic=topic,
        body=body,
        properties=properties,
        sys_flag=sys_flag,
        born_timestamp_ms=born_ms,
        born_host=born_host,
    )


def message_type_of(properties: Mapping[str, str]) -> pb.MessageType:
    """The v2 message type a stored message was sent as (Apache ``TopicMessageType.parseFromMessageProperty``:
    transaction, then delay, then FIFO)."""
    if properties.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true":
        return pb.MessageType.TRANSACTION
    if any(key in properties for key in _DELAY_PROPERTIES):
        return pb.MessageType.DELAY
    if PROPERTY_SHARDING_KEY in properties:
        return pb.MessageType.FIFO
    return pb.MessageType.NORMAL


def body_digest(body: bytes) -> object:
    """MD5 upper-case hex: the digest both the Python and the Node client verify."""
    return pb.Digest(type=pb.DigestType.MD5, checksum=hashlib.md5(body).hexdigest().upper())


def message_id_of(stored: StoredMessage) -> str:
    """``UNIQ_KEY`` if the producer set one, else the offset message id of the record."""
    uniq = stored.properties.get(PROPERTY_UNIQ_KEY)
    if uniq:
        return uniq
    try:
        return offset_msg_id(stored.store_host, stored.commitlog_offset)
    except MessageIdError:
        return f"{stored.commitlog_offset:016X}"


def _host(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def to_rmq_message(
    stored: StoredMessage,
    *,
    max_body_bytes: int,
    receipt_handle: str | None = None,
    invisible_duration_ms: int | None = None,
    delivery_attempt: int | None = None,
    topic: str | None = None,
) -> object:
    """The v2 ``Message`` delivering ``stored`` as ``topic`` (default: its topic, or ``RETRY_TOPIC`` for a
    retry copy); ``delivery_attempt`` defaults to reconsume times + 1."""
    props = stored.properties
    body = stored.body
    if stored.sys_flag & SYSFLAG_COMPRESSED:
        inflated = _inflate(body, zlib.MAX_WBITS, max_body_bytes)
        if inflated is not None:
            body = inflated
    if topic is None:
        topic = stored.topic
        if topic.startswith(RETRY_PREFIX) and props.get(PROPERTY_RETRY_TOPIC):
            topic = props[PROPERTY_RETRY_TOPIC]
    sp = pb.SystemProperties(
        message_id=message_id_of(stored),
        body_digest=body_digest(body),
        body_encoding=pb.Encoding.IDENTITY,
        message_type=message_type_of(props),
        born_timestamp=_timestamp(stored.born_timestamp_ms),
        born_host=props.get(PROPERTY_BORN_HOST) or stored.born_host[0],
        store_timestamp=_timestamp(stored.store_timestamp_ms),
        store_host=_host(stored.store_host),
        queue_id=stored.queue_id,
        queue_offset=stored.queue_offset,
        delivery_attempt=stored.reconsume_times + 1 if delivery_attempt is None else delivery_attempt,
    )
    tag = props.get(PROPERTY_TAGS)
    if tag:
        sp.tag = tag
    keys = props.get(PROPERTY_KEYS)
    if keys:
        sp.keys.extend(k for k in keys.split(" ") if k)
    if PROPERTY_SHARDING_KEY in props:
        sp.message_group = props[PROPERTY_SHARDING_KEY]
    if props.get(PROPERTY_TRACE_CONTEXT):
        sp.trace_context = props[PROPERTY_TRACE_CONTEXT]
    deliver_at = props.get(PROPERTY_TIMER_DELIVER_MS, "")
    if deliver_at.isdigit():
        sp.delivery_timestamp.CopyFrom(_timestamp(int(deliver_at)))
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if invisible_duration_ms is not None:
        sp.invisible_duration.seconds = invisible_duration_ms // 1000
        sp.invisible_duration.nanos = (invisible_duration_ms % 1000) * 1_000_000
    user = {k: v for k, v in props.items() if k not in RESERVED_PROPERTY_KEYS}
    return pb.RmqMessage(topic=pb.Resource(name=topic), user_properties=user, system_properties=sp, body=body)
