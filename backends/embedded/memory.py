"""In-memory reference :class:`~mqproxy.backends.embedded.store.MessageStore`: nothing survives the process.

Same semantics as the embedded store (validation, auto-creation, offsets, tag filtering, LMQ
multi-dispatch, long polling); used by tests and by handlers that want a throwaway broker.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

import trio
import trio.lowlevel

from mqproxy.backends.embedded.groups import ConsumerRegistry
from mqproxy.backends.embedded.pulls import MAX_SCAN_ENTRIES, PullScan
from mqproxy.backends.embedded.records import body_crc
from mqproxy.backends.embedded.sending import (
    DEFAULT_MAX_MESSAGE_BYTES,
    StoreClock,
    check_batch,
    check_message,
    index_keys,
    properties_size,
    stored_properties,
)
from mqproxy.backends.embedded.store import check_rewrite
from mqproxy.backends.embedded.store_base import StoreBase
from mqproxy.backends.embedded.waiters import QueueWaiters
from mqproxy.model.topics import LMQ_QUEUE_ID, TopicTable, is_lmq, validate_topic
from mqproxy.model.types import (
    ConsumerOffset,
    Message,
    SendResult,
    StoredMessage,
    TagFilter,
)

#: Fixed bytes a remoting record adds to body, topic and properties (IPv4 hosts, spec §4.1).
_RECORD_OVERHEAD = 91


@dataclass(slots=True)
class _Queue:
    """``messages[i]`` sits at queue offset ``base + i``; ``times[i]`` is its index time (store time, or
    when a rewrite re-appended it, so times stay sorted); ``touched_ms`` is the last append or rewrite."""

    messages: list[StoredMessage] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    base: int = 0
    touched_ms: int = 0

    @property
    def end(self) -> int:
        return self.base + len(self.messages)

    def scan(
        self, offset: int, max_count: int, tag_filter: TagFilter | None, max_bytes: int
    ) -> tuple[list[StoredMessage], int]:
        """A :data:`~mqproxy.backends.embedded.store_base.PullScan` over this queue."""
        found: list[StoredMessage] = []
        size = 0
        position = offset
        scan_end = min(self.end, offset + max_count + MAX_SCAN_ENTRIES)
        while position < scan_end and len(found) < max_count:
            message = self.messages[position - self.base]
            if tag_filter is not None and not tag_filter.matches(message.tags):
                position += 1
                continue
            if found and size + message.store_size > max_bytes:
                break
            found.append(message)
            size += message.store_size
            position += 1
        return found, position


#: Light queues examined between two yields to trio in :meth:`InMemoryBackend.delete_idle_lmqs`.
_SWEEP_CHUNK = 1024


class InMemoryBackend(StoreBase):
    """A :class:`~mqproxy.backends.embedded.store.MessageStore` held in dicts and lists."""

    def __init__(
        self,
        default_queue_count: int = 4,
        auto_create_topics: bool = True,
        store_host: tuple[str, int] = ("127.0.0.1", 0),
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._topics = TopicTable(default_queue_count, auto_create_topics)
        self._store_host = store_host
        self._max_message_bytes = max_message_bytes
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._offsets: dict[tuple[str, str, int], int] = {}
        self._lmq_groups: dict[str, set[str]] = {}  # LMQ name -> groups with an offset on it
        self._consumers = ConsumerRegistry()
        self._waiters = QueueWaiters()
        self._clock = StoreClock()
        self._next_commitlog_offset = 0
        self._by_commitlog_offset: dict[int, StoredMessage] = {}

    # --- produce -------------------------------------------------------------------------------
    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        check_batch(messages)
        targets = [check_message(m, self._max_message_bytes) for m in messages]
        config = self._config_for_send(messages[0].topic)
        queue_id = self._topics.pick_queue(config, messages[0].queue_id)
        # Everything is validated: from here on nothing raises, so the batch is all-or-nothing.
        queue = self._queue(config.name, queue_id)
        results: list[SendResult] = []
        touched: set[tuple[str, int]] = {(config.name, queue_id)}
        for message, lmqs in zip(messages, targets, strict=True):
            lmq_queues = [self._queue(name, LMQ_QUEUE_ID) for name in lmqs]
            lmq_offsets = [q.end for q in lmq_queues]
            properties = stored_properties(message.properties, lmqs, lmq_offsets)
            size = _RECORD_OVERHEAD + len(message.body) + len(config.name) + properties_size(properties)
            stored = StoredMessage(
                topic=config.name,
                queue_id=queue_id,
                queue_offset=queue.end,
                commitlog_offset=self._next_commitlog_offset,
                store_size=size,
                body=bytes(message.body),
                flag=message.flag,
                properties=properties,
                sys_flag=message.sys_flag,
                born_timestamp_ms=message.born_timestamp_ms,
                born_host=message.born_host,
                store_timestamp_ms=self._clock.now_ms(),
                store_host=self._store_host,
                reconsume_times=message.reconsume_times,
                body_crc=body_crc(message.body),
            )
            self._next_commitlog_offset += size
            self._by_commitlog_offset[stored.commitlog_offset] = stored
            touched.update((name, LMQ_QUEUE_ID) for name in lmqs)
            for q in (queue, *lmq_queues):
                q.messages.append(stored)
                q.times.append(stored.store_timestamp_ms)
                q.touched_ms = stored.store_timestamp_ms
            results.append(
                SendResult(
                    topic=config.name,
                    queue_id=queue_id,
                    queue_offset=stored.queue_offset,
                    commitlog_offset=stored.commitlog_offset,
                    store_timestamp_ms=stored.store_timestamp_ms,
                    lmq_offsets=dict(zip(lmqs, lmq_offsets, strict=True)),
                )
            )
        for key in touched:
            self._waiters.notify(key)
        return results

    # --- consume -------------------------------------------------------------------------------
    def _pull_source(self, topic: str, queue_id: int) -> tuple[int, int, PullScan]:
        queue = self._readable(topic, queue_id)
        return queue.base, queue.end, queue.scan

    async def get_message(self, commitlog_offset: int) -> StoredMessage | None:
        """The message stored at ``commitlog_offset``, or None (see EmbeddedStore.get_message)."""
        return self._by_commitlog_offset.get(commitlog_offset)

    async def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        self._readable(topic, queue_id)
        key = (topic, queue_id)

        def ready() -> bool:
            queue = self._queues.get(key)
            return queue is not None and queue.end > offset

        return await self._waiters.wait(key, ready, timeout_s)

    def watch_queue(self, topic: str, queue_id: int, offset: int, callback: Callable[[], None]) -> bool:
        """See :meth:`EmbeddedReading.watch_queue`."""
        self._readable(topic, queue_id)
        queue = self._queues.get((topic, queue_id))
        if queue is not None and queue.end > offset:
            return False
        self._waiters.watch((topic, queue_id), callback)
        return True

    def unwatch_queue(self, topic: str, queue_id: int, callback: Callable[[], None]) -> None:
        self._waiters.unwatch((topic, queue_id), callback)

    # --- offsets -------------------------------------------------------------------------------
    async def min_offset(self, topic: str, queue_id: int) -> int:
        return self._readable(topic, queue_id).base

    async def max_offset(self, topic: str, queue_id: int) -> int:
        return self._readable(topic, queue_id).end

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        queue = self._readable(topic, queue_id)
        return queue.base + bisect.bisect_left(queue.times, timestamp_ms)

    async def earliest_store_time(self, topic: str, queue_id: int) -> int:
        queue = self._readable(topic, queue_id)
        return queue.times[0] if queue.times else -1

    async def query_consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._offsets.get((group, topic, queue_id))

    async def consumer_offsets(self) -> list[ConsumerOffset]:
        return [
            ConsumerOffset(group, topic, queue_id, offset)
            for (group, topic, queue_id), offset in sorted(self._offsets.items())
            if not is_lmq(topic)
        ]

    async def store_bytes(self) -> int:
        return self._next_commitlog_offset

    async def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        validate_topic(topic)
        self._offsets[(group, topic, queue_id)] = offset
        if is_lmq(topic):
            self._lmq_groups.setdefault(topic, set()).add(group)

    # --- queue lifecycle -----------------------------------------------------------------------
    async def rewrite_queue(self, topic: str, queue_id: int, keep: Sequence[int], below: int) -> int:
        queue = self._readable(topic, queue_id)
        check_rewrite(keep, below, queue.base, queue.end)
        if not keep and below <= queue.base:
            return queue.base
        now = self._clock.now_ms()
        kept = [queue.messages[offset - queue.base] for offset in keep]
        if not is_lmq(topic):  # read from its own queue, a message reports where it sits now
            kept = [dataclasses.replace(m, queue_offset=queue.end + i) for i, m in enumerate(kept)]
        cut = max(below - queue.base, 0)
        queue.messages = queue.messages[cut:] + kept
        queue.times = queue.times[cut:] + [now] * len(kept)
        queue.base += cut
        queue.touched_ms = now
        if kept:
            self._waiters.notify((topic, queue_id))
        return queue.base

    async def delete_idle_lmqs(self, idle_ms: int, in_use: Container[str], limit: int = 10_000) -> list[str]:
        """See :meth:`MessageStore.delete_idle_lmqs`. Walks a snapshot of the light queues from the start on
        every call (the reference backend keeps no scan position)."""
        idle_before = time.time_ns() // 1_000_000 - idle_ms
        names = [name for name, _ in self._queues if is_lmq(name)]
        deleted: list[str] = []
        for start in range(0, len(names), _SWEEP_CHUNK):
            for name in names[start : start + _SWEEP_CHUNK]:
                if len(deleted) >= limit:
                    return deleted
                if self._lmq_deletable(name, idle_before, in_use):
                    self._delete_lmq(name)
                    deleted.append(name)
            await trio.lowlevel.checkpoint()
        return deleted

    def _lmq_deletable(self, name: str, idle_before: int, in_use: Container[str]) -> bool:
        key = (name, LMQ_QUEUE_ID)
        queue = self._queues.get(key)
        if queue is None or queue.touched_ms > idle_before or name in in_use or self._waiters.waiting(key):
            return False
        groups = self._lmq_groups.get(name, ())
        return all(self._offsets[(group, name, LMQ_QUEUE_ID)] >= queue.end for group in groups)

    def _delete_lmq(self, name: str) -> None:
        del self._queues[(name, LMQ_QUEUE_ID)]
        for group in self._lmq_groups.pop(name, ()):
            del self._offsets[(group, name, LMQ_QUEUE_ID)]

    # --- lookup --------------------------------------------------------------------------------
    async def query_messages(
        self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> list[StoredMessage]:
        found = [
            m
            for m in self._by_commitlog_offset.values()
            if m.topic == topic
            and begin_ms <= m.store_timestamp_ms <= end_ms
            and key in index_keys(m.properties)
        ]
        found.sort(key=lambda m: (m.store_timestamp_ms, m.commitlog_offset), reverse=True)
        return found[: max(max_count, 0)]

    # --- internals -----------------------------------------------------------------------------
    def _queue(self, topic: str, queue_id: int) -> _Queue:
        key = (topic, queue_id)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = _Queue()
        return queue

    def _readable(self, topic: str, queue_id: int) -> _Queue:
        """The queue (a detached empty one if it was never written)."""
        config = self._topics.require(topic)
        TopicTable.check_read_queue(config, queue_id)
        queue = self._queues.get((topic, queue_id))
        return queue if queue is not None else _Queue()
