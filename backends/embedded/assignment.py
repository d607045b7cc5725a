"""Server-side queue assignment for push consumers that let the broker rebalance them (RIP-38).

A 5.x Java push consumer with ``clientRebalance=false`` asks QUERY_ASSIGNMENT for each topic it
subscribes to and consumes what it gets in the mode it gets: PULL (classic queues) or POP (the broker
hands out messages; ``queueId`` -1 means every queue). ``mqadmin setConsumeMode`` chooses the mode per
(topic, group) with SET_MESSAGE_REQUEST_MODE.

* :class:`RequestModes`: the chosen modes, durable as records in the internal topic
  :data:`REQUEST_MODE_TOPIC` (one per change, the newest per key wins; read once, lazily). Admin
  changes are rare, so the queue is never compacted.
* :func:`assign`: the Java broker's ``QueryAssignmentProcessor.doLoadBalance`` over sorted queues and
  sorted client ids, with its two strategies (``AVG``, ``AVG_BY_CIRCLE``); retry topics are always PULL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

import orjson
import trio

from mqproxy.backends.embedded.internal_topics import ensure_topic
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.facade.types import DEFAULT_MODE, DEFAULT_POP_SHARE_QUEUE_NUM, RequestMode
from mqproxy.model.topics import RETRY_PREFIX
from mqproxy.model.types import PROPERTY_KEYS, Message, PullStatus

#: Where request-mode changes are recorded (queue 0).
REQUEST_MODE_TOPIC: Final = "rmq_sys_REQUEST_MODE"
STRATEGIES: Final = ("AVG", "AVG_BY_CIRCLE")

Mode = Literal["PULL", "POP"]


class RequestModes:
    """(topic, group) -> :class:`RequestMode`, recorded in :data:`REQUEST_MODE_TOPIC`."""

    def __init__(self, backend: MessageStore) -> None:
        self._backend = backend
        self._modes: dict[str, RequestMode] | None = None
        self._lock = trio.Lock()

    @staticmethod
    def _key(topic: str, group: str) -> str:
        return f"{topic}@{group}"

    async def get(self, topic: str, group: str) -> RequestMode | None:
        modes = await self._load()
        return modes.get(self._key(topic, group))

    async def set(self, topic: str, group: str, mode: RequestMode) -> None:
        modes = await self._load()
        key = self._key(topic, group)
        record = {
            "topic": topic,
            "group": group,
            "mode": mode.mode,
            "popShareQueueNum": mode.pop_share_queue_num,
        }
        await ensure_topic(self._backend, REQUEST_MODE_TOPIC, 1)
        await self._backend.send(
            Message(REQUEST_MODE_TOPIC, orjson.dumps(record), queue_id=0, properties={PROPERTY_KEYS: key})
        )
        modes[key] = mode

    async def _load(self) -> dict[str, RequestMode]:
        async with self._lock:
            if self._modes is None:
                self._modes = await self._replay()
            return self._modes

    async def _replay(self) -> dict[str, RequestMode]:
        modes: dict[str, RequestMode] = {}
        if await self._backend.get_topic(REQUEST_MODE_TOPIC) is None:
            return modes
        offset = await self._backend.min_offset(REQUEST_MODE_TOPIC, 0)
        while True:
            result = await self._backend.pull(REQUEST_MODE_TOPIC, 0, offset, 32)
            if result.status is not PullStatus.FOUND:
                return modes
            for message in result.messages:
                try:
                    record = orjson.loads(message.body)
                    key = self._key(str(record["topic"]), str(record["group"]))
                    modes[key] = RequestMode(str(record["mode"]), int(record["popShareQueueNum"]))
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue
            offset = result.next_offset


def effective_mode(topic: str, stored: RequestMode | None) -> RequestMode:
    """The mode a topic is consumed in: what was set, else PULL (retry topics are always PULL)."""
    if stored is not None:
        return stored
    if topic.startswith(RETRY_PREFIX):
        return RequestMode("PULL")
    return RequestMode(DEFAULT_MODE, DEFAULT_POP_SHARE_QUEUE_NUM if DEFAULT_MODE == "POP" else 0)


def allocate(strategy: str, client_id: str, queues: Sequence[int], clients: Sequence[str]) -> list[int]:
    """The queue ids ``client_id`` gets among ``clients`` (sorted) by a Java allocation strategy."""
    if client_id not in clients or not queues:
        return []
    index = clients.index(client_id)
    count, members = len(queues), len(clients)
    if strategy == "AVG_BY_CIRCLE":
        return [q for i, q in enumerate(queues) if i % members == index]
    mod = count % members
    if count <= members:
        size = 1
    else:
        size = count // members + (1 if mod > 0 and index < mod else 0)
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [queues[(start + i) % count] for i in range(max(0, min(size, count - start)))]


def assign(
    *,
    mode: RequestMode,
    strategy: str,
    client_id: str,
    queues: Sequence[int],
    clients: Sequence[str],
    broadcasting: bool,
) -> list[int] | None:
    """Queue ids for ``client_id`` (-1: every queue, pop); None when no assignment can be made (unknown
    strategy), as the broker's ``doLoadBalance`` returns null."""
    if broadcasting:
        return list(queues)
    if strategy not in STRATEGIES:
        return None
    clients = sorted(clients)
    if mode.mode != "POP":
        return allocate(strategy, client_id, queues, clients)
    share = mode.pop_share_queue_num
    if share <= 0 or share >= len(clients) - 1:
        return [-1] if queues else []
    if len(clients) <= len(queues):
        mine = allocate(strategy, client_id, queues, clients)
        index = clients.index(client_id) if client_id in clients else -1
        if index >= 0:
            for step in range(1, share + 1):
                mine += allocate(strategy, clients[(index + step) % len(clients)], queues, clients)
        return sorted(set(mine))
    if client_id not in clients:
        return []
    return [queues[clients.index(client_id) % len(queues)]]
