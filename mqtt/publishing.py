"""Publishing for the MQTT gateway: a message is stored once and dispatched into every light queue that
serves a matching subscription.

:class:`Publisher` (the gateway's :attr:`~mqproxy.mqtt.gateway.Gateway.publisher`) stores one MQTT publish
once in its parent topic and dispatches it into the topic's LMQ, the LMQ of every subscribed wildcard
filter that matches (in cluster mode also those of sessions held by other nodes), and the retained queue
when RETAIN is set (RIP-28); readers are woken by the store's long-poll (RIP-33 notify → pull → push).
A retained publish also updates the gateway's retained tree once the store took it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from mqproxy.codecs.mqtt import Properties
from mqproxy.model.errors import BackendError
from mqproxy.model.types import Message, SendResult
from mqproxy.mqtt.mapping import PROPERTY_MQTT_TOPIC, RETAINED_LMQ, encode_properties, lmq_name, parent_topic

if TYPE_CHECKING:
    from mqproxy.mqtt.gateway import Gateway

__all__ = ["MAX_BATCH", "PublishItem", "Publisher"]

#: Most client PUBLISHes written in one batch.
MAX_BATCH = 64
#: Most topics whose dispatch targets are remembered (all are forgotten when full, or when a filter set
#: changes).
MAX_CACHED_TARGETS = 4096
#: One MQTT publish to store: ``(topic, payload, qos, retain, properties)``.
PublishItem = tuple[str, bytes, int, bool, Properties]


class Publisher:
    """Stores and dispatches the publishes of ``gateway``'s clients and Wills, and names the LMQs of
    RocketMQ producers' messages (it reads the gateway's wildcard index, cluster view and retained tree
    as they are at each call)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        #: ``dispatch_targets`` answers by (topic, retain), valid while ``_targets_of`` is unchanged.
        self._targets: dict[tuple[str, bool], tuple[str, ...]] = {}
        self._targets_of: tuple[object, ...] = ()

    def rocketmq_dispatch(self, properties: Mapping[str, str]) -> tuple[str, ...]:
        """LMQs a RocketMQ-produced message with an ``MQTT_TOPIC`` property is dispatched to when its
        producer named none (``INNER_MULTI_DISPATCH``): the topic's LMQ plus every matching subscribed
        wildcard filter's (empty if the property is absent or not a valid MQTT topic name)."""
        topic = _dispatch_topic(properties)
        return self.dispatch_targets(topic, retain=False) if topic else ()

    def dispatch_targets(self, topic: str, retain: bool) -> tuple[str, ...]:
        """The LMQs a publish to ``topic`` is dispatched into (see the module docstring). Remembered per
        topic while the wildcard filters (the gateway's and, in cluster mode, the other nodes') stay the
        same: a fan-in publisher sends to the same few topics again and again."""
        gateway = self._gateway
        index, cluster = gateway.index, gateway.cluster
        state = (
            (index, index.version)
            if cluster is None
            else (index, index.version, cluster.filters, cluster.filters.version)
        )
        cache = self._targets
        if state != self._targets_of or len(cache) >= MAX_CACHED_TARGETS:
            cache.clear()
            self._targets_of = state
        key = (topic, retain)
        found = cache.get(key)
        if found is None:
            found = cache[key] = self._match_targets(topic, retain)
        return found

    def _match_targets(self, topic: str, retain: bool) -> tuple[str, ...]:
        targets = [lmq_name(topic)]
        local = self._gateway.index.match(topic)
        targets.extend([lmq_name(f) for f in local])
        cluster = self._gateway.cluster
        if cluster is not None:
            targets.extend([lmq_name(f) for f in cluster.match(topic) if f not in local])
        if retain:
            targets.append(RETAINED_LMQ)
        return tuple(targets)

    def _message(self, item: PublishItem, client_id: str, born_host: tuple[str, int]) -> Message:
        topic, payload, qos, retain, properties = item
        return Message(
            topic=parent_topic(topic),
            body=payload,
            properties=encode_properties(topic, qos, client_id, retain, properties),
            born_timestamp_ms=time.time_ns() // 1_000_000,
            born_host=born_host,
            dispatch=self.dispatch_targets(topic, retain),
        )

    async def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        properties: Properties,
        client_id: str,
        born_host: tuple[str, int] = ("127.0.0.1", 0),
    ) -> SendResult:
        """Store one MQTT publish once and dispatch it to every LMQ that serves a matching subscription."""
        item = (topic, payload, qos, retain, properties)
        result = await self._gateway.backend.send(self._message(item, client_id, born_host))
        if retain:
            await self._readable(result)
            self._gateway.retained.set(
                topic, payload, qos, properties, result.store_timestamp_ms, result.commitlog_offset
            )
        return result

    async def publish_many(
        self,
        items: list[PublishItem],
        client_id: str,
        born_host: tuple[str, int] = ("127.0.0.1", 0),
    ) -> list[SendResult | BackendError]:
        """Store ``(topic, payload, qos, retain, properties)`` publishes in order, one batch write per run
        of the same parent topic; a refused batch is retried message by message, so each item gets its own
        result or error."""
        messages = [self._message(item, client_id, born_host) for item in items]
        out: list[SendResult | BackendError] = []
        start = 0
        while start < len(messages):
            end = start + 1
            parent = messages[start].topic
            while end < len(messages) and end - start < MAX_BATCH and messages[end].topic == parent:
                end += 1
            chunk = messages[start:end]
            try:
                out.extend(await self._gateway.backend.send_batch(chunk))
            except BackendError:
                for message in chunk:
                    try:
                        out.append(await self._gateway.backend.send(message))
                    except BackendError as exc:
                        out.append(exc)
            start = end
        for (topic, payload, qos, retain, props), result in zip(items, out, strict=True):
            if retain and isinstance(result, SendResult):
                await self._readable(result)
                self._gateway.retained.set(
                    topic, payload, qos, props, result.store_timestamp_ms, result.commitlog_offset
                )
        return out

    async def _readable(self, result: SendResult) -> None:
        """Cluster mode: wait until a retained message just stored is readable by every node (a broker
        indexes a stored message shortly after it answers the send), so a client that connects anywhere
        after the PUBACK gets it."""
        gateway = self._gateway
        if gateway.cluster is not None:
            await gateway.backend.wait_for_message(result.topic, result.queue_id, result.queue_offset, 5.0)


def _dispatch_topic(properties: Mapping[str, str]) -> str:
    """The ``MQTT_TOPIC`` a RocketMQ-produced message names, or "" if none or not a valid topic name."""
    topic = properties.get(PROPERTY_MQTT_TOPIC)
    if not topic or "+" in topic or "#" in topic or "\x00" in topic:
        return ""
    return topic
