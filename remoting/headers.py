"""
mqproxy.remoting.headers
~~~~~~~~~~~~~~~~~~~~~~~~

Typed request headers, one small frozen dataclass per request family, parsed from a command's
``extFields`` (which the codec has already normalised to ``str`` values: ali-ons and C++ send JSON
numbers and booleans). Each header field declares the key it is read from and how (:func:`text`,
:func:`integer`, :func:`boolean` and their optional forms); :func:`parse_header` reads them in
declaration order, so the first bad key is the one reported.

Contract: a key the handler needs and the spec marks required must be present and well-typed, else
:class:`~mqproxy.remoting.errors.HeaderError` names it. Keys a handler does not use are never checked
(clients differ in what they send, spec rule 8). Integers are parsed leniently (surrounding blanks,
sign) but range-checked as Java ``int``/``long``; booleans accept ``true/false/1/0`` in any case.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

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


# --- declarative header fields -----------------------------------------------------------------------

_SPEC: Final = "remoting_header"
H = TypeVar("H")


@dataclass(frozen=True, slots=True)
class _Key:
    """How one header field is read: ``name`` (``short``: the SEND_MESSAGE_V2 key) through ``read``."""

    name: str
    read: Callable[[Fields, str], Any]
    short: str | None = None


def _key(name: str, read: Callable[[Fields, str], Any], short: str | None) -> Any:
    return dataclasses.field(metadata={_SPEC: _Key(name, read, short)})


def text(name: str, default: str | _Missing = _MISSING, *, short: str | None = None) -> Any:
    """A required (or defaulted) string."""
    return _key(name, lambda f, k: f.text(k, default), short)


def optional_text(name: str, *, blank_is_none: bool = True) -> Any:
    """A string or None when missing (or blank, unless ``blank_is_none`` is False)."""
    if blank_is_none:
        return _key(name, lambda f, k: f.optional_text(k) or None, None)
    return _key(name, lambda f, k: f.optional_text(k), None)


def integer(
    name: str, default: int | _Missing = _MISSING, *, wide: bool = False, short: str | None = None
) -> Any:
    """A required (or defaulted) Java ``int``, or with ``wide`` a ``long``."""
    return _key(name, lambda f, k: f.integer(k, default, wide=wide), short)


def optional_integer(name: str, *, wide: bool = False, short: str | None = None) -> Any:
    """An integer or None when missing or blank."""
    return _key(name, lambda f, k: f.optional_integer(k, wide=wide), short)


def boolean(name: str, default: bool | _Missing = _MISSING) -> Any:
    return _key(name, lambda f, k: f.boolean(k, default), None)


def choice(name: str, options: tuple[str, ...]) -> Any:
    """One of ``options`` in any case (blank or missing: the first), upper-cased."""

    def read(fields: Fields, key: str) -> str:
        value = fields.text(key, options[0]).strip().upper() or options[0]
        if value not in options:
            raise HeaderError(key, f"is not {' or '.join(options)}: {value[:32]!r}")
        return value

    return _key(name, read, None)


@functools.cache
def _plan(header: type, short_keys: bool) -> tuple[tuple[str, Callable[[Fields, str], Any], str], ...]:
    """(field name, reader, key) for each declared field of ``header``, in declaration order."""
    plan = []
    for item in dataclasses.fields(header):
        key: _Key | None = item.metadata.get(_SPEC)
        if key is not None:
            plan.append((item.name, key.read, key.short if short_keys and key.short else key.name))
    return tuple(plan)


def parse_header(header: type[H], ext: Mapping[str, str] | None, *, short_keys: bool = False) -> H:
    """``header`` read from ``ext``; with ``short_keys`` the SEND_MESSAGE_V2 keys (``a``..``n``) are read.
    Fields without a declared key keep their defaults."""
    fields = Fields(ext)
    plan = _plan(header, short_keys)  # type: ignore[arg-type]
    return header(**{name: read(fields, key) for name, read, key in plan})


@dataclass(frozen=True, slots=True)
class QueueGroupHeader:
    """A consumer group's queue (POLLING_INFO; the start of every consumer header). ``queue_id`` -1 means
    every queue where a request allows it."""

    consumer_group: str = text("consumerGroup")
    topic: str = text("topic")
    queue_id: int = integer("queueId")


# --- produce ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendHeader:
    """SEND_MESSAGE (long keys) / SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE (short keys, spec §3.2)."""

    producer_group: str = text("producerGroup", short="a")
    topic: str = text("topic", short="b")
    default_topic_queue_nums: int | None = optional_integer("defaultTopicQueueNums", short="d")
    queue_id: int = integer("queueId", short="e")
    sys_flag: int = integer("sysFlag", short="f")
    born_timestamp_ms: int = integer("bornTimestamp", wide=True, short="g")
    flag: int = integer("flag", short="h")
    properties: str = text("properties", "", short="i")
    reconsume_times: int = integer("reconsumeTimes", 0, short="j")
    max_reconsume_times: int | None = optional_integer("maxReconsumeTimes", short="l")


# --- consume ----------------------------------------------------------------------------------------

#: PullSysFlag bits (spec §3.3).
PULL_FLAG_COMMIT_OFFSET: Final = 0x1
PULL_FLAG_SUSPEND: Final = 0x2
PULL_FLAG_SUBSCRIPTION: Final = 0x4
PULL_FLAG_CLASS_FILTER: Final = 0x8
PULL_FLAG_LITE_PULL: Final = 0x10


@dataclass(frozen=True, slots=True)
class PullHeader(QueueGroupHeader):
    queue_offset: int = integer("queueOffset", wide=True)
    max_msg_nums: int = integer("maxMsgNums")
    sys_flag: int = integer("sysFlag")
    commit_offset: int = integer("commitOffset", wide=True)
    suspend_timeout_ms: int = integer("suspendTimeoutMillis", wide=True)
    subscription: str | None = optional_text("subscription", blank_is_none=False)
    #: None when the request names none (then the registered subscription's type applies).
    expression_type: str | None = optional_text("expressionType")
    max_msg_bytes: int | None = optional_integer("maxMsgBytes")

    @property
    def suspend(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_SUSPEND)

    @property
    def has_subscription(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_SUBSCRIPTION) and self.subscription is not None

    @property
    def has_commit_offset(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_COMMIT_OFFSET)


# --- offsets ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueHeader:
    """GET_MAX_OFFSET / GET_MIN_OFFSET / GET_EARLIEST_MSG_STORETIME."""

    topic: str = text("topic")
    queue_id: int = integer("queueId")


@dataclass(frozen=True, slots=True)
class SearchOffsetHeader:
    """SEARCH_OFFSET_BY_TIMESTAMP."""

    boundary_type: str = choice("boundaryType", ("LOWER", "UPPER"))
    topic: str = text("topic")
    queue_id: int = integer("queueId")
    timestamp_ms: int = integer("timestamp", wide=True)

    @property
    def upper_bound(self) -> bool:
        return self.boundary_type == "UPPER"


@dataclass(frozen=True, slots=True)
class QueryOffsetHeader(QueueGroupHeader):
    """QUERY_CONSUMER_OFFSET."""

    set_zero_if_not_found: bool = boolean("setZeroIfNotFound", True)


@dataclass(frozen=True, slots=True)
class UpdateOffsetHeader(QueueGroupHeader):
    """UPDATE_CONSUMER_OFFSET."""

    commit_offset: int = integer("commitOffset", wide=True)


# --- clients and routes -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UnregisterHeader:
    client_id: str = text("clientID")
    producer_group: str | None = optional_text("producerGroup")
    consumer_group: str | None = optional_text("consumerGroup")


# --- retry and transactions -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendBackHeader:
    """CONSUMER_SEND_MSG_BACK (spec §3.10)."""

    offset: int = integer("offset", wide=True)
    group: str = text("group")
    delay_level: int = integer("delayLevel", 0)
    origin_msg_id: str | None = optional_text("originMsgId")
    origin_topic: str | None = optional_text("originTopic")
    max_reconsume_times: int | None = optional_integer("maxReconsumeTimes")


@dataclass(frozen=True, slots=True)
class EndTransactionHeader:
    """END_TRANSACTION (spec §3.11)."""

    producer_group: str = text("producerGroup")
    tran_state_table_offset: int = integer("tranStateTableOffset", -1, wide=True)
    commit_log_offset: int = integer("commitLogOffset", wide=True)
    commit_or_rollback: int = integer("commitOrRollback")
    from_transaction_check: bool = boolean("fromTransactionCheck", False)
    msg_id: str | None = optional_text("msgId")
    transaction_id: str | None = optional_text("transactionId")
    #: The half message's topic (5.x clients send it; 4.x ones do not).
    topic: str | None = optional_text("topic")


# --- pop --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PopHeader(QueueGroupHeader):
    """POP_MESSAGE (spec §3.16); ``queue_id`` -1 means every queue; ``exp_type`` blank means TAG."""

    max_msg_nums: int = integer("maxMsgNums")
    invisible_time_ms: int = integer("invisibleTime", wide=True)
    poll_time_ms: int = integer("pollTime", 0, wide=True)
    born_time_ms: int = integer("bornTime", 0, wide=True)
    init_mode: int = integer("initMode", 0)
    exp_type: str = text("expType", "TAG")
    exp: str | None = optional_text("exp", blank_is_none=False)
    order: bool = boolean("order", False)
    attempt_id: str | None = optional_text("attemptId")


@dataclass(frozen=True, slots=True)
class AckHeader(QueueGroupHeader):
    """ACK_MESSAGE (spec §3.17)."""

    extra_info: str = text("extraInfo")
    offset: int = integer("offset", wide=True)


@dataclass(frozen=True, slots=True)
class ChangeInvisibleHeader(AckHeader):
    """CHANGE_MESSAGE_INVISIBLETIME (spec §3.19): an ack header and the new ``invisibleTime``."""

    invisible_time_ms: int = integer("invisibleTime", wide=True)


@dataclass(frozen=True, slots=True)
class PeekHeader(QueueGroupHeader):
    """PEEK_MESSAGE (spec §3.18)."""

    max_msg_nums: int = integer("maxMsgNums")


@dataclass(frozen=True, slots=True)
class NotificationHeader(QueueGroupHeader):
    """NOTIFICATION (spec §3.20)."""

    poll_time_ms: int = integer("pollTime", 0, wide=True)
    born_time_ms: int = integer("bornTime", 0, wide=True)
    order: bool = boolean("order", False)
