"""
mqproxy.connector.origin
~~~~~~~~~~~~~~~~~~~~~~~~

What a copied message carries about where it came from, and how a source message becomes its copy.
Sans-IO.

Contracts:

* :func:`translate` keeps body, flag, tags, keys, user properties, the message id (``UNIQ_KEY``) and the
  body's compression bits; it adds the origin properties (:data:`ORIGIN_CLUSTER` … :data:`ORIGIN_STORE_MS`:
  the *immediate* source, which progress recovery and offset translation read) and appends the source
  cluster id to :data:`PATH` (every cluster the message was stored in, oldest first, ``,``-separated).
* Properties that would make the target treat the copy as something other than a plain stored message
  (transaction, delay/timer, multi-dispatch, pop bookkeeping) are dropped; a timer's delivery time is kept
  as :data:`ORIGIN_DELIVER_MS`. A message is read from a source queue only once it is due, so its copy is
  stored at once (the tail of the target queue must hold every acknowledged copy: see :mod:`.progress`).
* :func:`loops_back` is true when the target cluster is already on the message's path: such a message is
  never copied there (two opposite rules do not ping-pong).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from mqproxy.codecs.message_record import SYSFLAG_COMPRESSED, SYSFLAG_COMPRESSION_MASK
from mqproxy.model.ids import MessageIdError, offset_msg_id
from mqproxy.model.properties import (
    PROPERTY_CHECK_IMMUNITY_TIME,
    PROPERTY_FIRST_POP_TIME,
    PROPERTY_POP_CK,
    PROPERTY_PREPARED_QUEUE_OFFSET,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
)
from mqproxy.model.types import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_INNER_MULTI_DISPATCH,
    PROPERTY_INNER_MULTI_QUEUE_OFFSET,
    PROPERTY_MAX_OFFSET,
    PROPERTY_MIN_OFFSET,
    PROPERTY_UNIQ_KEY,
    Message,
    StoredMessage,
)

__all__ = [
    "ORIGIN_CLUSTER",
    "PATH",
    "Origin",
    "SourceQueue",
    "loops_back",
    "message_id",
    "origin_of",
    "translate",
]

ORIGIN_CLUSTER: Final = "CONNECTOR_ORIGIN_CLUSTER"
ORIGIN_TOPIC: Final = "CONNECTOR_ORIGIN_TOPIC"
ORIGIN_BROKER: Final = "CONNECTOR_ORIGIN_BROKER"
ORIGIN_QUEUE: Final = "CONNECTOR_ORIGIN_QUEUE"
ORIGIN_OFFSET: Final = "CONNECTOR_ORIGIN_OFFSET"
ORIGIN_MSG_ID: Final = "CONNECTOR_ORIGIN_MSG_ID"
ORIGIN_STORE_MS: Final = "CONNECTOR_ORIGIN_STORE_MS"
ORIGIN_DELIVER_MS: Final = "CONNECTOR_ORIGIN_DELIVER_MS"
PATH: Final = "CONNECTOR_PATH"
#: On a dead letter: why the target refused the message (broker code and remark).
DLQ_REASON: Final = "CONNECTOR_DLQ_REASON"
#: On a dead letter whose body the target refused too: the size of the body left out.
DLQ_BODY_DROPPED: Final = "CONNECTOR_DLQ_BODY_DROPPED"

_DROPPED: Final = frozenset(
    {
        PROPERTY_MIN_OFFSET,
        PROPERTY_MAX_OFFSET,
        PROPERTY_INNER_MULTI_DISPATCH,
        PROPERTY_INNER_MULTI_QUEUE_OFFSET,
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_PRODUCER_GROUP,
        PROPERTY_TRANSACTION_ID,
        PROPERTY_TRANSACTION_CHECK_TIMES,
        PROPERTY_CHECK_IMMUNITY_TIME,
        PROPERTY_PREPARED_QUEUE_OFFSET,
        PROPERTY_DELAY_LEVEL,
        PROPERTY_TIMER_DELIVER_MS,
        PROPERTY_TIMER_DELAY_SEC,
        PROPERTY_TIMER_DELAY_MS,
        "__STARTDELIVERTIME",
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QID,
        PROPERTY_FIRST_POP_TIME,
        PROPERTY_POP_CK,
    }
)
_KEEP_SYS_FLAG: Final = SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_MASK


@dataclass(frozen=True, slots=True, order=True)
class SourceQueue:
    """One queue of a source topic, by the source cluster's id and real broker name."""

    cluster: str
    topic: str
    broker: str
    queue_id: int

    @property
    def key(self) -> str:
        return f"{self.broker}:{self.queue_id}"


@dataclass(frozen=True, slots=True)
class Origin:
    """The origin properties of a copied message."""

    queue: SourceQueue
    offset: int
    msg_id: str
    store_ms: int


def message_id(message: StoredMessage) -> str:
    """The message's id as clients know it: ``UNIQ_KEY``, else its offset message id."""
    uniq = message.properties.get(PROPERTY_UNIQ_KEY)
    if uniq:
        return uniq
    try:
        return offset_msg_id(message.store_host, message.commitlog_offset)
    except MessageIdError:
        return str(message.commitlog_offset)


def path_of(properties: Mapping[str, str]) -> list[str]:
    text = properties.get(PATH, "")
    return [p for p in text.split(",") if p]


def loops_back(properties: Mapping[str, str], target_cluster: str) -> bool:
    """True when the message was stored in ``target_cluster`` before (it must not go back there)."""
    return target_cluster in path_of(properties)


def origin_of(properties: Mapping[str, str]) -> Origin | None:
    """The origin a copied message carries, or None (not a copy, or unreadable origin properties)."""
    try:
        queue = SourceQueue(
            properties[ORIGIN_CLUSTER],
            properties[ORIGIN_TOPIC],
            properties[ORIGIN_BROKER],
            int(properties[ORIGIN_QUEUE]),
        )
        return Origin(
            queue,
            int(properties[ORIGIN_OFFSET]),
            properties.get(ORIGIN_MSG_ID, ""),
            int(properties.get(ORIGIN_STORE_MS, "0") or 0),
        )
    except (KeyError, ValueError):
        return None


def translate(message: StoredMessage, source: SourceQueue, target_topic: str, target_queue: int) -> Message:
    """The copy of ``message`` (read from ``source``) for ``target_queue`` of ``target_topic``."""
    props = {k: v for k, v in message.properties.items() if k not in _DROPPED}
    deliver = message.properties.get(PROPERTY_TIMER_DELIVER_MS)
    if deliver:
        props[ORIGIN_DELIVER_MS] = deliver
    path = path_of(message.properties)
    if not path or path[-1] != source.cluster:
        path.append(source.cluster)
    props.update(
        {
            ORIGIN_CLUSTER: source.cluster,
            ORIGIN_TOPIC: source.topic,
            ORIGIN_BROKER: source.broker,
            ORIGIN_QUEUE: str(source.queue_id),
            ORIGIN_OFFSET: str(message.queue_offset),
            ORIGIN_MSG_ID: message_id(message),
            ORIGIN_STORE_MS: str(message.store_timestamp_ms),
            PATH: ",".join(path),
        }
    )
    return Message(
        topic=target_topic,
        body=message.body,
        queue_id=target_queue,
        flag=message.flag,
        properties=props,
        sys_flag=message.sys_flag & _KEEP_SYS_FLAG,
        born_timestamp_ms=message.born_timestamp_ms,
        born_host=message.born_host,
    )
