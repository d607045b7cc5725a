"""The durable embedded store: a commit log (source of truth) plus an LMDB index.

Layout of ``data_dir``::

    LOCK                 flock'ed while a process has the store open
    commitlog/<20 digits> segment files (see :mod:`mqproxy.broker.commitlog`)
    index/               LMDB environment (see :mod:`mqproxy.broker.index`)

Write path (all on the trio thread, no awaits in between, so it needs no lock): validate, assign queue
offsets (and LMQ offsets), append the records with one ``os.pwrite``, then index them and
advance the dispatch checkpoint in one LMDB transaction. The message is readable when ``send``
returns (with sync flush, already just before: readers can see a record whose fsync is pending).

Flush policies:

* ``async``: a background task fdatasyncs the log every ``flush_interval_ms``. An acknowledged message
  survives the process being killed at once and an OS crash / power loss once that interval has
  passed: **the loss window is ``flush_interval_ms``**.
* ``sync``: group commit. ``send`` returns only after a flusher task fdatasync'ed the log past its
  record; every send that arrived while the previous fsync ran shares the next one.

Recovery: the log is scanned (CRC per record) from the segment holding the index checkpoint; a torn or
corrupt tail is cut at the last valid record; records past the checkpoint are re-dispatched. If the
checkpoint lies beyond the valid log (the log lost a tail the index had seen), the consume queues are
rebuilt from the whole log. Deleting ``index/`` is a valid (slow) repair: queues and topics are rebuilt
from the log; committed consumer offsets are lost.

Not implemented yet: deleting old segments (retention), which would also raise queue min offsets.
"""

from __future__ import annotations

import fcntl
import os
import time
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import structlog
import trio

from mqproxy.broker.commitlog import CommitLog, sync_fds
from mqproxy.broker.errors import StoreUnavailable, TopicNotFound
from mqproxy.broker.groups import ConsumerRegistry
from mqproxy.broker.index import Entry, Index, offset_key, queue_key
from mqproxy.broker.pulls import MAX_SCAN_ENTRIES, out_of_range
from mqproxy.broker.records import MessageRecord, decode_message, encode_message
from mqproxy.broker.sending import (
    DEFAULT_MAX_MESSAGE_BYTES,
    StoreClock,
    check_batch,
    check_message,
    stored_properties,
)
from mqproxy.broker.topics import (
    LMQ_QUEUE_ID,
    MAX_QUEUE_COUNT,
    TopicTable,
    default_queue_count,
    is_lmq,
    validate_topic,
)
from mqproxy.broker.types import (
    PROPERTY_TAGS,
    ConsumerInfo,
    ConsumerOffset,
    Message,
    PullResult,
    PullStatus,
    SendResult,
    StoredMessage,
    TagFilter,
    TopicConfig,
)
from mqproxy.broker.waiters import QueueWaiters

FlushPolicy = Literal["async", "sync"]

#: Queue ids / next offsets kept in memory; idle queues beyond this cost nothing but an LMDB lookup.
CACHE_SIZE = 16384
#: How often the LMDB environment is flushed to disk (bounds what an OS crash rolls back there).
INDEX_SYNC_INTERVAL_S = 1.0
#: Entries dispatched per LMDB transaction while recovering.
_RECOVERY_BATCH = 4096

_log = structlog.get_logger("mqproxy.store")


def tag_hash(tag: str | None) -> int:
    """The consume-queue tag code: crc32 of the tag, 0 without a tag (collisions re-checked on read)."""
    return zlib.crc32(tag.encode()) if tag else 0


class _LRU(OrderedDict[object, int]):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def lookup(self, key: object) -> int | None:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def store(self, key: object, value: int) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.capacity:
            self.popitem(last=False)


@asynccontextmanager
async def open_embedded_store(
    data_dir: Path,
    *,
    flush: FlushPolicy = "async",
    flush_interval_ms: int = 200,
    segment_bytes: int = 256 * 1024 * 1024,
    default_queue_count: int = 4,
    auto_create_topics: bool = True,
    store_host: tuple[str, int] = ("127.0.0.1", 0),
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    fsync_in_thread: bool = True,
) -> AsyncIterator[EmbeddedStore]:
    """Open (recovering) the store, run its flusher tasks, and close it cleanly on exit.

    ``fsync_in_thread`` moves fdatasync to a worker thread so the event loop keeps running during it
    (costs a ~100 µs thread hop per flush).
    """
    if flush not in ("async", "sync"):
        raise ValueError("flush must be 'async' or 'sync'")
    if flush_interval_ms <= 0:
        raise ValueError("flush_interval_ms must be positive")
    store = EmbeddedStore(
        Path(data_dir),
        flush=flush,
        flush_interval_ms=flush_interval_ms,
        segment_bytes=segment_bytes,
        default_queue_count=default_queue_count,
        auto_create_topics=auto_create_topics,
        store_host=store_host,
        max_message_bytes=max_message_bytes,
        fsync_in_thread=fsync_in_thread,
    )
    try:
        try:
            async with trio.open_nursery() as nursery:
                store._start(nursery)
                try:
                    yield store
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # Background tasks never raise; a group here only wraps the caller's own exception.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
    finally:
        store._close()


class EmbeddedStore:
    """A durable :class:`~mqproxy.broker.backend.Backend`; create with :func:`open_embedded_store`."""

    def __init__(
        self,
        data_dir: Path,
        *,
        flush: FlushPolicy,
        flush_interval_ms: int,
        segment_bytes: int,
        default_queue_count: int,
        auto_create_topics: bool,
        store_host: tuple[str, int],
        max_message_bytes: int,
        fsync_in_thread: bool,
    ) -> None:
        self.data_dir = data_dir
        self.flush = flush
        self._flush_interval_s = flush_interval_ms / 1000
        self._fsync_in_thread = fsync_in_thread
        self._store_host = store_host
        self._max_message_bytes = max_message_bytes
        self._topics = TopicTable(default_queue_count, auto_create_topics)
        self._consumers = ConsumerRegistry()
        self._waiters = QueueWaiters()
        self._clock = StoreClock()
        self._qids = _LRU(CACHE_SIZE)
        self._next_offsets = _LRU(CACHE_SIZE)
        self._closed = False
        self._flush_error: BaseException | None = None
        self._durable = 0  # commit-log offset up to which an fdatasync completed
        self._flush_wanted = trio.Event()
        self._durable_changed = trio.Event()
        self._index_dirty = False
        self.fsync_count = 0

        data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(data_dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise StoreUnavailable(f"{data_dir} is open in another process") from None
        try:
            self._index = Index(data_dir / "index")
        except BaseException:
            os.close(self._lock_fd)
            raise
        try:
            self._recover(segment_bytes)
        except BaseException:
            self._index.close()
            os.close(self._lock_fd)
            raise

    # --- open / recovery --------------------------------------------------------------------------
    def _recover(self, segment_bytes: int) -> None:
        started = time.perf_counter()
        index = self._index
        for config in index.topics():
            self._topics.load(config)
        self._next_qid = index.next_qid()
        checkpoint, latest_store_ms = index.checkpoint()
        batch: list[Entry] = []
        new_queues: dict[bytes, int] = {}
        rebuilt = 0

        def flush_batch(checkpoint: int) -> None:
            nonlocal rebuilt
            index.commit(batch, new_queues.items(), self._next_qid, checkpoint, latest_store_ms)
            rebuilt += len(batch)
            batch.clear()
            new_queues.clear()

        def on_record(offset: int, size: int, payload: bytes) -> None:
            nonlocal latest_store_ms
            record = decode_message(payload)
            latest_store_ms = max(latest_store_ms, record.store_timestamp_ms)
            batch.extend(self._entries_for(record, offset, size, new_queues))
            if len(batch) >= _RECOVERY_BATCH:
                flush_batch(offset + size)

        self._log, scan = CommitLog.open(self.data_dir / "commitlog", segment_bytes, checkpoint, on_record)
        try:
            if scan.end < checkpoint:
                # The index saw records the log no longer has: rebuild every consume queue.
                index.reset_queues()
                self._next_qid = 1
                self._qids.clear()
                self._next_offsets.clear()
                batch.clear()
                new_queues.clear()
                for offset, size, payload in self._log.iter_records(0):
                    on_record(offset, size, payload)
            flush_batch(self._log.end)
            index.sync()
        except BaseException:
            self._log.close()
            raise
        self._durable = self._log.end
        # Keep per-queue store times sorted even if the wall clock stepped back while we were down.
        self._clock.advance_to(latest_store_ms)
        fields = {
            "data_dir": str(self.data_dir),
            "records": scan.records,
            "truncated_bytes": scan.truncated_bytes,
            "rebuilt_entries": rebuilt,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
        }
        if scan.truncated_bytes:
            _log.warning("store.recovered", **fields)
        else:
            _log.info("store.recovered", **fields)

    def _entries_for(
        self, record: MessageRecord, offset: int, size: int, new_queues: dict[bytes, int]
    ) -> list[Entry]:
        """Index entries of one recovered record; advances the in-memory next offsets.

        A topic the index does not know (the index was deleted) is re-created, large enough for the
        record's queue id.
        """
        if self._topics.get(record.topic) is None:
            count = max(
                default_queue_count(record.topic, self._topics.default_queue_count), record.queue_id + 1
            )
            self._create(record.topic, min(count, MAX_QUEUE_COUNT))
        tag = tag_hash(record.properties.get(PROPERTY_TAGS))
        ts = record.store_timestamp_ms
        targets = [(queue_key(record.topic, record.queue_id), record.queue_offset)]
        targets += [(queue_key(name, LMQ_QUEUE_ID), lmq_offset) for name, lmq_offset in record.lmqs]
        entries: list[Entry] = []
        for key, queue_offset in targets:
            qid = self._qid_for_write(key, new_queues)
            entries.append((qid, queue_offset, offset, size, tag, ts))
            self._next_offsets.store(qid, queue_offset + 1)  # records arrive in log order
        return entries

    # --- lifecycle ------------------------------------------------------------------------------
    def _start(self, nursery: trio.Nursery) -> None:
        if self.flush == "sync":
            nursery.start_soon(self._sync_flusher)
        else:
            nursery.start_soon(self._periodic_flusher)
        nursery.start_soon(self._index_syncer)

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._flush_error is None:
                self._log.sync()
                self._durable = self._log.end
            self._index.sync()
        finally:
            self._durable_changed.set()
            self._waiters.notify_all()
            self._log.close()
            self._index.close()
            os.close(self._lock_fd)

    async def _fsync(self, fds: list[int]) -> None:
        if not fds:
            return
        self.fsync_count += 1
        if self._fsync_in_thread:
            await trio.to_thread.run_sync(sync_fds, fds)
        else:
            sync_fds(fds)

    async def _sync_flusher(self) -> None:
        """Group commit: one fdatasync covers every record appended before it started."""
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            await self._flush_once()
            if self._flush_error is not None:
                return

    async def _periodic_flusher(self) -> None:
        while self._flush_error is None:
            await trio.sleep(self._flush_interval_s)
            await self._flush_once()

    async def _flush_once(self) -> None:
        target = self._log.end
        if self._closed or target <= self._durable:
            return
        try:
            await self._fsync(self._log.take_dirty())
        except OSError as exc:
            # After a failed fsync the page cache state is unknown (fsyncgate): stop accepting writes.
            self._flush_error = exc
        else:
            self._durable = max(self._durable, target)
        event, self._durable_changed = self._durable_changed, trio.Event()
        event.set()

    async def _index_syncer(self) -> None:
        while not self._closed:
            await trio.sleep(INDEX_SYNC_INTERVAL_S)
            if self._index_dirty and not self._closed:
                self._index_dirty = False
                await trio.to_thread.run_sync(self._index.sync)

    async def _wait_durable(self, end: int) -> None:
        while self._durable < end:
            if self._flush_error is not None:
                raise StoreUnavailable(f"commit log fsync failed: {self._flush_error}")
            if self._closed:
                raise StoreUnavailable("store closed before the message was flushed")
            self._flush_wanted.set()
            await self._durable_changed.wait()

    def _check_writable(self) -> None:
        if self._closed:
            raise StoreUnavailable("store is closed")
        if self._flush_error is not None:
            raise StoreUnavailable(f"commit log fsync failed: {self._flush_error}")

    # --- produce -------------------------------------------------------------------------------
    async def send(self, message: Message) -> SendResult:
        return (await self.send_batch([message]))[0]

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        self._check_writable()
        check_batch(messages)
        targets = [check_message(m, self._max_message_bytes) for m in messages]
        config = self._config_for_send(messages[0].topic)
        queue_id = self._topics.pick_queue(config, messages[0].queue_id)
        results, end = self._append(config.name, queue_id, messages, targets)
        if self.flush == "sync":
            await self._wait_durable(end)
        return results

    def _append(
        self, topic: str, queue_id: int, messages: Sequence[Message], targets: list[tuple[str, ...]]
    ) -> tuple[list[SendResult], int]:
        """Store and index ``messages`` (validated) atomically; return results and the log end."""
        new_queues: dict[bytes, int] = {}
        next_qid_before = self._next_qid
        next_offsets: dict[int, int] = {}

        def assign(key: bytes) -> tuple[int, int]:
            qid = self._qid_for_write(key, new_queues)
            offset = next_offsets.get(qid)
            if offset is None:
                offset = self._next_offset(qid)
            next_offsets[qid] = offset + 1
            return qid, offset

        start = self._log.end
        try:
            entries, results = self._encode_and_write(topic, queue_id, messages, targets, assign)
            latest = results[-1].store_timestamp_ms
            self._index.commit(entries, new_queues.items(), self._next_qid, self._log.end, latest)
        except BaseException:
            # Nothing was acknowledged: forget the records and the queue ids allocated for them.
            if self._log.end != start:
                self._log.truncate_to(start)
            self._next_qid = next_qid_before
            for key, qid in new_queues.items():
                self._qids.pop(key, None)
                self._next_offsets.pop(qid, None)
            raise
        self._index_dirty = True
        for qid, offset in next_offsets.items():
            self._next_offsets.store(qid, offset)
        self._waiters.notify((topic, queue_id))
        for lmqs in targets:
            for name in lmqs:
                self._waiters.notify((name, LMQ_QUEUE_ID))
        return results, self._log.end

    def _encode_and_write(
        self,
        topic: str,
        queue_id: int,
        messages: Sequence[Message],
        targets: list[tuple[str, ...]],
        assign: Callable[[bytes], tuple[int, int]],
    ) -> tuple[list[Entry], list[SendResult]]:
        """Assign offsets, encode and append the records; return their index entries and results."""
        parent_key = queue_key(topic, queue_id)
        payloads: list[bytes] = []
        planned: list[tuple[int, int, list[tuple[int, int]], dict[str, int], int, int]] = []
        for message, lmqs in zip(messages, targets, strict=True):
            qid, queue_offset = assign(parent_key)
            lmq_slots = [assign(queue_key(name, LMQ_QUEUE_ID)) for name in lmqs]
            lmq_offsets = [offset for _, offset in lmq_slots]
            store_ts = self._clock.now_ms()
            payloads.append(
                encode_message(
                    topic=topic,
                    queue_id=queue_id,
                    queue_offset=queue_offset,
                    flag=message.flag,
                    sys_flag=message.sys_flag,
                    born_timestamp_ms=message.born_timestamp_ms,
                    store_timestamp_ms=store_ts,
                    reconsume_times=message.reconsume_times,
                    born_host=message.born_host,
                    lmqs=list(zip(lmqs, lmq_offsets, strict=True)),
                    properties=stored_properties(message.properties, lmqs, lmq_offsets),
                    body=bytes(message.body),
                )
            )
            lmq_map = dict(zip(lmqs, lmq_offsets, strict=True))
            planned.append((qid, queue_offset, lmq_slots, lmq_map, store_ts, tag_hash(message.tags)))
        positions = self._log.append(payloads)
        entries: list[Entry] = []
        results: list[SendResult] = []
        for (qid, queue_offset, lmq_slots, lmq_map, store_ts, code), (clo, size) in zip(
            planned, positions, strict=True
        ):
            entries.append((qid, queue_offset, clo, size, code, store_ts))
            entries.extend((lqid, loff, clo, size, code, store_ts) for lqid, loff in lmq_slots)
            results.append(SendResult(topic, queue_id, queue_offset, clo, store_ts, lmq_map))
        return entries, results

    def _lookup_qid(self, key: bytes) -> int | None:
        qid = self._qids.lookup(key)
        if qid is None:
            qid = self._index.lookup_qid(key)
            if qid is not None:
                self._qids.store(key, qid)
        return qid

    def _qid_for_write(self, key: bytes, new_queues: dict[bytes, int]) -> int:
        """The queue's id, allocating one (recorded in ``new_queues`` for the index) if it has none."""
        qid = new_queues.get(key)
        if qid is None:
            qid = self._lookup_qid(key)
        if qid is None:
            qid = new_queues[key] = self._next_qid
            self._next_qid += 1
            self._qids.store(key, qid)
            self._next_offsets.store(qid, 0)  # a new queue: no index lookup needed
        return qid

    def _next_offset(self, qid: int) -> int:
        offset = self._next_offsets.lookup(qid)
        if offset is None:
            offset = self._index.next_offset(qid)
            self._next_offsets.store(qid, offset)
        return offset

    # --- consume -------------------------------------------------------------------------------
    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        *,
        tag_filter: TagFilter | None = None,
        max_bytes: int = 4 * 1024 * 1024,
    ) -> PullResult:
        qid, min_offset, max_offset = self._bounds(topic, queue_id)
        early = out_of_range(offset, min_offset, max_offset)
        if early is not None:
            return early
        if qid is None:  # unreachable: a queue without an id is empty, so out of range
            raise StoreUnavailable("index lost a queue id")
        max_count = max(max_count, 1)
        tags = tag_filter.tags if tag_filter is not None else None
        wanted = None if tags is None else {tag_hash(t) for t in tags}
        found: list[StoredMessage] = []
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
                record = decode_message(self._log.read(clo, entry_size))
                position = queue_offset + 1
                if tags is not None and record.properties.get(PROPERTY_TAGS) not in tags:
                    continue
                found.append(self._stored(record, clo, entry_size))
                size += entry_size
                if len(found) >= max_count:
                    done = True
                    break
        status = PullStatus.FOUND if found else PullStatus.NO_MATCHED_MSG
        return PullResult(status, tuple(found), position, min_offset, max_offset)

    def _stored(self, record: MessageRecord, clo: int, size: int) -> StoredMessage:
        return StoredMessage(
            topic=record.topic,
            queue_id=record.queue_id,
            queue_offset=record.queue_offset,
            commitlog_offset=clo,
            store_size=size,
            body=record.body,
            flag=record.flag,
            properties=record.properties,
            sys_flag=record.sys_flag,
            born_timestamp_ms=record.born_timestamp_ms,
            born_host=record.born_host,
            store_timestamp_ms=record.store_timestamp_ms,
            store_host=self._store_host,
            reconsume_times=record.reconsume_times,
            body_crc=record.body_crc,
        )

    async def get_message(self, commitlog_offset: int) -> StoredMessage | None:
        """The message stored at ``commitlog_offset`` (from a message id), or None if none is there.

        Not (yet) part of the Backend protocol; needed for VIEW_MESSAGE_BY_ID, CONSUMER_SEND_MSG_BACK and
        END_TRANSACTION, which identify messages by commit-log offset.
        """
        self._check_open()
        found = self._log.read_at(commitlog_offset)
        if found is None:
            return None
        size, payload = found
        return self._stored(decode_message(payload), commitlog_offset, size)

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

    # --- metadata ------------------------------------------------------------------------------
    async def get_topic(self, topic: str) -> TopicConfig | None:
        return self._topics.get(topic)

    async def create_topic(self, topic: str, queue_count: int | None = None) -> TopicConfig:
        self._check_open()
        return self._create(topic, queue_count)

    def _create(self, topic: str, queue_count: int | None) -> TopicConfig:
        planned = self._topics.plan_create(topic, queue_count)
        if planned is None:
            return self._topics.require(topic)
        self._index.put_topic(planned)
        self._index_dirty = True
        self._topics.load(planned)
        return planned

    def _config_for_send(self, topic: str) -> TopicConfig:
        config = self._topics.get(topic)
        if config is not None:
            return config
        if not self._topics.auto_create:
            raise TopicNotFound(topic)
        return self._create(topic, None)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable("store is closed")

    # --- consumer groups -----------------------------------------------------------------------
    async def register_consumer(self, info: ConsumerInfo) -> bool:
        return self._consumers.register(info)

    async def unregister_consumer(self, group: str, client_id: str) -> bool:
        return self._consumers.unregister(group, client_id)

    async def consumer_ids(self, group: str) -> list[str]:
        return self._consumers.ids(group)

    async def consumer_info(self, group: str, client_id: str) -> ConsumerInfo | None:
        return self._consumers.info(group, client_id)
