"""Value types shared by every backend and every protocol handler.

These are plain data: no I/O, no protocol encoding. Protocol codecs translate their wire forms to and
from these types; backends store and return them unchanged.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

#: Property keys with a fixed meaning (RocketMQ ``MessageConst``); stored in ``Message.properties``.
PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_DELAY_LEVEL = "DELAY"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_INNER_MULTI_DISPATCH = "INNER_MULTI_DISPATCH"
PROPERTY_INNER_MULTI_QUEUE_OFFSET = "INNER_MULTI_QUEUE_OFFSET"

#: Permission bits of a topic (RocketMQ ``PermName``).
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1


@dataclass(slots=True)
class Message:
    """A message as a producer hands it to a backend.

    ``queue_id`` of -1 lets the backend choose a queue. ``dispatch`` names extra light message queues
    (LMQ) that receive the same stored record atomically (empty for ordinary messages).
    """

    topic: str
    body: bytes
    queue_id: int = -1
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    sys_flag: int = 0
    born_timestamp_ms: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    reconsume_times: int = 0
    dispatch: tuple[str, ...] = ()

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)


@dataclass(slots=True, frozen=True)
class StoredMessage:
    """A message as read back from a backend, with its store coordinates.

    ``commitlog_offset`` is unique per stored record and stable across restarts; protocol layers build
    message ids from it. ``queue_offset`` is the offset within (``topic``, ``queue_id``).
    """

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    store_size: int
    body: bytes
    flag: int
    properties: Mapping[str, str]
    sys_flag: int
    born_timestamp_ms: int
    born_host: tuple[str, int]
    store_timestamp_ms: int
    store_host: tuple[str, int]
    reconsume_times: int
    body_crc: int

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)


@dataclass(slots=True, frozen=True)
class SendResult:
    """Where a sent message was stored. ``lmq_offsets`` maps each dispatched LMQ to its queue offset."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    store_timestamp_ms: int
    lmq_offsets: Mapping[str, int] = field(default_factory=dict)


class PullStatus(enum.Enum):
    FOUND = "found"
    NO_NEW_MSG = "no_new_msg"  # offset == max offset: nothing yet
    NO_MATCHED_MSG = "no_matched_msg"  # messages exist but none matched the filter
    OFFSET_ILLEGAL = "offset_illegal"  # offset < min or > max; next_offset says where to resume


class EncodedRecords(Protocol):
    """Messages kept as a remoting pull body (e.g. a RocketMQ broker's records rewritten in place,
    :class:`mqproxy.codecs.record_patch.RecordBody`)."""

    @property
    def data(self) -> bytes:
        """The records as a remoting client gets them: byte for byte what
        :func:`mqproxy.codecs.message_record.encode_records` gives for :meth:`messages` (V1 records, IPv4
        hosts, so the same with either ``legacy`` setting), properties strings as stored."""
        ...

    def messages(self) -> tuple[StoredMessage, ...]:
        """The records decoded."""
        ...


class PullResult:
    """What a pull found: ``messages`` in queue order, and where to go on.

    A backend that has the messages as a pull body passes ``records`` instead of ``messages``
    (:meth:`of_records`): a remoting pull sends ``records.data`` as it is, and ``messages`` decodes it on
    first use (then keeps the tuple). Immutable by convention; compares by value (``records`` aside).
    """

    __slots__ = ("_messages", "max_offset", "min_offset", "next_offset", "records", "status")

    def __init__(
        self,
        status: PullStatus,
        messages: tuple[StoredMessage, ...],
        next_offset: int,
        min_offset: int,
        max_offset: int,
    ) -> None:
        self.status = status
        self._messages: tuple[StoredMessage, ...] | None = messages
        self.next_offset = next_offset
        self.min_offset = min_offset
        self.max_offset = max_offset
        self.records: EncodedRecords | None = None

    @classmethod
    def of_records(
        cls, status: PullStatus, records: EncodedRecords, next_offset: int, min_offset: int, max_offset: int
    ) -> PullResult:
        result = cls(status, (), next_offset, min_offset, max_offset)
        result._messages, result.records = None, records
        return result

    @property
    def messages(self) -> tuple[StoredMessage, ...]:
        if self._messages is None:
            assert self.records is not None
            self._messages = self.records.messages()
        return self._messages

    def _key(self) -> tuple[object, ...]:
        return (self.status, self.messages, self.next_offset, self.min_offset, self.max_offset)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PullResult) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        kept = "records" if self._messages is None else f"{len(self._messages)} messages"
        return (
            f"PullResult({self.status!r}, {kept}, next_offset={self.next_offset}, "
            f"min_offset={self.min_offset}, max_offset={self.max_offset})"
        )


@dataclass(slots=True, frozen=True)
class TopicConfig:
    name: str
    read_queues: int
    write_queues: int
    perm: int = PERM_READ | PERM_WRITE
    sys_flag: int = 0


@dataclass(slots=True, frozen=True)
class TagFilter:
    """A TAG subscription expression: ``*`` (everything) or ``A || B || C``.

    Built once per subscription with :meth:`parse`; ``matches`` is the per-message check.
    """

    tags: frozenset[str] | None  # None means "*"

    @classmethod
    def parse(cls, expression: str | None) -> TagFilter:
        if expression is None:
            return cls(None)
        text = expression.strip()
        if text in ("", "*"):
            return cls(None)
        parts = frozenset(p.strip() for p in text.split("||") if p.strip())
        return cls(parts or None)

    @property
    def is_all(self) -> bool:
        return self.tags is None

    def matches(self, tag: str | None) -> bool:
        if self.tags is None:
            return True
        return tag is not None and tag in self.tags


@dataclass(slots=True, frozen=True)
class Subscription:
    """A consumer's filter on one topic: ``expression_type`` TAG (``*`` or ``A || B``) or SQL92."""

    topic: str
    expression: str = "*"
    expression_type: str = "TAG"


@dataclass(slots=True, frozen=True)
class ConsumerOffset:
    """A committed offset of a consumer group on one queue."""

    group: str
    topic: str
    queue_id: int
    offset: int


@dataclass(slots=True, frozen=True)
class ConsumerInfo:
    """One client's membership in a consumer group, as learnt from its heartbeat."""

    client_id: str
    group: str
    subscriptions: tuple[Subscription, ...] = ()
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"


@dataclass(slots=True, frozen=True)
class FilterExpression:
    """A subscription filter as a client writes it: ``kind`` ``TAG`` (``*`` or ``A || B``) or ``SQL92``
    (over message properties). Implementations compile it; an SQL92 text that does not parse raises
    :class:`~mqproxy.model.errors.BadFilter`."""

    expression: str = "*"
    kind: str = "TAG"

    @property
    def matches_all(self) -> bool:
        return self.kind == "TAG" and self.expression.strip() in ("", "*")
