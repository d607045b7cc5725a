"""State every part of the embedded store shares, and the queue-id / next-offset lookups over it.

The embedded store (:mod:`mqproxy.backends.embedded.embedded`) is one class built in layers, one module
each: this core, then flushing (:mod:`.embedded_flush`), recovery (:mod:`.embedded_recovery`), the
commit-log write path (:mod:`.embedded_write`), reads and offsets (:mod:`.embedded_read`) and queue
lifecycle (:mod:`.embedded_queues`). Each layer uses only the state declared here and the layers below it.

A queue is named in the index by ``queue_key(topic, queue_id)`` and stored under a numeric queue id
(``qid``); both maps are LMDB rows, fronted by bounded LRU caches.
"""

from __future__ import annotations

import os
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from mqproxy.backends.embedded.coalescer import WriteCoalescer
from mqproxy.backends.embedded.commitlog import CommitLog
from mqproxy.backends.embedded.handoff import Handoff
from mqproxy.backends.embedded.index import Index
from mqproxy.backends.embedded.retention import DiskUsage
from mqproxy.backends.embedded.sending import StoreClock
from mqproxy.backends.embedded.store_base import StoreBase
from mqproxy.backends.embedded.waiters import QueueWaiters
from mqproxy.model.errors import StoreFull, StoreUnavailable
from mqproxy.model.types import Message, SendResult, TopicConfig

#: Queue ids / next offsets kept in memory; idle queues beyond this cost nothing but an LMDB lookup.
CACHE_SIZE = 16384

#: One send queued for the write coalescer: topic, queue id, messages, each message's LMQ targets.
PendingSend = tuple[str, int, Sequence[Message], list[tuple[str, ...]]]


def statvfs_usage(path: Path) -> DiskUsage:
    """The disk usage of the file system holding ``path`` (free = blocks free to anyone, as Java's
    ``File.getFreeSpace`` that RocketMQ's ratio uses)."""
    st = os.statvfs(path)
    return DiskUsage(total=st.f_blocks * st.f_frsize, free=st.f_bfree * st.f_frsize)


def tag_hash(tag: str | None) -> int:
    """The consume-queue tag code: crc32 of the tag, 0 without a tag (collisions re-checked on read)."""
    return zlib.crc32(tag.encode()) if tag else 0


#: A cached queue id meaning "no queue by that key" (real ids start at 1).
_NO_QID = 0


class LRUCache(OrderedDict[object, int]):
    """A bounded map that forgets its least recently used key first."""

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


class EmbeddedCore(StoreBase):
    """The embedded store's shared state, set by
    :class:`~mqproxy.backends.embedded.embedded.EmbeddedStore`."""

    data_dir: Path
    flush: str
    fsync_count: int
    _flush_interval_s: float
    _fsync_in_thread: bool
    _store_host: tuple[str, int]
    _max_message_bytes: int
    _waiters: QueueWaiters
    _handoff: Handoff
    _writes: WriteCoalescer[PendingSend, tuple[list[SendResult], int]]
    _clock: StoreClock
    _qids: LRUCache
    _next_offsets: LRUCache
    _next_qid: int
    _closed: bool
    _flush_error: BaseException | None
    _durable: int  # commit-log offset up to which an fdatasync completed
    _flush_wanted: trio.Event
    _durable_changed: trio.Event
    _index_dirty: bool
    _sweep_from: bytes  # delete_idle_lmqs resumes at this ``qids`` key
    _lock_fd: int
    _index: Index
    _log: CommitLog
    _refusal: StoreFull | None  # set while new writes are refused (disk full, write error)
    _refused_at: float
    _disk_probe: Callable[[Path], DiskUsage]

    def _disk_usage(self) -> DiskUsage:
        """Total and free bytes of the file system holding the commit log."""
        return self._disk_probe(self.data_dir)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable("store is closed")

    def _persist_topic(self, config: TopicConfig) -> None:
        self._index.put_topic(config)
        self._index_dirty = True

    def _lookup_qid(self, key: bytes) -> int | None:
        """The queue's id, None if it was never written. Absent queues are cached too (as
        ``_NO_QID``: ids start at 1), so that reads of a queue nobody wrote yet (a new subscription's
        position and long-poll) cost no index transaction each; allocating an id replaces the entry."""
        qid = self._qids.lookup(key)
        if qid is None:
            qid = self._index.lookup_qid(key)
            self._qids.store(key, _NO_QID if qid is None else qid)
            return qid
        return qid if qid != _NO_QID else None

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
