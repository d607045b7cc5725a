"""Broker metadata an administrator sets: subscription-group configs and topic message types.

Apache RocketMQ keeps both in the broker (``subscriptionGroup.json``, ``topics.json`` attributes) and sets
them with ``mqadmin updateSubGroup`` / ``updateTopic`` (remoting UPDATE_AND_CREATE_SUBSCRIPTIONGROUP and
UPDATE_AND_CREATE_TOPIC). The gRPC protocol depends on them:

* a group whose config says ``consumeMessageOrderly`` is a FIFO group: its clients are told
  ``subscription.fifo`` in their settings, receive pops in order, and QueryAssignment names every queue.
  Its ``retryMaxTimes`` + 1 is the ``max_attempts`` its clients are told (push consumers forward a message
  to the dead-letter queue after that many; the broker's own redelivery limit stays
  ``broker.max_reconsume_times``). Other ``SubscriptionGroupConfig`` fields are not kept.
* a topic's ``message.type`` attribute (NORMAL, FIFO, DELAY, TRANSACTION, MIXED) is what its route's
  ``accept_message_types`` lists and what a gRPC send is checked against.

Topics nobody typed (auto-created ones) have no entry here: the gRPC layer treats them as MIXED, since
mqproxy creates topics on first use where the stock proxy would refuse them. Groups nobody configured
have no entry either: they are concurrent (not FIFO), with the broker's retry limit.

Durability: one record per change in queue 0 of :data:`METADATA_TOPIC` (JSON body; a deletion is a
record with ``"live": false``), replayed at :meth:`BrokerMetadata.start` through
:mod:`~mqproxy.backends.embedded.compaction` and compacted there when mostly dead.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Final

import orjson

from mqproxy.backends.embedded.compaction import compact_if_worth
from mqproxy.backends.embedded.internal_topics import ensure_topic
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.facade.types import GroupConfig, TopicMessageType, parse_topic_attributes
from mqproxy.model.types import Message, StoredMessage

__all__ = [
    "METADATA_TOPIC",
    "BrokerMetadata",
    "GroupConfig",
    "TopicMessageType",
    "parse_topic_attributes",
]

#: The metadata log (one queue).
METADATA_TOPIC: Final = "rmq_sys_BROKER_METADATA"
#: Dead records that make a start-up compaction worth it.
COMPACT_MIN_GARBAGE: Final = 64
_KIND_GROUP, _KIND_TOPIC = "group", "topic"


def _key_of(message: StoredMessage) -> tuple[str, bool] | None:
    try:
        record = orjson.loads(message.body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or record.get("kind") not in (_KIND_GROUP, _KIND_TOPIC):
        return None
    return f"{record['kind']}:{record.get('name', '')}", bool(record.get("live", True))


class BrokerMetadata:
    """Group configs and topic message types, in memory and in :data:`METADATA_TOPIC`."""

    def __init__(self, backend: MessageStore) -> None:
        self.backend = backend
        self._groups: dict[str, GroupConfig] = {}
        self._topic_types: dict[str, TopicMessageType] = {}

    async def start(self) -> None:
        """Create the metadata topic and load its records (compacting it when mostly dead)."""
        await ensure_topic(self.backend, METADATA_TOPIC, 1)
        found = await compact_if_worth(self.backend, METADATA_TOPIC, 0, _key_of, COMPACT_MIN_GARBAGE)
        self._groups.clear()
        self._topic_types.clear()
        for message in found.live():
            self._apply(orjson.loads(message.body))

    def _apply(self, record: dict[str, object]) -> None:
        name = str(record.get("name", ""))
        live = bool(record.get("live", True))
        if record.get("kind") == _KIND_GROUP:
            if not live:
                self._groups.pop(name, None)
                return
            self._groups[name] = GroupConfig(
                name=name,
                consume_orderly=bool(record.get("consume_orderly", False)),
                retry_max_times=int(record.get("retry_max_times", 16)),  # type: ignore[call-overload]
            )
        elif live:
            self._topic_types[name] = TopicMessageType(str(record.get("message_type")))
        else:
            self._topic_types.pop(name, None)

    async def _write(self, record: dict[str, object]) -> None:
        await self.backend.send(Message(topic=METADATA_TOPIC, body=orjson.dumps(record), queue_id=0))
        self._apply(record)

    # --- subscription groups ---------------------------------------------------------------------

    def group(self, name: str) -> GroupConfig | None:
        return self._groups.get(name)

    def is_fifo_group(self, name: str) -> bool:
        config = self._groups.get(name)
        return config is not None and config.consume_orderly

    async def put_group(self, config: GroupConfig) -> None:
        """Create or replace a group's config (durable before it returns)."""
        if self._groups.get(config.name) == config:
            return
        await self._write({"kind": _KIND_GROUP, "live": True, **asdict(config)})

    async def delete_group(self, name: str) -> bool:
        """Forget a group's config; False if it had none."""
        if name not in self._groups:
            return False
        await self._write({"kind": _KIND_GROUP, "name": name, "live": False})
        return True

    # --- topic message types ---------------------------------------------------------------------

    def topic_type(self, topic: str) -> TopicMessageType | None:
        """The message type an administrator gave ``topic``; None for an untyped topic."""
        return self._topic_types.get(topic)

    async def set_topic_type(self, topic: str, message_type: TopicMessageType | None) -> None:
        """Type ``topic`` (None: remove its type)."""
        if self._topic_types.get(topic) is message_type:
            return
        if message_type is None:
            await self._write({"kind": _KIND_TOPIC, "name": topic, "live": False})
        else:
            record = {"kind": _KIND_TOPIC, "name": topic, "live": True, "message_type": message_type.value}
            await self._write(record)
