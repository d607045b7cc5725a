"""Retained messages: the last retained PUBLISH per topic, durable through the store.

Every retained PUBLISH (including the empty one that clears) is stored once like any other message and
also dispatched into :data:`~mqproxy.mqtt.mapping.RETAINED_LMQ`; the last record per MQTT topic in that
queue is the topic's retained value. :meth:`RetainedStore.load` replays the queue at start-up into an
in-memory topic tree; the gateway compacts the queue (see :mod:`mqproxy.facade.compaction`) so replay
reads only live values.

The tree has one node per topic level, so a wildcard SUBSCRIBE visits only the branches its filter can
match: ``a/+/c`` costs the children of ``a``, not every retained topic.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from mqproxy.codecs.mqtt import Properties
from mqproxy.facade.compaction import Replay, compact_if_worth, replay, worth_compacting
from mqproxy.model.errors import BackendError
from mqproxy.model.topics import LMQ_QUEUE_ID
from mqproxy.model.types import StoredMessage
from mqproxy.mqtt.mapping import RETAINED_LMQ, decode_properties
from mqproxy.mqtt.store import LightStore, queue_ids


@dataclass(frozen=True, slots=True)
class RetainedMessage:
    topic: str
    payload: bytes
    qos: int
    properties: Properties
    store_timestamp_ms: int
    commitlog_offset: int  # where the store holds it (the record of a QoS 2 delivery of it)


class _Node:
    __slots__ = ("children", "message")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.message: RetainedMessage | None = None

    def subtree(self, skip_dollar: bool) -> Iterator[RetainedMessage]:
        """Every message at or below this node (``skip_dollar``: not under a ``$`` first level)."""
        stack = [self]
        while stack:
            node = stack.pop()
            if node.message is not None:
                yield node.message
            for name, child in node.children.items():
                if not (skip_dollar and node is self and name.startswith("$")):
                    stack.append(child)


def _retained_key(message: StoredMessage) -> tuple[str, bool] | None:
    attrs = decode_properties(message.properties)
    return None if attrs is None else (attrs.topic, bool(message.body))


class RetainedStore:
    """Retained messages by topic, matched against topic filters through a level tree.

    Every :meth:`set` after :meth:`load` must mirror one record written to the retained queue: the store
    counts them to know when :meth:`compact` is due.
    """

    def __init__(self, min_garbage: int = 10_000, *, compacts: bool = True) -> None:
        #: False: never rewrite the retained queue (a backend that cannot; its retention bounds it).
        self.compacts = compacts
        #: The offset one past the last record :meth:`load` read.
        self.end = 0
        #: Cluster mode (``compacts`` False): per queue of the retained LMQ, the same.
        self.ends: dict[int, int] = {}
        #: Cluster mode: store time of the newest record applied per topic (see :meth:`apply_newest`).
        self._applied_ms: dict[str, int] = {}
        self._root = _Node()
        self._count = 0
        self._records = 0  # records in the retained queue (between compactions: an upper bound)
        self._min_garbage = min_garbage

    def __len__(self) -> int:
        return self._count

    async def load(self, backend: LightStore) -> None:
        """Rebuild the tree from the retained queue, compacting the queue first if it is mostly dead
        records (call once, before serving). Cluster mode (``compacts`` False): from every queue of the
        retained LMQ (one per broker; a queue whose broker fails is skipped and read later from its
        start), the newest record per topic by store time."""
        if not self.compacts:
            await self._load_queues(backend)
            return
        found = await replay(backend, RETAINED_LMQ, LMQ_QUEUE_ID, _retained_key)
        self.end = found.end
        for message in found.live():
            self.apply(message)
        await self._compact(backend, found)

    async def _load_queues(self, backend: LightStore) -> None:
        newest: list[StoredMessage] = []
        for queue in await queue_ids(backend, RETAINED_LMQ):
            try:
                found = await replay(backend, RETAINED_LMQ, queue, _retained_key)
            except BackendError:
                self.ends[queue] = 0
                continue
            self.ends[queue] = found.end
            newest.extend(message for _, _, message in found.newest.values())
        for message in sorted(newest, key=lambda m: m.store_timestamp_ms):
            self.apply_newest(message)

    def apply_newest(self, message: StoredMessage) -> None:
        """Cluster mode: :meth:`apply` unless a record of the same topic stored later was applied (the
        retained LMQ has a queue per broker, read side by side; store times order them)."""
        attrs = decode_properties(message.properties)
        if attrs is None:
            return
        if message.store_timestamp_ms < self._applied_ms.get(attrs.topic, 0):
            return
        self._applied_ms[attrs.topic] = message.store_timestamp_ms
        self.apply(message)

    def compaction_due(self) -> bool:
        """True once the queue probably holds more replaced or cleared values than live ones."""
        return self.compacts and worth_compacting(self._records, self._count, self._min_garbage)

    async def compact(self, backend: LightStore) -> None:
        """Drop replaced and cleared values from the retained queue. Safe while publishers keep writing
        (see :mod:`mqproxy.facade.compaction`)."""
        await self._compact(backend, None)

    async def _compact(self, backend: LightStore, found: Replay | None) -> None:
        if not self.compacts:
            return  # (nothing counts records either: compaction is never due)
        await compact_if_worth(backend, RETAINED_LMQ, LMQ_QUEUE_ID, _retained_key, self._min_garbage, found)
        low = await backend.min_offset(RETAINED_LMQ, LMQ_QUEUE_ID)
        self._records = await backend.max_offset(RETAINED_LMQ, LMQ_QUEUE_ID) - low

    def apply(self, message: StoredMessage) -> None:
        attrs = decode_properties(message.properties)
        if attrs is not None:
            self.set(
                attrs.topic,
                message.body,
                attrs.qos,
                attrs.properties,
                message.store_timestamp_ms,
                message.commitlog_offset,
            )

    def set(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        properties: Properties,
        store_ms: int,
        commitlog_offset: int,
    ) -> None:
        """Replace the topic's retained message; an empty payload clears it."""
        self._records += 1
        if payload:
            node = self._root
            for level in topic.split("/"):
                child = node.children.get(level)
                if child is None:
                    child = node.children[level] = _Node()
                node = child
            if node.message is None:
                self._count += 1
            node.message = RetainedMessage(topic, payload, qos, properties, store_ms, commitlog_offset)
            return
        path = [self._root]
        for level in topic.split("/"):
            child = path[-1].children.get(level)
            if child is None:
                return
            path.append(child)
        if path[-1].message is None:
            return
        path[-1].message = None
        self._count -= 1
        levels = topic.split("/")
        for depth in range(len(levels), 0, -1):  # prune branches left empty
            node = path[depth]
            if node.message is not None or node.children:
                break
            del path[depth - 1].children[levels[depth - 1]]

    def get(self, topic: str) -> RetainedMessage | None:
        node = self._root
        for level in topic.split("/"):
            found = node.children.get(level)
            if found is None:
                return None
            node = found
        return node.message

    def stored_before(self, cutoff_ms: int) -> list[RetainedMessage]:
        """Retained messages stored before ``cutoff_ms``."""
        return [m for m in self._root.subtree(skip_dollar=False) if m.store_timestamp_ms < cutoff_ms]

    def topics(self) -> Iterator[str]:
        """Every topic holding a retained message."""
        return (m.topic for m in self._root.subtree(skip_dollar=False))

    def matching(self, topic_filter: str) -> list[RetainedMessage]:
        """Retained messages whose topic matches ``topic_filter`` (a valid filter without ``$share``).

        A leading ``+`` or ``#`` never matches a ``$`` topic ([MQTT-4.7.2-1]); ``a/#`` also matches ``a``.
        """
        if "+" not in topic_filter and "#" not in topic_filter:
            found = self.get(topic_filter)
            return [found] if found is not None else []
        levels = topic_filter.split("/")
        out: list[RetainedMessage] = []
        frontier: list[_Node] = [self._root]
        for depth, level in enumerate(levels):
            first = depth == 0
            if level == "#":
                for node in frontier:
                    out.extend(node.subtree(skip_dollar=first))
                return out
            following: list[_Node] = []
            for node in frontier:
                if level == "+":
                    following.extend(
                        child for name, child in node.children.items() if not (first and name.startswith("$"))
                    )
                else:
                    child = node.children.get(level)
                    if child is not None:
                        following.append(child)
            frontier = following
            if not frontier:
                return out
        out.extend(node.message for node in frontier if node.message is not None)
        return out
