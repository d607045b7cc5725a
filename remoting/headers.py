"""
mqproxy.remoting.headers
~~~~~~~~~~~~~~~~~~~~~~~~

Typed request headers, one small frozen dataclass per request family, parsed from a command's
``extFields`` (which the codec has already normalised to ``str`` values: ali-ons and C++ send JSON
numbers and booleans).

Contract: a key the handler needs and the spec marks required must be present and well-typed, else
:class:`~mqproxy.remoting.errors.HeaderError` names it. Keys a handler does not use are never checked
(clients differ in what they send, spec rule 8). Integers are parsed leniently (surrounding blanks,
sign) but range-checked as Java ``int``/``long``; booleans accept ``true/false/1/0`` in any case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from mqproxy.remoting.errors import HeaderError

INT32_RANGE: Final = (-(2**31), 2**31 - 1)
INT64_RANGE: Final = (-(2**63), 2**63 - 1)
_TRUE: Final = frozenset({"true", "1"})
_FALSE: Final = frozenset({"false", "0"})


class _Missing:
    pass


_MISSING: Final = _Missing()


class Fields:
    """Typed, lenient access to one request's ``extFields``; every failure is a :class:`HeaderError`."""

    __slots__ = ("_ext",)

    def __init__(self, ext: Mapping[str, str] | None) -> None:
        self._ext = ext or {}

    def _raw(self, key: str) -> str | None:
        value = self._ext.get(key)
        if value is None:
            return None
        return value if isinstance(value, str) else str(value)

    def text(self, key: str, default: str | _Missing = _MISSING) -> str:
        value = self._raw(key)
        if value is None:
            if isinstance(default, _Missing):
                raise HeaderError(key)
            return default
        return value

    def optional_text(self, key: str) -> str | None:
        return self._raw(key)

    def integer(self, key: str, default: int | _Missing = _MISSING, *, wide: bool = False) -> int:
        """An ``int`` (32-bit) or, with ``wide``, a ``long`` field; blank counts as missing."""
        value = self._raw(key)
        if value is None or not value.strip():
            if isinstance(default, _Missing):
                raise HeaderError(key)
            return default
        try:
            number = int(value.strip(), 10)
        except ValueError:
            raise HeaderError(key, f"is not an integer: {value[:32]!r}") from None
        low, high = INT64_RANGE if wide else INT32_RANGE
        if not low <= number <= high:
            raise HeaderError(key, f"is out of range: {value[:32]!r}")
        return number

    def optional_integer(self, key: str, *, wide: bool = False) -> int | None:
        """Like :meth:`integer`, but None when the key is missing or blank."""
        value = self._raw(key)
        if value is None or not value.strip():
            return None
        return self.integer(key, wide=wide)

    def boolean(self, key: str, default: bool | _Missing = _MISSING) -> bool:
        value = self._raw(key)
        if value is None or not value.strip():
            if isinstance(default, _Missing):
                raise HeaderError(key)
            return default
        folded = value.strip().lower()
        if folded in _TRUE:
            return True
        if folded in _FALSE:
            return False
        raise HeaderError(key, f"is not a boolean: {value[:32]!r}")


# --- produce ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendHeader:
    """SEND_MESSAGE (long keys) / SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE (keys ``a``..``n``)."""

    producer_group: str
    topic: str
    default_topic_queue_nums: int | None
    queue_id: int
    sys_flag: int
    born_timestamp_ms: int
    flag: int
    properties: str
    reconsume_times: int
    max_reconsume_times: int | None


#: V2 short key for every V1 long key the handler reads (spec §3.2).
_V2_KEYS: Final = {
    "producerGroup": "a",
    "topic": "b",
    "defaultTopicQueueNums": "d",
    "queueId": "e",
    "sysFlag": "f",
    "bornTimestamp": "g",
    "flag": "h",
    "properties": "i",
    "reconsumeTimes": "j",
    "maxReconsumeTimes": "l",
}


def parse_send_header(ext: Mapping[str, str] | None, *, short_keys: bool) -> SendHeader:
    fields = Fields(ext)

    def key(long_name: str) -> str:
        return _V2_KEYS[long_name] if short_keys else long_name

    return SendHeader(
        producer_group=fields.text(key("producerGroup")),
        topic=fields.text(key("topic")),
        default_topic_queue_nums=fields.optional_integer(key("defaultTopicQueueNums")),
        queue_id=fields.integer(key("queueId")),
        sys_flag=fields.integer(key("sysFlag")),
        born_timestamp_ms=fields.integer(key("bornTimestamp"), wide=True),
        flag=fields.integer(key("flag")),
        properties=fields.text(key("properties"), ""),
        reconsume_times=fields.integer(key("reconsumeTimes"), 0),
        max_reconsume_times=fields.optional_integer(key("maxReconsumeTimes")),
    )


# --- consume ----------------------------------------------------------------------------------------

#: PullSysFlag bits (spec §3.3).
PULL_FLAG_COMMIT_OFFSET: Final = 0x1
PULL_FLAG_SUSPEND: Final = 0x2
PULL_FLAG_SUBSCRIPTION: Final = 0x4
PULL_FLAG_CLASS_FILTER: Final = 0x8
PULL_FLAG_LITE_PULL: Final = 0x10


@dataclass(frozen=True, slots=True)
class PullHeader:
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_ms: int
    subscription: str | None
    expression_type: str
    max_msg_bytes: int | None

    @property
    def suspend(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_SUSPEND)

    @property
    def has_subscription(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_SUBSCRIPTION) and self.subscription is not None

    @property
    def has_commit_offset(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_COMMIT_OFFSET)


def parse_pull_header(ext: Mapping[str, str] | None) -> PullHeader:
    fields = Fields(ext)
    return PullHeader(
        consumer_group=fields.text("consumerGroup"),
        topic=fields.text("topic"),
        queue_id=fields.integer("queueId"),
        queue_offset=fields.integer("queueOffset", wide=True),
        max_msg_nums=fields.integer("maxMsgNums"),
        sys_flag=fields.integer("sysFlag"),
        commit_offset=fields.integer("commitOffset", wide=True),
        suspend_timeout_ms=fields.integer("suspendTimeoutMillis", wide=True),
        subscription=fields.optional_text("subscription"),
        expression_type=fields.text("expressionType", "TAG") or "TAG",
        max_msg_bytes=fields.optional_integer("maxMsgBytes"),
    )


# --- offsets ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueHeader:
    """GET_MAX_OFFSET / GET_MIN_OFFSET / GET_EARLIEST_MSG_STORETIME."""

    topic: str
    queue_id: int


def parse_queue_header(ext: Mapping[str, str] | None) -> QueueHeader:
    fields = Fields(ext)
    return QueueHeader(topic=fields.text("topic"), queue_id=fields.integer("queueId"))


@dataclass(frozen=True, slots=True)
class SearchOffsetHeader:
    topic: str
    queue_id: int
    timestamp_ms: int
    upper_bound: bool


def parse_search_offset_header(ext: Mapping[str, str] | None) -> SearchOffsetHeader:
    fields = Fields(ext)
    boundary = fields.text("boundaryType", "LOWER").strip().upper() or "LOWER"
    if boundary not in ("LOWER", "UPPER"):
        raise HeaderError("boundaryType", f"is not LOWER or UPPER: {boundary[:32]!r}")
    return SearchOffsetHeader(
        topic=fields.text("topic"),
        queue_id=fields.integer("queueId"),
        timestamp_ms=fields.integer("timestamp", wide=True),
        upper_bound=boundary == "UPPER",
    )


@dataclass(frozen=True, slots=True)
class ConsumerOffsetHeader:
    """QUERY_CONSUMER_OFFSET (``offset`` unused) and UPDATE_CONSUMER_OFFSET (``commitOffset``)."""

    consumer_group: str
    topic: str
    queue_id: int
    offset: int
    set_zero_if_not_found: bool


def parse_query_offset_header(ext: Mapping[str, str] | None) -> ConsumerOffsetHeader:
    fields = Fields(ext)
    return ConsumerOffsetHeader(
        consumer_group=fields.text("consumerGroup"),
        topic=fields.text("topic"),
        queue_id=fields.integer("queueId"),
        offset=-1,
        set_zero_if_not_found=fields.boolean("setZeroIfNotFound", True),
    )


def parse_update_offset_header(ext: Mapping[str, str] | None) -> ConsumerOffsetHeader:
    fields = Fields(ext)
    return ConsumerOffsetHeader(
        consumer_group=fields.text("consumerGroup"),
        topic=fields.text("topic"),
        queue_id=fields.integer("queueId"),
        offset=fields.integer("commitOffset", wide=True),
        set_zero_if_not_found=False,
    )


# --- clients and routes -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UnregisterHeader:
    client_id: str
    producer_group: str | None
    consumer_group: str | None


def parse_unregister_header(ext: Mapping[str, str] | None) -> UnregisterHeader:
    fields = Fields(ext)
    return UnregisterHeader(
        client_id=fields.text("clientID"),
        producer_group=fields.optional_text("producerGroup") or None,
        consumer_group=fields.optional_text("consumerGroup") or None,
    )


def parse_group_header(ext: Mapping[str, str] | None) -> str:
    """GET_CONSUMER_LIST_BY_GROUP: the ``consumerGroup``."""
    return Fields(ext).text("consumerGroup")


def parse_topic_header(ext: Mapping[str, str] | None) -> str:
    """GET_ROUTEINFO_BY_TOPIC: the ``topic``."""
    return Fields(ext).text("topic")
