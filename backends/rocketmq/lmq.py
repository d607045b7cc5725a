"""
mqproxy.backends.rocketmq.lmq
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Light message queues (LMQ, ``%LMQ%<name>``, one queue each) on a stock RocketMQ cluster, the way
rocketmq-mqtt uses them: a message is stored once in its topic and the broker's multi-dispatch
(``enableLmq`` and ``enableMultiDispatch``) indexes it into the LMQs its ``INNER_MULTI_DISPATCH`` property
names. This module holds the sans-IO helpers and :class:`LmqSending`, the send side mixed into
:class:`~.broker.RocketMQBroker`; reads branch on :func:`~mqproxy.model.topics.is_lmq` in :mod:`.consume`.

Contracts:

* **An LMQ per broker.** A broker fills LMQs only with what it stored itself (rocketmq-mqtt's model: its
  LMQ queue is keyed by broker name and read on every broker). So an LMQ has one queue id per broker of
  the :class:`~.vqueues.BrokerIndex` (queue ``q`` = the broker at index ``q + 1``, see
  :meth:`~.cluster.Cluster.lmq_queue_broker`), each that broker's real queue 0 with its own offsets,
  consumer offsets and long polls; readers read every queue id (:meth:`~.broker.RocketMQBroker.get_topic`
  answers an LMQ with that many queues).
* **Sends with dispatch** go to a writable queue of the message's topic on the preferred LMQ broker
  (:meth:`~.cluster.Cluster.lmq_send_order`; the topic is created if missing, on every master, or on that
  broker if only it lacks the topic), with ``INNER_MULTI_DISPATCH`` = the deduplicated LMQ names joined by
  ``,`` (RocketMQ ``MixAll.LMQ_DISPATCH_SEPARATOR``). A send that fails on it (unreachable, or a refusal
  that the send path retries elsewhere) goes once to the next live master holding the topic: the message
  then fills that broker's copies of its LMQs. Only a broker's answer counts as stored; a send whose answer
  was lost may be stored twice (at least once). Order: one publisher's messages go to one broker at a time,
  so a reader sees them in order except around a failover (messages on the two brokers are read side by
  side, not interleaved by time).
  The broker answers with the topic's coordinates only; the LMQ offsets it assigned are in the stored
  message's ``INNER_MULTI_QUEUE_OFFSET`` (same order), so ``SendResult.lmq_offsets`` stays empty.
* **Batches.** A stock 5.3 broker does not multi-dispatch the messages of a batch (``CommitLog``'s batch
  append has no LMQ branch), so a batch with any dispatching message is sent one message at a time, in
  order; it is not atomic (a failure part-way leaves the earlier messages stored).
* **Reads** return what the broker stored: the message's own topic, virtual queue and queue offset (as
  the embedded store's LMQ pulls do); the LMQ offsets are in ``INNER_MULTI_QUEUE_OFFSET``
  (:func:`lmq_offsets`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

import structlog
import trio

from mqproxy.codecs.remoting_codes import ResponseCode
from mqproxy.facade.api import LmqDispatch, SendRequest
from mqproxy.model.errors import ClusterUnavailable, IllegalTopic, TopicNotFound
from mqproxy.model.topics import RETRY_PREFIX, SYSTEM_TOPIC_PREFIX, default_queue_count, validate_lmq
from mqproxy.model.types import (
    PERM_READ,
    PERM_WRITE,
    PROPERTY_INNER_MULTI_DISPATCH,
    PROPERTY_INNER_MULTI_QUEUE_OFFSET,
    Message,
    SendResult,
)

if TYPE_CHECKING:
    from mqproxy.backends.rocketmq.cluster import Cluster, TopicView

__all__ = [
    "DISPATCH_SEPARATOR",
    "READER_GROUP",
    "LmqSending",
    "dispatch_targets",
    "lmq_offsets",
    "wait_answer",
    "with_dispatch",
]

_log = structlog.get_logger("mqproxy.backends.rocketmq")
#: RocketMQ ``MixAll.LMQ_DISPATCH_SEPARATOR``.
DISPATCH_SEPARATOR: Final = ","
#: The consumer group of reads that name none (the MQTT gateway's) and of long polls; the broker
#: auto-creates it (``autoCreateSubscriptionGroup``) or :mod:`.consume` creates it on the broker.
READER_GROUP: Final = "MQPROXY_READER"
#: Topics a broker never multi-dispatches from (RocketMQ ``MixAll.topicAllowsLMQ``).
_NO_DISPATCH_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
_CREATE_WAIT_S: Final = 10.0


def dispatch_targets(message: Message) -> tuple[str, ...]:
    """The LMQs ``message`` is to be indexed into (deduplicated, in order); raises
    :class:`~mqproxy.model.errors.IllegalTopic` for a name that is not an LMQ or a topic the broker does
    not multi-dispatch from."""
    if not message.dispatch:
        return ()
    topic = message.topic
    if topic.startswith((RETRY_PREFIX, SYSTEM_TOPIC_PREFIX)) or topic == _NO_DISPATCH_TOPIC:
        raise IllegalTopic(f"multi-dispatch is not allowed from {topic}")
    targets = tuple(dict.fromkeys(message.dispatch))
    for name in targets:
        validate_lmq(name)
        if DISPATCH_SEPARATOR in name:  # unreachable for legal names; the separator would split it
            raise IllegalTopic(f"LMQ name {name[:64]!r} contains {DISPATCH_SEPARATOR!r}")
    return targets


def with_dispatch(message: Message, targets: Sequence[str]) -> Message:
    """A copy of ``message`` whose properties name ``targets`` for the broker's multi-dispatch."""
    properties = dict(message.properties)
    properties.pop(PROPERTY_INNER_MULTI_QUEUE_OFFSET, None)  # the broker assigns these
    properties[PROPERTY_INNER_MULTI_DISPATCH] = DISPATCH_SEPARATOR.join(targets)
    return dataclasses.replace(message, properties=properties)


def lmq_offsets(properties: Mapping[str, str]) -> dict[str, int]:
    """The LMQ offsets a broker stored with a multi-dispatched message, by LMQ name ({} if none or the
    two properties do not pair up)."""
    names = properties.get(PROPERTY_INNER_MULTI_DISPATCH, "")
    offsets = properties.get(PROPERTY_INNER_MULTI_QUEUE_OFFSET, "")
    if not names or not offsets:
        return {}
    name_list = names.split(DISPATCH_SEPARATOR)
    offset_list = offsets.split(DISPATCH_SEPARATOR)
    if len(name_list) != len(offset_list):
        return {}
    found: dict[str, int] = {}
    for name, text in zip(name_list, offset_list, strict=True):
        if text.strip().lstrip("-").isdigit():
            found[name] = int(text)
    return found


def wait_answer(code: int) -> bool | None:
    """What a long-poll pull's answer says of "a message at or after the offset": True (found, not
    matched, or the offset moved: messages exist), False (none within the hold), None (a refusal)."""
    if code in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_OFFSET_MOVED):
        return True
    if code == ResponseCode.PULL_NOT_FOUND:
        return False
    return None


class LmqSending:
    """The send side of LMQs, mixed into :class:`~.broker.RocketMQBroker`."""

    cluster: Cluster
    _lmq_dispatch: LmqDispatch | None

    def _name_lmqs(self, message: Message) -> tuple[str, ...]:
        """``message``'s LMQs, named by the installed :data:`~mqproxy.facade.api.LmqDispatch` when the
        message names none (a RocketMQ producer's message with ``MQTT_TOPIC``), as embedded does."""
        if not message.dispatch and self._lmq_dispatch is not None:
            if PROPERTY_INNER_MULTI_DISPATCH not in message.properties:
                message.dispatch = self._lmq_dispatch(message.properties)
        return dispatch_targets(message)

    async def _lmq_route(self, message: Message, create_queues: int | None) -> tuple[TopicView, list[int]]:
        """The topic's view and the virtual queues a dispatching send tries, one per broker in
        :meth:`~.cluster.Cluster.lmq_send_order` that has a writable queue of the topic (the wanted queue
        first when it is on the first broker). A missing topic is created (``create_queues`` or the
        default count per broker) unless auto-creation is off."""
        brokers = await self.cluster.lmq_send_order()
        first = brokers[0]
        topic = message.topic
        create = self.cluster.config.auto_create_topics
        view = await self.cluster.view(topic)
        if view is None:
            if not create:
                raise TopicNotFound(f"topic {topic} has no route in the cluster")
            await self.create_topic(topic, create_queues)  # type: ignore[attr-defined]
            view = await self.cluster.view(topic)
        queues = _on_broker(view, first)
        if not queues and create:
            count = create_queues or default_queue_count(topic, self.cluster.config.default_queue_count)
            await self._create_on_brokers(topic, count, PERM_READ | PERM_WRITE, brokers=[first])  # type: ignore[attr-defined]
            _log.info("cluster.topic_created", topic=topic, queues_per_broker=count, broker_count=1)
            with trio.move_on_after(_CREATE_WAIT_S):
                while not queues:
                    await trio.sleep(0.1)
                    view = await self.cluster.view(topic, fresh=True)
                    queues = _on_broker(view, first)
        if view is None:
            raise ClusterUnavailable(f"topic {topic} has no route in the cluster")
        order: list[int] = []
        for broker in brokers:
            on_broker = queues if broker == first else _on_broker(view, broker)
            if not on_broker:
                continue
            if message.queue_id in on_broker:
                order.append(message.queue_id)
            else:
                order.append(on_broker[next(self._round_robin) % len(on_broker)])  # type: ignore[attr-defined]
        if not order:
            raise ClusterUnavailable(f"no live broker has a writable queue of {topic}")
        return view, order

    async def _send_batch_dispatched(self, messages: Sequence[Message]) -> list[SendResult]:
        """A batch with multi-dispatch: one send per message, in order (see the module contracts)."""
        results = []
        for message in messages:
            outcome = await self.send(SendRequest(message))  # type: ignore[attr-defined]
            results.append(outcome.result)
        return results


def _on_broker(view: TopicView | None, broker: str) -> list[int]:
    if view is None:
        return []
    return [v for v in view.writable_queues() if (e := view.real(v)) is not None and e.broker == broker]
