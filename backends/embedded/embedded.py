"""The durable embedded store: a commit log (source of truth) plus an LMDB index.

Layout of ``data_dir``::

    LOCK                 flock'ed while a process has the store open
    commitlog/<20 digits> segment files (see :mod:`mqproxy.backends.embedded.commitlog`)
    index/               LMDB environment (see :mod:`mqproxy.backends.embedded.index`)

Write path: ``send``/``send_batch`` validate, then queue the batch on a write coalescer
(:mod:`mqproxy.backends.embedded.coalescer`): every send queued in the same scheduler turn, from any connection, is
written together, on the trio thread with no awaits in between (so no lock): assign queue offsets (and
LMQ offsets), append all records with one ``os.pwrite``, then index them and advance the dispatch
checkpoint in one LMDB transaction, then wake each touched queue's waiters once. The message is readable
when ``send`` returns (with sync flush, already just before: readers can see a record whose fsync is
pending).

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

Queue lifecycle (index only, the log is never rewritten): ``rewrite_queue`` moves kept entries to a
queue's end and raises its persisted floor; ``delete_idle_lmqs`` drops idle light queues. Neither writes
a log record, so a full rebuild from the log shows the layout before them; a record at offset 0 of a
light queue the index already holds marks a new generation of it, and recovery drops the old one.

Not implemented yet: deleting old segments (retention), which would also raise queue min offsets.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import time
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Container, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import structlog
import trio
import trio.lowlevel

from mqproxy.backends.embedded.coalescer import WriteCoalescer
from mqproxy.backends.embedded.commitlog import CommitLog, sync_fds
from mqproxy.backends.embedded.groups import ConsumerRegistry
from mqproxy.backends.embedded.index import LMQ_KEY_PREFIX, Entry, Index, key_rows, offset_key, queue_key
from mqproxy.backends.embedded.pulls import MAX_SCAN_ENTRIES, out_of_range
from mqproxy.backends.embedded.records import MessageRecord, decode_message, encode_message
from mqproxy.backends.embedded.sending import (
    DEFAULT_MAX_MESSAGE_BYTES,
    StoreClock,
    check_batch,
    check_message,
    index_keys,
    stored_properties,
)
from mqproxy.backends.embedded.store import check_rewrite
from mqproxy.backends.embedded.waiters import QueueWaiters
from mqproxy.model.errors import StoreUnavailable, TopicNotFound
from mqproxy.model.topics import (
    LMQ_QUEUE_ID,
    MAX_QUEUE_COUNT,
    TopicTable,
    default_queue_count,
    is_lmq,
    validate_topic,
)
from mqproxy.model.types import (
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

FlushPolicy = Literal["async", "sync"]

#: Queue ids / next offsets kept in memory; idle queues beyond this cost nothing but an LMDB lookup.
CACHE_SIZE = 16384
#: How often the LMDB environment is flushed to disk (bounds what an OS crash rolls back there).
INDEX_SYNC_INTERVAL_S = 1.0
#: Entries dispatched per LMDB transaction while recovering.
_RECOVERY_BATCH = 4096
#: Longest :meth:`EmbeddedStore.delete_idle_lmqs` examines light queues in one event-loop turn (s) ...
SWEEP_SLICE_S = 0.002
#: ... and most queues it deletes in one turn (one index transaction, ~7 µs each).
SWEEP_CHUNK = 64
#: Event-loop time one call may spend in slices; the next call resumes where it stopped.
SWEEP_CALL_BUDGET_S = 1.0

_log = structlog.get_logger("mqproxy.store")

#: One send queued for the write coalescer: topic, queue id, messages, each message's LMQ targets.
_Send = tuple[str, int, Sequence[Message], list[tuple[str, ...]]]
#: One encoded message: queue id, queue offset, (LMQ queue id, offset)s, LMQ offsets by name, tag hash,
#: the keys it is indexed by.
_Planned = tuple[int, int, list[tuple[int, int]], dict[str, int], int, tuple[str, ...]]


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
    """A durable :class:`~mqproxy.backends.embedded.store.MessageStore`; create with :func:`open_embedded_store`."""

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
        #: Concurrent sends share one append (one pwrite, one index transaction).
        self._writes: WriteCoalescer[_Send, tuple[list[SendResult], int]] = WriteCoalescer(self._append)
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
        self._sweep_from = LMQ_KEY_PREFIX  # delete_idle_lmqs resumes at this ``qids`` key

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
        keys: list[bytes] = []
        new_queues: dict[bytes, int] = {}
        rebuilt = 0

        def flush_batch(checkpoint: int) -> None:
            nonlocal rebuilt
            index.commit(batch, new_queues.items(), self._next_qid, checkpoint, latest_store_ms, keys)
            rebuilt += len(batch)
            batch.clear()
            keys.clear()
            new_queues.clear()

        def on_record(offset: int, size: int, payload: bytes) -> None:
            nonlocal latest_store_ms
            record = decode_message(payload)
            latest_store_ms = max(latest_store_ms, record.store_timestamp_ms)
            self._restart_lmqs(record, offset, new_queues, flush_batch)
            batch.extend(self._entries_for(record, offset, size, new_queues))
            keys.extend(
                key_rows(record.topic, index_keys(record.properties), record.store_timestamp_ms, offset)
            )
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
                keys.clear()
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

    def _restart_lmqs(
        self,
        record: MessageRecord,
        offset: int,
        new_queues: dict[bytes, int],
        flush_batch: Callable[[int], None],
    ) -> None:
        """Recovery: a record at offset 0 of a light queue the index already holds starts a new generation
        of it (the queue was deleted and re-created, and the index lost the deletion, or is being rebuilt
        from the whole log): drop the old generation before dispatching the record.

        Every generation's first entry is a record at offset 0 (a rewrite needs entries to move), so that
        is the only place to look. The batch is flushed first so the index holds every earlier record.
        """
        for name, lmq_offset in record.lmqs:
            if lmq_offset != 0:
                continue
            key = queue_key(name, LMQ_QUEUE_ID)
            qid = new_queues.get(key) or self._lookup_qid(key)
            if qid is None:
                continue
            flush_batch(offset)
            if self._index.restart_queue(key, qid, offset):
                self._next_offsets.store(qid, 0)

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
        results, end = await self._writes.submit((config.name, queue_id, messages, targets))
        if self.flush == "sync":
            await self._wait_durable(end)
        return results

    def _append(self, sends: Sequence[_Send]) -> list[tuple[list[SendResult], int] | BaseException]:
        """Store and index validated sends (queued by concurrent callers) with one ``pwrite`` and one
        index transaction; return each send's results and the log end, or its own error.

        A send whose records cannot be encoded fails alone. A failed write or index commit raises (every
        send fails) and leaves nothing behind: records cut off, new queue ids forgotten.
        """
        self._check_writable()
        new_queues: dict[bytes, int] = {}
        next_qid_before = self._next_qid
        next_offsets: dict[int, int] = {}  # queue id -> next offset, for sends already encoded
        qids: dict[bytes, int] = {}
        lmq_qids: dict[str, int] = {}
        store_ts = self._clock.now_ms()  # one store time per write keeps every queue's times sorted
        payloads: list[bytes] = []
        plans: list[list[_Planned] | Exception] = []

        def qid_of(key: bytes) -> int:
            qid = qids.get(key)
            if qid is None:
                qid = qids[key] = self._qid_for_write(key, new_queues)
            return qid

        def lmq_qid(name: str) -> int:
            qid = lmq_qids.get(name)
            if qid is None:
                qid = lmq_qids[name] = qid_of(queue_key(name, LMQ_QUEUE_ID))
            return qid

        for topic, queue_id, messages, targets in sends:
            taken: dict[int, int] = {}  # this send's offsets, merged once it encoded

            def assign(qid: int, taken: dict[int, int] = taken) -> int:
                offset = taken.get(qid)
                if offset is None:
                    offset = next_offsets.get(qid)
                    if offset is None:
                        offset = self._next_offset(qid)
                taken[qid] = offset + 1
                return offset

            mark = len(payloads)
            try:
                plan = self._encode(
                    topic, queue_id, messages, targets, qid_of, lmq_qid, assign, store_ts, payloads
                )
            except Exception as exc:
                del payloads[mark:]
                plans.append(exc)
                continue
            next_offsets.update(taken)
            plans.append(plan)
        if not payloads:
            return [p for p in plans if isinstance(p, Exception)]
        start = self._log.end
        try:
            positions = iter(self._log.append(payloads))
            entries: list[Entry] = []
            keys: list[bytes] = []
            answers: list[tuple[list[SendResult], int] | BaseException] = []
            end = self._log.end
            for (topic, queue_id, _, _), plan in zip(sends, plans, strict=True):
                if isinstance(plan, Exception):
                    answers.append(plan)
                    continue
                results: list[SendResult] = []
                for qid, queue_offset, lmq_slots, lmq_map, code, message_keys in plan:
                    clo, size = next(positions)
                    entries.append((qid, queue_offset, clo, size, code, store_ts))
                    keys.extend(key_rows(topic, message_keys, store_ts, clo))
                    for lqid, loff in lmq_slots:
                        entries.append((lqid, loff, clo, size, code, store_ts))
                    results.append(SendResult(topic, queue_id, queue_offset, clo, store_ts, lmq_map))
                answers.append((results, end))
            self._index.commit(entries, new_queues.items(), self._next_qid, end, store_ts, keys)
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
        store = self._next_offsets.store
        for qid, offset in next_offsets.items():
            store(qid, offset)
        notify = self._waiters.notify
        for (topic, queue_id, _, _), plan in zip(sends, plans, strict=True):
            if not isinstance(plan, Exception):
                notify((topic, queue_id))
        for name in lmq_qids:
            notify((name, LMQ_QUEUE_ID))
        return answers

    def _encode(
        self,
        topic: str,
        queue_id: int,
        messages: Sequence[Message],
        targets: list[tuple[str, ...]],
        qid_of: Callable[[bytes], int],
        lmq_qid: Callable[[str], int],
        assign: Callable[[int], int],
        store_ts: int,
        payloads: list[bytes],
    ) -> list[_Planned]:
        """Assign offsets to one send's messages and append their records to ``payloads``."""
        parent = qid_of(queue_key(topic, queue_id))
        plan: list[_Planned] = []
        for message, lmqs in zip(messages, targets, strict=True):
            queue_offset = assign(parent)
            lmq_slots: list[tuple[int, int]] = []
            lmq_offsets: list[int] = []
            for name in lmqs:
                lqid = lmq_qid(name)
                loff = assign(lqid)
                lmq_slots.append((lqid, loff))
                lmq_offsets.append(loff)
            lmq_map = dict(zip(lmqs, lmq_offsets, strict=True))
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
                    lmqs=list(lmq_map.items()),
                    properties=stored_properties(message.properties, lmqs, lmq_offsets),
                    body=bytes(message.body),
                )
            )
            plan.append(
                (
                    parent,
                    queue_offset,
                    lmq_slots,
                    lmq_map,
                    tag_hash(message.tags),
                    index_keys(message.properties),
                )
            )
        return plan

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
                stored = self._stored(record, clo, entry_size)
                if queue_offset != record.queue_offset and record.topic == topic:  # moved by a rewrite
                    stored = dataclasses.replace(stored, queue_offset=queue_offset)
                found.append(stored)
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

        Not (yet) part of the MessageStore protocol; needed for VIEW_MESSAGE_BY_ID, CONSUMER_SEND_MSG_BACK and
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

    # --- queue lifecycle -----------------------------------------------------------------------
    async def rewrite_queue(self, topic: str, queue_id: int, keep: Sequence[int], below: int) -> int:
        """See :meth:`MessageStore.rewrite_queue`. One LMDB transaction moves the entries, deletes the old ones
        and raises the queue's persisted floor (so its max offset survives losing every entry).

        Durability: the rewrite is committed only once every kept record is fdatasync'ed (it awaits
        ``_wait_durable``, at most one flush interval with async flush; sync flush never waits). Without
        that, the index syncer could make the rewrite durable first, and an OS crash would leave an index
        whose entries point past the surviving log. Recovery would notice (checkpoint beyond the valid log
        end) and rebuild every queue from the log, so nothing would be corrupt, but a full rebuild is
        slow and forgets every floor; waiting costs one flush and keeps recovery on its fast path. The
        queue is re-validated after the wait. Re-dispatch after a crash stays exact: the rewrite's
        transaction follows the ones that indexed the kept records, so a surviving rewrite implies a
        checkpoint past them, and records appended later carry offsets at or above the new end.
        """
        self._check_writable()
        keep = list(keep)
        while True:
            qid, lo, hi = self._bounds(topic, queue_id)
            check_rewrite(keep, below, lo, hi)
            if qid is None or (not keep and below <= lo):
                return lo
            needed = 0
            for offset in keep:
                entry = self._index.entry(qid, offset)
                if entry is None:
                    raise StoreUnavailable(f"index lost entry {offset} of {topic}/{queue_id}")
                needed = max(needed, entry[0] + entry[1])
            if needed <= self._durable:
                break
            await self._wait_durable(needed)
            self._check_writable()
        min_offset, end = self._index.rewrite(qid, keep, below, self._clock.now_ms())
        self._index_dirty = True
        self._next_offsets.store(qid, end)
        if keep:
            self._waiters.notify((topic, queue_id))
        return min_offset

    async def delete_idle_lmqs(self, idle_ms: int, in_use: Container[str], limit: int = 10_000) -> list[str]:
        """See :meth:`MessageStore.delete_idle_lmqs`.

        Walks the ``qids`` rows of light queues (one contiguous key range) from where the previous call
        stopped, wrapping around once, in slices of ``SWEEP_SLICE_S`` or ``SWEEP_CHUNK`` deletions, and
        yields to trio between slices; after ``SWEEP_CALL_BUDGET_S`` of slices it returns (a million
        queues take a few calls). Per queue it costs a few B-tree seeks and no lasting Python object:
        idleness is the index time of its last entry (or of its last rewrite, kept with its floor), and
        its readers come from the ``lmqoffs`` reverse index, one range seek. A slice's checks and deletions
        run without a yield in between, so no send, pull or waiter can slip in.
        """
        self._check_writable()
        idle_before = time.time_ns() // 1_000_000 - idle_ms
        deleted: list[str] = []
        origin = self._sweep_from
        legs: list[tuple[bytes, bytes | None]] = [(origin, None)]
        if origin > LMQ_KEY_PREFIX:
            legs.append((LMQ_KEY_PREFIX, origin))
        spent = 0.0
        for start, stop in legs:
            position: bytes | None = start
            while position is not None and len(deleted) < limit:
                if spent >= SWEEP_CALL_BUDGET_S:
                    return deleted
                self._check_writable()
                began = time.perf_counter()
                found, resume = self._index.scan_lmqs(
                    position,
                    stop,
                    idle_before,
                    max_found=SWEEP_CHUNK,
                    deadline=began + SWEEP_SLICE_S,
                )
                victims: list[tuple[bytes, int]] = []
                for key, qid in found:
                    name = key[:-5].decode()  # queue_key: name, NUL, u32 queue id
                    if name in in_use or self._waiters.waiting((name, LMQ_QUEUE_ID)):
                        continue
                    victims.append((key, qid))
                    deleted.append(name)
                    if len(deleted) >= limit:
                        resume = key + b"\x00"
                        break
                if victims:
                    self._index.delete_queues(victims)
                    self._index_dirty = True
                    for key, qid in victims:
                        self._qids.pop(key, None)
                        self._next_offsets.pop(qid, None)
                position = resume
                self._sweep_from = resume if resume is not None else (stop or LMQ_KEY_PREFIX)
                spent += time.perf_counter() - began
                await trio.lowlevel.checkpoint()
        return deleted

    # --- metadata ------------------------------------------------------------------------------
    async def get_topic(self, topic: str) -> TopicConfig | None:
        return self._topics.get(topic)

    async def create_topic(self, topic: str, queue_count: int | None = None) -> TopicConfig:
        self._check_open()
        return self._create(topic, queue_count)

    async def update_topic(self, config: TopicConfig) -> TopicConfig:
        self._check_open()
        planned = self._topics.plan_update(config)
        self._index.put_topic(planned)
        self._index_dirty = True
        self._topics.load(planned)
        return planned

    async def topic_names(self) -> list[str]:
        return self._topics.names()

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

    async def consumer_groups(self) -> list[str]:
        return self._consumers.groups()

    async def consumer_info(self, group: str, client_id: str) -> ConsumerInfo | None:
        return self._consumers.info(group, client_id)
