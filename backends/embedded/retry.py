"""Send-back of consumed messages: ``%RETRY%<group>`` with a growing delay, then ``%DLQ%<group>``.

CONSUMER_SEND_MSG_BACK semantics (spec §3.10, §7.2): the message keeps its body, flag, properties,
sysFlag and born fields; ``RETRY_TOPIC`` is set to its topic unless already present;
``ORIGIN_MESSAGE_ID`` keeps the first message id; ``reconsume_times`` grows by one. It goes to the DLQ
when its current ``reconsume_times >= max_reconsume_times`` or ``delay_level < 0``; otherwise to the
retry topic with ``DELAY`` = ``delay_level``, or ``3 + reconsume_times`` when 0 (10 s, 30 s, 1 m, ...),
clamped by the scheduler to its highest level. DLQ copies also carry ``DLQ_ORIGIN_TOPIC`` and
``DLQ_ORIGIN_MESSAGE_ID``.
"""

from __future__ import annotations

from mqproxy.backends.embedded.internal_topics import copy_message, ensure_topic
from mqproxy.backends.embedded.schedule import Scheduler
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.facade.types import SendBackResult
from mqproxy.model.errors import InvalidArgument
from mqproxy.model.properties import (
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
)
from mqproxy.model.topics import DLQ_PREFIX, RETRY_PREFIX
from mqproxy.model.types import PROPERTY_DELAY_LEVEL, PROPERTY_UNIQ_KEY, SendResult, StoredMessage

#: Subscription-group default ``retryMaxTimes``.
DEFAULT_MAX_RECONSUME_TIMES = 16
#: Added to ``reconsume_times`` when the client asks for delay level 0.
RETRY_LEVEL_BASE = 3


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


class RetryService:
    def __init__(
        self,
        backend: MessageStore,
        scheduler: Scheduler,
        *,
        max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
    ) -> None:
        self._backend = backend
        self._scheduler = scheduler
        self.max_reconsume_times = max_reconsume_times

    async def send_back(
        self,
        group: str,
        message: StoredMessage,
        *,
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        origin_msg_id: str | None = None,
    ) -> SendBackResult:
        """Re-queue a consumed ``message`` for ``group`` (or dead-letter it).

        ``origin_msg_id`` is the id the client knows the message by (protocol layers pass the offset
        message id); without one the ``UNIQ_KEY`` is used. ``max_reconsume_times`` None or negative
        means the service default (16).
        """
        if not group:
            raise InvalidArgument("consumer group is empty")
        limit = (
            self.max_reconsume_times
            if max_reconsume_times is None or max_reconsume_times < 0
            else (max_reconsume_times)
        )
        props = dict(message.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, message.topic)
        origin = props.get(PROPERTY_ORIGIN_MESSAGE_ID) or origin_msg_id or props.get(PROPERTY_UNIQ_KEY, "")
        if origin:
            props[PROPERTY_ORIGIN_MESSAGE_ID] = origin
        reconsumed = message.reconsume_times
        if reconsumed >= limit or delay_level < 0:
            return SendBackResult(True, 0, await self._dead_letter(group, message, props, origin))
        level = self._scheduler.clamp_level(delay_level or RETRY_LEVEL_BASE + reconsumed)
        props[PROPERTY_DELAY_LEVEL] = str(level)
        topic = retry_topic(group)
        await ensure_topic(self._backend, topic, 1)
        retry = copy_message(
            message, topic=topic, queue_id=0, properties=props, reconsume_times=reconsumed + 1
        )
        return SendBackResult(False, level, await self._scheduler.send(retry))

    async def dead_letter(
        self, group: str, message: StoredMessage, *, origin_msg_id: str | None = None
    ) -> SendResult:
        """Move ``message`` to ``%DLQ%<group>`` now (gRPC ForwardMessageToDeadLetterQueue, pop give-up)."""
        if not group:
            raise InvalidArgument("consumer group is empty")
        props = dict(message.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, message.topic)
        origin = props.get(PROPERTY_ORIGIN_MESSAGE_ID) or origin_msg_id or props.get(PROPERTY_UNIQ_KEY, "")
        if origin:
            props[PROPERTY_ORIGIN_MESSAGE_ID] = origin
        return await self._dead_letter(group, message, props, origin)

    async def _dead_letter(
        self, group: str, message: StoredMessage, props: dict[str, str], origin: str
    ) -> SendResult:
        props.pop(PROPERTY_DELAY_LEVEL, None)
        props.setdefault(PROPERTY_DLQ_ORIGIN_TOPIC, props.get(PROPERTY_RETRY_TOPIC, message.topic))
        if origin:
            props.setdefault(PROPERTY_DLQ_ORIGIN_MESSAGE_ID, origin)
        topic = dlq_topic(group)
        await ensure_topic(self._backend, topic, 1)
        dead = copy_message(
            message, topic=topic, queue_id=0, properties=props, reconsume_times=message.reconsume_times + 1
        )
        return await self._backend.send(dead)
