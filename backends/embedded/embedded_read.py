"""The embedded store's read side: pulls, message lookup, long-poll waits, offsets and key queries.

A pull walks the queue's index entries (tag hash pre-filter, then the real tag on the decoded record)
and reads each record from the commit log, unless the write handed it off to waiting readers
(:mod:`~mqproxy.backends.embedded.handoff`); an entry a rewrite moved reports its new queue offset when
read from its own topic. Consumer offsets are index rows; committing one marks the index dirty.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from mqproxy.backends.embedded.built import stored_message
from mqproxy.backends.embedded.embedded_core import tag_hash
from mqproxy.backends.embedded.embedded_write import EmbeddedWriting
from mqproxy.backends.embedded.index import offset_key, queue_key
from mqproxy.backends.embedded.pulls import MAX_SCAN_ENTRIES, PullScan, WireScan
from mqproxy.backends.embedded.record_wire import compact_to_v1, ipv4_bytes
from mqproxy.backends.embedded.records import MessageRecord, decode_stored
from mqproxy.codecs.message_record import RecordError, encode_record
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.topics import LMQ_QUEUE_ID, TopicTable, is_lmq, validate_topic
from mqproxy.model.types import (
    PROPERTY_TAGS,
    ConsumerOffset,
    PullResult,
    PullStatus,
    StoredMessage,
    TagFilter,
    TopicConfig,
)


def _handed_off(stored: StoredMessage, queue_offset: int, topic: str) -> bytes | None:
    """The V1 record of a message the write handed off, None unless both hosts are IPv4."""
    if ipv4_bytes(stored.born_host[0]) is None:
        return None
    if queue_offset != stored.queue_offset and stored.topic == topic:
        stored = dataclasses.replace(stored, queue_offset=queue_offset)
    try:
        return encode_record(stored, legacy=True)
    except RecordError:
        return None


def _within(
    messages: list[StoredMessage], at: int, max_count: int, max_bytes: int
) -> tuple[StoredMessage, ...]:
    """Up to ``max_count`` of ``messages`` from ``at``, stopping before ``max_bytes`` as a scan does (at
    least one)."""
    found = messages[at : at + max_count]
    size = 0
    for count, message in enumerate(found):
        size += message.store_size
        if count and size > max_bytes:
            return tuple(found[:count])
    return tuple(found)


class EmbeddedReading(EmbeddedWriting):
    """Pulls, ``get_message``, ``wait_for_message``, queue bounds, consumer offsets, key lookups."""

    def pull_now(self, topic: str, queue_id: int, offset: int, max_count: int) -> PullResult:
        """:meth:`~mqproxy.backends.embedded.store_base.StoreBase.pull_now`; inside a write's notify, an
        LMQ pull of what that write just handed off (every message from ``offset`` to the queue's end, one
        per offset) is answered from the write's own messages, without the index entries and hand-off
        look-ups: the same answer (the queue's bounds are read as a pull reads them)."""
        run = self._written.get(topic) if queue_id == LMQ_QUEUE_ID else None
        if run is not None:
            first, messages = run
            qid, min_offset, max_offset = self._bounds(topic, queue_id)
            at = offset - first
            if qid is not None and 0 <= at < len(messages) and first + len(messages) == max_offset:
                if min_offset <= offset:
                    found = _within(messages, at, max(max_count, 1), 4 * 1024 * 1024)
                    self._handoff.served += len(found)
                    return PullResult(PullStatus.FOUND, found, offset + len(found), min_offset, max_offset)
        return super().pull_now(topic, queue_id, offset, max_count)

    def _pull_source(self, topic: str, queue_id: int) -> tuple[int, int, PullScan]:
        qid, min_offset, max_offset = self._bounds(topic, queue_id)
        return min_offset, max_offset, functools.partial(self._scan, topic, qid, max_offset)

    def _wire_source(self, topic: str, queue_id: int) -> tuple[WireScan, int, int] | None:
        host = ipv4_bytes(self._store_host[0])
        if host is None:
            return None
        qid, min_offset, max_offset = self._bounds(topic, queue_id)
        if qid is None:
            return None
        wire = (host, self._store_host[1], topic.encode())
        return functools.partial(self._scan_wire, qid, max_offset, wire), min_offset, max_offset

    def _scan_wire(
        self,
        qid: int,
        max_offset: int,
        wire: tuple[bytes, int, bytes],
        offset: int,
        max_count: int,
        max_bytes: int,
    ) -> tuple[list[bytes], int] | None:
        """:meth:`_scan` without a filter, each record transcoded (:mod:`.record_wire`); None when one is
        not for that path."""
        host, port, topic = wire
        found: list[bytes] = []
        size = 0
        position = offset
        for queue_offset, clo, entry_size, _code, _ts in self._index.entries(
            qid, offset, min(max_count, max_offset - offset)
        ):
            if found and size + entry_size > max_bytes:
                break
            stored = self._handoff.get(clo)
            if stored is None:
                record = compact_to_v1(self._log.read(clo, entry_size), clo, host, port, queue_offset, topic)
            else:
                record = _handed_off(stored, queue_offset, topic.decode())
            if record is None:
                return None
            found.append(record)
            size += entry_size
            position = queue_offset + 1
            if len(found) >= max_count:
                break
        return found, position

    def _scan(
        self,
        topic: str,
        qid: int | None,
        max_offset: int,
        offset: int,
        max_count: int,
        tag_filter: TagFilter | None,
        max_bytes: int,
    ) -> tuple[list[StoredMessage], int]:
        if qid is None:  # unreachable: a queue without an id is empty, so out of range
            raise StoreUnavailable("index lost a queue id")
        tags = tag_filter.tags if tag_filter is not None else None
        wanted = None if tags is None else {tag_hash(t) for t in tags}
        found: list[StoredMessage] = []
        handoff = self._handoff.get
        size = 0
        position = offset
        scan_limit = min(max_offset, offset + max_count + MAX_SCAN_ENTRIES)
        done = False
        while not done and position < scan_limit:
            chunk = self._index.entries(qid, position, min(max(max_count, 32), scan_limit - position))
            if not chunk:
                break
            for queue_offset, clo, entry_size, code, _ts in chunk:
                if wanted is not None and code not in wanted:
                    position = queue_offset + 1
                    continue
                if found and size + entry_size > max_bytes:
                    done = True
                    break
                stored = handoff(clo)  # just written for a waiting reader: no read back, no decode
                if stored is None:
                    record, named = decode_stored(self._log.read(clo, entry_size), clo, self._log)
                    stored = self._stored(record, named, entry_size)
                position = queue_offset + 1
                if tags is not None and stored.properties.get(PROPERTY_TAGS) not in tags:
                    continue
                if queue_offset != stored.queue_offset and stored.topic == topic:  # moved by a rewrite
                    stored = dataclasses.replace(stored, queue_offset=queue_offset)
                found.append(stored)
                size += entry_size
                if len(found) >= max_count:
                    done = True
                    break
        return found, position

    def _stored(self, record: MessageRecord, clo: int, size: int) -> StoredMessage:
        return stored_message(
            record.topic,
            record.queue_id,
            record.queue_offset,
            clo,
            size,
            record.body,
            record.flag,
            record.properties,
            record.sys_flag,
            record.born_timestamp_ms,
            record.born_host,
            record.store_timestamp_ms,
            self._store_host,
            record.reconsume_times,
            record.body_crc,
        )

    async def get_message(self, commitlog_offset: int) -> StoredMessage | None:
        """The message stored at ``commitlog_offset`` (from a message id), or None if none is there.

        Not (yet) part of the MessageStore protocol; needed for VIEW_MESSAGE_BY_ID, CONSUMER_SEND_MSG_BACK and
        END_TRANSACTION, which identify messages by commit-log offset.
        """
        self._check_open()
        found = self._log.read_at(commitlog_offset)
        if found is None and 0 <= commitlog_offset < self._log.start:  # retention may have moved it
            target = self._index.moved_to(commitlog_offset)
            if target is not None:
                commitlog_offset = target
                found = self._log.read_at(target)
        if found is None:
            return None
        size, payload = found
        record, named = decode_stored(payload, commitlog_offset, self._log)
        return self._stored(record, named, size)

    async def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        self._readable(topic, queue_id)
        key = queue_key(topic, queue_id)

        def ready() -> bool:
            if self._closed:
                return True
            qid = self._lookup_qid(key)
            return qid is not None and self._next_offset(qid) > offset

        woke = await self._waiters.wait((topic, queue_id), ready, timeout_s)
        if self._closed:
            raise StoreUnavailable("store is closed")
        return woke

    def watch_queue(self, topic: str, queue_id: int, offset: int, callback: Callable[[], None]) -> bool:
        """``wait_for_message`` without a task: True if ``callback`` will be called once, when the queue
        may hold a message at or after ``offset`` (its next write or rewrite, or the store closing);
        False, with nothing registered, if it holds one already (read now). Same errors."""
        self._readable(topic, queue_id)
        qid = self._lookup_qid(queue_key(topic, queue_id))
        if qid is not None and self._next_offset(qid) > offset:
            return False
        self._waiters.watch((topic, queue_id), callback)
        return True

    def unwatch_queue(self, topic: str, queue_id: int, callback: Callable[[], None]) -> None:
        """Forget a :meth:`watch_queue` callback not called yet."""
        self._waiters.unwatch((topic, queue_id), callback)

    # --- offsets -------------------------------------------------------------------------------
    def _readable(self, topic: str, queue_id: int) -> TopicConfig:
        self._check_open()
        config = self._topics.require(topic)
        TopicTable.check_read_queue(config, queue_id)
        return config

    def _bounds(self, topic: str, queue_id: int) -> tuple[int | None, int, int]:
        """(queue id or None if never written, min offset, max offset)."""
        self._readable(topic, queue_id)
        qid = self._lookup_qid(queue_key(topic, queue_id))
        if qid is None:
            return None, 0, 0
        max_offset = self._next_offset(qid)
        first = self._index.first_offset(qid)
        return qid, (max_offset if first is None else first), max_offset

    async def min_offset(self, topic: str, queue_id: int) -> int:
        return self._bounds(topic, queue_id)[1]

    async def max_offset(self, topic: str, queue_id: int) -> int:
        return self._bounds(topic, queue_id)[2]

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        qid, lo, hi = self._bounds(topic, queue_id)
        if qid is None:
            return 0
        while lo < hi:
            mid = (lo + hi) // 2
            entry = self._index.entry(qid, mid)
            if entry is not None and entry[3] < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    async def earliest_store_time(self, topic: str, queue_id: int) -> int:
        qid, lo, hi = self._bounds(topic, queue_id)
        if qid is None or lo >= hi:
            return -1
        entry = self._index.entry(qid, lo)
        return -1 if entry is None else entry[3]

    async def query_consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        self._check_open()
        return self._index.get_consumer_offset(offset_key(group, topic, queue_id))

    async def consumer_offsets(self) -> list[ConsumerOffset]:
        self._check_open()
        return [
            ConsumerOffset(group, topic, queue_id, offset)
            for group, topic, queue_id, offset in self._index.consumer_offsets()
            if not is_lmq(topic)
        ]

    async def store_bytes(self) -> int:
        self._check_open()
        return self._log.end - self._log.segment_bases()[0] if self._log.segment_bases() else self._log.end

    async def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._check_open()
        validate_topic(topic)
        self._index.put_consumer_offset(offset_key(group, topic, queue_id), offset)
        self._index_dirty = True

    # --- lookup --------------------------------------------------------------------------------
    async def query_messages(
        self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> list[StoredMessage]:
        self._check_open()
        found: list[StoredMessage] = []
        for clo in self._index.find_key(topic, key, begin_ms, end_ms, max(max_count, 0)):
            message = await self.get_message(clo)
            if message is not None:
                found.append(message)
        return found
