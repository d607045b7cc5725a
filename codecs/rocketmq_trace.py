"""
mqproxy.codecs.rocketmq_trace
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

RocketMQ's message-trace records, sans-IO: the text layout the Java client's trace dispatcher writes into
the trace topic (``RMQ_SYS_TRACE_TOPIC`` by default) and ``mqadmin queryMsgTraceById`` and RocketMQ
Dashboard read back. Pure functions and values; no clock, no I/O.

Layout (facts from apache/rocketmq ``client/.../trace/TraceDataEncoder.java``, ``TraceConstants.java``,
``TraceView.java``): a trace message's body is records in a row, each ended by ``FIELD_SPLITOR``
(``\\x02``); a record's fields are separated by ``CONTENT_SPLITOR`` (``\\x01``) and its first field
names its type. Field order per type:

* ``Pub``: type, timestamp, region, group, topic, msgId, tags, keys, storeHost, bodyLength, costTime,
  msgType (ordinal), offsetMsgId, success.
* ``SubBefore``: type, timestamp, region, group, requestId, msgId, retryTimes, keys.
* ``SubAfter``: type, requestId, msgId, costTime, success, keys, contextCode, timestamp, group.
* ``EndTransaction``: type, timestamp, region, group, topic, msgId, tags, keys, storeHost, msgType,
  transactionId, transactionState, fromTransactionCheck.

A trace message's keys (its ``KEYS`` property, blank-separated) are every record's msgId and message keys,
so a key query for a msgId on the trace topic finds it. :class:`TraceSink` is what emitters (the facade
wrapper, the MQTT gateway) hand records to; :data:`NULL_SINK` when tracing is off. Absent tags and keys
are written ``null``, as the Java client writes a null string: Java's ``String.split`` drops trailing
empty fields, so an empty last field (a ``SubBefore``'s keys) would break its decoder.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from mqproxy.model.ids import MessageIdError, offset_msg_id
from mqproxy.model.types import PROPERTY_KEYS, PROPERTY_UNIQ_KEY, StoredMessage

__all__ = [
    "CONTENT_SPLITOR",
    "DEFAULT_REGION",
    "FIELD_SPLITOR",
    "KEY_SEPARATOR",
    "NULL_SINK",
    "EndTransactionRecord",
    "MessageType",
    "PubRecord",
    "SubAfterRecord",
    "SubBeforeRecord",
    "TraceRecord",
    "TraceSink",
    "decode",
    "encode",
    "message_id",
    "pack",
    "record_keys",
]

CONTENT_SPLITOR = "\x01"
FIELD_SPLITOR = "\x02"
#: Message keys are separated by a blank (``MessageConst.KEY_SEPARATOR``).
KEY_SEPARATOR = " "
#: The region a Java client writes when its broker names none.
DEFAULT_REGION = "DefaultRegion"
#: How an absent tag or key set is written (Java's ``String.valueOf(null)``).
NULL = "null"
#: ``ConsumeReturnType`` ordinals a ``SubAfter``'s context code takes.
CONTEXT_SUCCESS = 0
CONTEXT_FAILED = 4


class MessageType(enum.IntEnum):
    """``org.apache.rocketmq.common.message.MessageType``, written by ordinal."""

    NORMAL = 0
    TRANS_HALF = 1
    TRANS_COMMIT = 2
    DELAY = 3
    ORDER = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class PubRecord:
    """A message stored by a producer (``costTime``: ms the store took)."""

    timestamp_ms: int
    group: str
    topic: str
    msg_id: str
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    body_length: int = 0
    cost_ms: int = 0
    msg_type: MessageType = MessageType.NORMAL
    offset_msg_id: str = ""
    success: bool = True
    region_id: str = DEFAULT_REGION


@dataclass(frozen=True, slots=True, kw_only=True)
class SubBeforeRecord:
    """A message handed to a consumer (one ``request_id`` per delivered batch)."""

    timestamp_ms: int
    group: str
    request_id: str
    msg_id: str
    retry_times: int = 0
    keys: str = ""
    region_id: str = DEFAULT_REGION

    @classmethod
    def of(cls, message: StoredMessage, group: str, request_id: str, timestamp_ms: int) -> SubBeforeRecord:
        """The record of ``message`` handed to ``group``: its msgId, keys and retry count."""
        return cls(
            timestamp_ms=timestamp_ms,
            group=group,
            request_id=request_id,
            msg_id=message_id(message.properties, message.store_host, message.commitlog_offset),
            retry_times=message.reconsume_times,
            keys=message.properties.get(PROPERTY_KEYS, ""),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SubAfterRecord:
    """A consumer's outcome for a message (``cost_ms``: from delivery to its ack)."""

    request_id: str
    msg_id: str
    cost_ms: int
    success: bool
    keys: str = ""
    context_code: int = CONTEXT_SUCCESS
    timestamp_ms: int = 0
    group: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class EndTransactionRecord:
    """A transaction's end (``state``: ``COMMIT_MESSAGE``, ``ROLLBACK_MESSAGE`` or ``UNKNOW``)."""

    timestamp_ms: int
    group: str
    topic: str
    msg_id: str
    transaction_id: str
    state: str
    from_check: bool = False
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    msg_type: MessageType = MessageType.TRANS_HALF
    region_id: str = DEFAULT_REGION


TraceRecord = PubRecord | SubBeforeRecord | SubAfterRecord | EndTransactionRecord


class TraceSink(Protocol):
    """Where emitters hand trace records. ``enabled`` False: emitting is pointless (callers may skip
    building records)."""

    @property
    def enabled(self) -> bool: ...

    def emit(self, record: TraceRecord) -> None:
        """Queue ``record`` for writing; never blocks, never raises (a full buffer drops it)."""
        ...


class _NullSink:
    enabled = False

    def emit(self, record: TraceRecord) -> None:
        return None


#: The sink when tracing is off.
NULL_SINK: TraceSink = _NullSink()


def message_id(properties: Mapping[str, str], store_host: tuple[str, int], commitlog_offset: int) -> str:
    """A message's id as clients see it: its ``UNIQ_KEY``, else its offset message id ("" if it has
    neither)."""
    uniq = properties.get(PROPERTY_UNIQ_KEY)
    if uniq:
        return uniq
    if commitlog_offset < 0:
        return ""
    try:
        return offset_msg_id(store_host, commitlog_offset)
    except (MessageIdError, ValueError, OSError):
        return ""


def _text(value: str) -> str:
    return value if value else NULL


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _fields(record: TraceRecord) -> list[object]:
    match record:
        case PubRecord():
            return [
                "Pub", record.timestamp_ms, record.region_id, record.group, record.topic, record.msg_id,
                _text(record.tags), _text(record.keys), record.store_host, record.body_length,
                record.cost_ms, int(record.msg_type), record.offset_msg_id, _bool(record.success),
            ]  # fmt: skip
        case SubBeforeRecord():
            return [
                "SubBefore", record.timestamp_ms, record.region_id, record.group, record.request_id,
                record.msg_id, record.retry_times, _text(record.keys),
            ]  # fmt: skip
        case SubAfterRecord():
            return [
                "SubAfter", record.request_id, record.msg_id, record.cost_ms, _bool(record.success),
                _text(record.keys), record.context_code, record.timestamp_ms, record.group,
            ]  # fmt: skip
        case EndTransactionRecord():
            return [
                "EndTransaction", record.timestamp_ms, record.region_id, record.group, record.topic,
                record.msg_id, _text(record.tags), _text(record.keys), record.store_host,
                int(record.msg_type), record.transaction_id, record.state, _bool(record.from_check),
            ]  # fmt: skip


def _clean(value: object) -> str:
    """A field's text with the two separators removed (a client-chosen value must not split a record)."""
    text = str(value)
    if CONTENT_SPLITOR in text or FIELD_SPLITOR in text:
        text = text.replace(CONTENT_SPLITOR, "").replace(FIELD_SPLITOR, "")
    return text


def encode(record: TraceRecord) -> str:
    """One record, ended by ``FIELD_SPLITOR``."""
    return CONTENT_SPLITOR.join(_clean(v) for v in _fields(record)) + FIELD_SPLITOR


def record_keys(record: TraceRecord) -> list[str]:
    """The keys a trace message holding ``record`` is found by: its msgId, then its message keys."""
    out = [record.msg_id] if record.msg_id else []
    if record.keys:
        out.extend(k for k in record.keys.split(KEY_SEPARATOR) if k)
    return out


def pack(records: Sequence[TraceRecord], max_body_bytes: int) -> list[tuple[bytes, str]]:
    """``records`` as trace message ``(body, KEYS property)`` pairs, in order, each body at most
    ``max_body_bytes`` (a single larger record gets a message of its own); keys are deduplicated."""
    out: list[tuple[bytes, str]] = []
    parts: list[bytes] = []
    keys: dict[str, None] = {}
    size = 0
    for record in records:
        data = encode(record).encode()
        if parts and size + len(data) > max_body_bytes:
            out.append((b"".join(parts), KEY_SEPARATOR.join(keys)))
            parts, keys, size = [], {}, 0
        parts.append(data)
        size += len(data)
        keys.update(dict.fromkeys(_clean(k).replace(KEY_SEPARATOR, "") for k in record_keys(record)))
    if parts:
        out.append((b"".join(parts), KEY_SEPARATOR.join(keys)))
    return out


def _opt(value: str) -> str:
    return "" if value == NULL else value


def _decode_one(line: list[str]) -> TraceRecord | None:
    kind = line[0]
    if kind == "Pub" and len(line) >= 14:
        return PubRecord(
            timestamp_ms=int(line[1]), region_id=line[2], group=line[3], topic=line[4], msg_id=line[5],
            tags=_opt(line[6]), keys=_opt(line[7]), store_host=line[8], body_length=int(line[9]),
            cost_ms=int(line[10]), msg_type=MessageType(int(line[11])), offset_msg_id=line[12],
            success=line[13] == "true",
        )  # fmt: skip
    if kind == "SubBefore" and len(line) >= 8:
        return SubBeforeRecord(
            timestamp_ms=int(line[1]), region_id=line[2], group=line[3], request_id=line[4],
            msg_id=line[5], retry_times=int(line[6]), keys=_opt(line[7]),
        )  # fmt: skip
    if kind == "SubAfter" and len(line) >= 6:
        return SubAfterRecord(
            request_id=line[1], msg_id=line[2], cost_ms=int(line[3]), success=line[4] == "true",
            keys=_opt(line[5]), context_code=int(line[6]) if len(line) > 6 and line[6] else 0,
            timestamp_ms=int(line[7]) if len(line) > 7 and line[7] else 0,
            group=line[8] if len(line) > 8 else "",
        )  # fmt: skip
    if kind == "EndTransaction" and len(line) >= 13:
        return EndTransactionRecord(
            timestamp_ms=int(line[1]), region_id=line[2], group=line[3], topic=line[4], msg_id=line[5],
            tags=_opt(line[6]), keys=_opt(line[7]), store_host=line[8],
            msg_type=MessageType(int(line[9])), transaction_id=line[10], state=line[11],
            from_check=line[12] == "true",
        )  # fmt: skip
    return None


def decode(data: str | bytes) -> list[TraceRecord]:
    """The records of a trace message body (unknown or short records are skipped, as the Java decoder
    skips unknown types)."""
    text = data.decode() if isinstance(data, bytes) else data
    out: list[TraceRecord] = []
    for chunk in text.split(FIELD_SPLITOR):
        if chunk:
            record = _decode_one(chunk.split(CONTENT_SPLITOR))
            if record is not None:
                out.append(record)
    return out


def joined_keys(keys: Iterable[str]) -> str:
    """Message keys as a ``KEYS`` property value."""
    return KEY_SEPARATOR.join(k for k in keys if k)
