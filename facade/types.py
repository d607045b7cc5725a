"""
mqproxy.facade.types
~~~~~~~~~~~~~~~~~~~~

The small typed values of the :class:`~mqproxy.facade.api.BrokerFacade` interface that are not part of the
message model: pop modes and ack outcomes, send-back and transaction results, check-back requests, queue
references for locks, consumer-group and topic metadata, consume modes.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from mqproxy.model.errors import InvalidArgument
from mqproxy.model.types import SendResult, StoredMessage


class InitMode(enum.IntEnum):
    """Where a group without a committed offset starts (PopMessageRequestHeader ``initMode``)."""

    MIN = 0
    MAX = 1


class AckOutcome(enum.Enum):
    ACKED = "acked"
    ALREADY_ACKED = "already_acked"  # a repeated ack: a no-op, as the broker answers SUCCESS


@dataclass(slots=True, frozen=True)
class SendBackResult:
    """Where a sent-back message went: ``dead`` is True for the DLQ; ``delay_level`` 0 there."""

    dead: bool
    delay_level: int
    result: SendResult


class Resolution(enum.Enum):
    UNKNOWN = 0
    COMMIT = 8
    ROLLBACK = 12


@dataclass(slots=True, frozen=True)
class TransactionCheck:
    """One check-back to send: CHECK_TRANSACTION_STATE (remoting) or RecoverOrphanedTransaction (gRPC).

    ``half`` is the stored half record (its ``commitlog_offset`` and ``queue_offset`` are the
    ``commitLogOffset`` / ``tranStateTableOffset`` of the request); ``message`` is the same record with
    topic and queue restored to ``REAL_TOPIC`` / ``REAL_QID`` (the body to send).
    """

    producer_group: str
    transaction_id: str
    check_times: int
    half: StoredMessage
    message: StoredMessage


#: Sends a check to a live producer of ``check.producer_group``; returns False if none was online.
CheckBack = Callable[[TransactionCheck], Awaitable[bool]]


@dataclass(frozen=True, slots=True, order=True)
class QueueRef:
    topic: str
    queue_id: int


#: The topic attribute naming the message type (RocketMQ ``TopicAttributes.TOPIC_MESSAGE_TYPE_ATTRIBUTE``).
MESSAGE_TYPE_ATTRIBUTE: Final = "message.type"


class TopicMessageType(enum.Enum):
    """RocketMQ ``TopicMessageType`` (what a typed topic accepts)."""

    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    MIXED = "MIXED"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """The parts of RocketMQ's ``SubscriptionGroupConfig`` mqproxy acts on."""

    name: str
    consume_orderly: bool = False
    retry_max_times: int = 16


def parse_topic_attributes(text: str) -> TopicMessageType | None:
    """The message type an UPDATE_AND_CREATE_TOPIC ``attributes`` field sets (``+message.type=FIFO``;
    entries separated by ``,``): None when it does not mention ``message.type``, NORMAL for
    ``-message.type`` (RocketMQ's default). Other attributes are accepted and ignored. Raises
    :class:`InvalidArgument` for an unknown type or a malformed entry."""
    found: TopicMessageType | None = None
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        if entry[0] not in "+-":
            raise InvalidArgument(f"topic attribute {entry[:64]!r} must start with + or -")
        key, _, value = entry[1:].partition("=")
        if key.strip() != MESSAGE_TYPE_ATTRIBUTE:
            continue
        if entry[0] == "-":
            found = TopicMessageType.NORMAL
            continue
        try:
            found = TopicMessageType(value.strip().upper())
        except ValueError:
            raise InvalidArgument(f"unknown {MESSAGE_TYPE_ATTRIBUTE} {value[:32]!r}") from None
    return found


#: The broker's ``defaultMessageRequestMode`` / ``defaultPopShareQueueNum``.
DEFAULT_MODE: Final = "PULL"


DEFAULT_POP_SHARE_QUEUE_NUM: Final = -1


@dataclass(frozen=True, slots=True)
class RequestMode:
    mode: str
    pop_share_queue_num: int = 0
