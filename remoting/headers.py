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
    #: None when the request names none (then the registered subscription's type applies).
    expression_type: str | None
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
        expression_type=fields.optional_text("expressionType") or None,
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


# --- retry and transactions -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendBackHeader:
    """CONSUMER_SEND_MSG_BACK (spec §3.10)."""

    offset: int
    group: str
    delay_level: int
    origin_msg_id: str | None
    origin_topic: str | None
    max_reconsume_times: int | None


def parse_send_back_header(ext: Mapping[str, str] | None) -> SendBackHeader:
    fields = Fields(ext)
    return SendBackHeader(
        offset=fields.integer("offset", wide=True),
        group=fields.text("group"),
        delay_level=fields.integer("delayLevel", 0),
        origin_msg_id=fields.optional_text("originMsgId") or None,
        origin_topic=fields.optional_text("originTopic") or None,
        max_reconsume_times=fields.optional_integer("maxReconsumeTimes"),
    )


@dataclass(frozen=True, slots=True)
class EndTransactionHeader:
    """END_TRANSACTION (spec §3.11)."""

    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int
    from_transaction_check: bool
    msg_id: str | None
    transaction_id: str | None


def parse_end_transaction_header(ext: Mapping[str, str] | None) -> EndTransactionHeader:
    fields = Fields(ext)
    return EndTransactionHeader(
        producer_group=fields.text("producerGroup"),
        tran_state_table_offset=fields.integer("tranStateTableOffset", -1, wide=True),
        commit_log_offset=fields.integer("commitLogOffset", wide=True),
        commit_or_rollback=fields.integer("commitOrRollback"),
        from_transaction_check=fields.boolean("fromTransactionCheck", False),
        msg_id=fields.optional_text("msgId") or None,
        transaction_id=fields.optional_text("transactionId") or None,
    )


# --- pop --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PopHeader:
    """POP_MESSAGE (spec §3.16); ``queue_id`` -1 means every queue."""

    consumer_group: str
    topic: str
    queue_id: int
    max_msg_nums: int
    invisible_time_ms: int
    poll_time_ms: int
    born_time_ms: int
    init_mode: int
    exp_type: str
    exp: str | None
    order: bool
    attempt_id: str | None


def parse_pop_header(ext: Mapping[str, str] | None) -> PopHeader:
    fields = Fields(ext)
    return PopHeader(
        consumer_group=fields.text("consumerGroup"),
        topic=fields.text("topic"),
        queue_id=fields.integer("queueId"),
        max_msg_nums=fields.integer("maxMsgNums"),
        invisible_time_ms=fields.integer("invisibleTime", wide=True),
        poll_time_ms=fields.integer("pollTime", 0, wide=True),
        born_time_ms=fields.integer("bornTime", 0, wide=True),
        init_mode=fields.integer("initMode", 0),
        exp_type=fields.text("expType", "TAG") or "TAG",
        exp=fields.optional_text("exp"),
        order=fields.boolean("order", False),
        attempt_id=fields.optional_text("attemptId") or None,
    )


@dataclass(frozen=True, slots=True)
class AckHeader:
    """ACK_MESSAGE (``invisible_time_ms`` None) and CHANGE_MESSAGE_INVISIBLETIME (spec §3.17, §3.19)."""

    consumer_group: str
    topic: str
    queue_id: int
    extra_info: str
    offset: int
    invisible_time_ms: int | None


def parse_ack_header(ext: Mapping[str, str] | None, *, change_invisible: bool = False) -> AckHeader:
    fields = Fields(ext)
    return AckHeader(
        consumer_group=fields.text("consumerGroup"),
        topic=fields.text("topic"),
        queue_id=fields.integer("queueId"),
        extra_info=fields.text("extraInfo"),
        offset=fields.integer("offset", wide=True),
        invisible_time_ms=fields.integer("invisibleTime", wide=True) if change_invisible else None,
    )


@dataclass(frozen=True, slots=True)
class PeekHeader:
    """PEEK_MESSAGE (spec §3.18) and POLLING_INFO (``max_msg_nums`` unused)."""

    consumer_group: str
    topic: str
    queue_id: int
    max_msg_nums: int


def parse_peek_header(ext: Mapping[str, str] | None, *, polling_info: bool = False) -> PeekHeader:
    fields = Fields(ext)
    return PeekHeader(
        consumer_group=fields.text("consumerGroup"),
        topic=fields.text("topic"),
        queue_id=fields.integer("queueId"),
        max_msg_nums=0 if polling_info else fields.integer("maxMsgNums"),
    )


@dataclass(frozen=True, slots=True)
class NotificationHeader:
    """NOTIFICATION (spec §3.20)."""

    consumer_group: str
    topic: str
    queue_id: int
    poll_time_ms: int
    born_time_ms: int
    order: bool


def parse_notification_header(ext: Mapping[str, str] | None) -> NotificationHeader:
    fields = Fields(ext)
    return NotificationHeader(
        consumer_group=fields.text("consumerGroup"),
        topic=fields.text("topic"),
        queue_id=fields.integer("queueId"),
        poll_time_ms=fields.integer("pollTime", 0, wide=True),
        born_time_ms=fields.integer("bornTime", 0, wide=True),
        order=fields.boolean("order", False),
    )
