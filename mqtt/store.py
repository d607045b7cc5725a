"""What the MQTT gateway asks of the broker: :class:`LightStore`, and :class:`FacadeStore`, which answers it
through the :class:`~mqproxy.facade.api.BrokerFacade`.

The gateway reads light queues by position (no consumer group, no filter), writes its session and retained
state logs, and long-polls caught-up queues; :class:`LightStore` names exactly that, in the positional shape
the readers use. Any implementation with these methods works (tests hand the gateway an in-memory store).

A light queue is one queue (:data:`~mqproxy.model.topics.LMQ_QUEUE_ID`) in the embedded store; on a
RocketMQ cluster it has one queue id per broker (each broker fills its own copy with what it stored), and
a reader reads every one with its own offsets. :func:`queue_ids` says which a topic has: a store may answer
it with a ``queue_ids(topic)`` method; one without (an in-memory test store) has queue 0 only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from mqproxy.facade.api import BrokerFacade, PullRequest, SendRequest
from mqproxy.model.topics import LMQ_QUEUE_ID
from mqproxy.model.types import ConsumerInfo, Message, PullResult, SendResult, StoredMessage, TopicConfig

__all__ = ["FacadeStore", "LightStore", "queue_ids"]


async def queue_ids(store: object, topic: str) -> tuple[int, ...]:
    """The queue ids a reader of ``topic`` reads (at least one; see the module docstring)."""
    answer = getattr(store, "queue_ids", None)
    if answer is None:
        return (LMQ_QUEUE_ID,)
    found: tuple[int, ...] = await answer(topic)
    return found or (LMQ_QUEUE_ID,)


class LightStore(Protocol):
    """The broker operations MQTT uses. Errors are :mod:`mqproxy.model.errors` subclasses."""

    async def send(self, message: Message) -> SendResult:
        """Store one message (and index it into ``message.dispatch``'s light queues)."""
        ...

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        """Store messages of one topic atomically: all or none."""
        ...

    async def pull(self, topic: str, queue_id: int, offset: int, max_count: int) -> PullResult:
        """Up to ``max_count`` messages of the queue from ``offset``, without waiting."""
        ...

    async def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """Block until the queue holds a message at or after ``offset`` (True) or the timeout passes."""
        ...

    async def get_message(self, commitlog_offset: int) -> StoredMessage | None: ...

    async def min_offset(self, topic: str, queue_id: int) -> int: ...

    async def max_offset(self, topic: str, queue_id: int) -> int: ...

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset stored at or after ``timestamp_ms`` (the max offset if none)."""
        ...

    async def query_consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None: ...

    async def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None: ...

    async def rewrite_queue(self, topic: str, queue_id: int, keep: Sequence[int], below: int) -> int: ...

    async def create_topic(self, topic: str, queue_count: int | None = None) -> TopicConfig: ...


class FacadeStore:
    """:class:`LightStore` over a broker facade (reads without group or filter, sends without auto-create)."""

    def __init__(self, broker: BrokerFacade) -> None:
        self.broker = broker

    async def send(self, message: Message) -> SendResult:
        return (await self.broker.send(SendRequest(message))).result

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        return await self.broker.send_batch(messages)

    async def pull(self, topic: str, queue_id: int, offset: int, max_count: int) -> PullResult:
        return await self.broker.pull(PullRequest("", topic, queue_id, offset, max_count))

    async def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        return await self.broker.wait_for_message(topic, queue_id, offset, timeout_s)

    async def get_message(self, commitlog_offset: int) -> StoredMessage | None:
        return await self.broker.get_message(commitlog_offset)

    def watch(self, topic: str, queue_id: int, offset: int, callback: Callable[[], None]) -> bool | None:
        """``wait_for_message`` without a task where the broker has it (the embedded one): True if
        ``callback`` will be called once, when the queue may hold a message at or after ``offset``; False
        if it holds one already; None if the broker cannot watch (long-poll it instead)."""
        watch = getattr(self.broker, "watch_queue", None)
        if watch is None:
            return None
        watching: bool | None = watch(topic, queue_id, offset, callback)
        return watching

    def pull_now(self, topic: str, queue_id: int, offset: int, max_count: int) -> PullResult | None:
        """:meth:`pull` as a plain call where the broker can answer one (the embedded one: a read never
        waits), for the push hubs' hand-off inside the store's notify; None where it cannot."""
        pull_now = getattr(self.broker, "pull_queue_now", None)
        return None if pull_now is None else pull_now(topic, queue_id, offset, max_count)  # type: ignore[no-any-return]

    def unwatch(self, topic: str, queue_id: int, callback: Callable[[], None]) -> None:
        """Forget a :meth:`watch` callback not called yet."""
        unwatch = getattr(self.broker, "unwatch_queue", None)
        if unwatch is not None:
            unwatch(topic, queue_id, callback)

    async def min_offset(self, topic: str, queue_id: int) -> int:
        return await self.broker.min_offset(topic, queue_id)

    async def max_offset(self, topic: str, queue_id: int) -> int:
        return await self.broker.max_offset(topic, queue_id)

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return await self.broker.search_offset(topic, queue_id, timestamp_ms)

    async def query_consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return await self.broker.query_consumer_offset(group, topic, queue_id)

    async def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        await self.broker.commit_consumer_offset(group, topic, queue_id, offset)

    async def rewrite_queue(self, topic: str, queue_id: int, keep: Sequence[int], below: int) -> int:
        return await self.broker.rewrite_queue(topic, queue_id, keep, below)

    async def create_topic(self, topic: str, queue_count: int | None = None) -> TopicConfig:
        return await self.broker.create_topic(topic, queue_count)

    async def queue_ids(self, topic: str) -> tuple[int, ...]:
        """The readable queue ids of ``topic`` (an LMQ on a cluster: one per broker)."""
        config = await self.broker.get_topic(topic)
        return tuple(range(config.read_queues)) if config is not None and config.read_queues else ()

    # --- beyond LightStore: the node directory of cluster mode (mqtt.cluster_sync.NodeDirectory) ---

    async def register_consumer(self, info: ConsumerInfo) -> bool:
        return await self.broker.register_consumer(info)

    async def consumer_ids(self, group: str) -> list[str]:
        return await self.broker.consumer_ids(group)
