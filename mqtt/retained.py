"""Retained messages: the last retained PUBLISH per topic, durable through the store.

Every retained PUBLISH (including the empty one that clears) is stored once like any other message and
also dispatched into :data:`~mqproxy.mqtt.mapping.RETAINED_LMQ`; the last record per MQTT topic in that
queue is the topic's retained value. :meth:`RetainedStore.load` replays the queue at start-up into an
in-memory map. (The queue is never compacted: replay time grows with the number of retained publishes.)
"""

from __future__ import annotations

from dataclasses import dataclass

from mqproxy.broker.backend import Backend
from mqproxy.broker.topics import LMQ_QUEUE_ID
from mqproxy.broker.types import PullStatus, StoredMessage
from mqproxy.codecs.mqtt import Properties, topic_matches
from mqproxy.mqtt.mapping import RETAINED_LMQ, decode_properties


@dataclass(frozen=True, slots=True)
class RetainedMessage:
    topic: str
    payload: bytes
    qos: int
    properties: Properties
    store_timestamp_ms: int


class RetainedStore:
    def __init__(self) -> None:
        self._by_topic: dict[str, RetainedMessage] = {}

    def __len__(self) -> int:
        return len(self._by_topic)

    async def load(self, backend: Backend) -> None:
        """Rebuild the map from the retained queue (call once, before serving)."""
        offset = await backend.min_offset(RETAINED_LMQ, LMQ_QUEUE_ID)
        while True:
            result = await backend.pull(RETAINED_LMQ, LMQ_QUEUE_ID, offset, 256)
            if result.status is PullStatus.OFFSET_ILLEGAL and result.next_offset != offset:
                offset = result.next_offset
                continue
            for message in result.messages:
                self.apply(message)
            if not result.messages or result.next_offset <= offset:
                return
            offset = result.next_offset

    def apply(self, message: StoredMessage) -> None:
        attrs = decode_properties(message.properties)
        if attrs is not None:
            self.set(attrs.topic, message.body, attrs.qos, attrs.properties, message.store_timestamp_ms)

    def set(self, topic: str, payload: bytes, qos: int, properties: Properties, store_ms: int) -> None:
        """Replace the topic's retained message; an empty payload clears it."""
        if payload:
            self._by_topic[topic] = RetainedMessage(topic, payload, qos, properties, store_ms)
        else:
            self._by_topic.pop(topic, None)

    def matching(self, topic_filter: str) -> list[RetainedMessage]:
        """Retained messages whose topic matches ``topic_filter`` (exact filters: one dict lookup)."""
        if "+" not in topic_filter and "#" not in topic_filter:
            found = self._by_topic.get(topic_filter)
            return [found] if found is not None else []
        return [m for t, m in self._by_topic.items() if topic_matches(topic_filter, t)]
