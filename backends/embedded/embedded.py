"""The durable embedded store: a commit log (source of truth) plus an LMDB index.

Layout of ``data_dir``::

    LOCK                 flock'ed while a process has the store open
    commitlog/<20 digits> segment files (see :mod:`mqproxy.backends.embedded.commitlog`)
    index/               LMDB environment (see :mod:`mqproxy.backends.embedded.index`)

:class:`EmbeddedStore` is one class in layers, a module each (see :mod:`.embedded_core`); this module
opens and assembles it.

Write path (:mod:`.embedded_write`): ``send``/``send_batch`` validate, then queue the batch on a write
coalescer (:mod:`mqproxy.backends.embedded.coalescer`): every send queued in the same scheduler turn,
from any connection, is written together, on the trio thread with no awaits in between (so no lock):
assign queue offsets (and LMQ offsets), append all records with one ``os.pwrite``, then index them and
advance the dispatch checkpoint in one LMDB transaction, then wake each touched queue's waiters once.
The message is readable when ``send`` returns (with sync flush, already just before: readers can see a
record whose fsync is pending).

Flush policies (:mod:`.embedded_flush`):

* ``async``: a background task fdatasyncs the log every ``flush_interval_ms``. An acknowledged message
  survives the process being killed at once and an OS crash / power loss once that interval has
  passed: **the loss window is ``flush_interval_ms``**.
* ``sync``: group commit. ``send`` returns only after a flusher task fdatasync'ed the log past its
  record; every send that arrived while the previous fsync ran shares the next one.

Recovery (:mod:`.embedded_recovery`): the log is scanned (CRC per record) from the segment holding the
index checkpoint; a torn or corrupt tail is cut at the last valid record; records past the checkpoint
are re-dispatched. If the checkpoint lies beyond the valid log (the log lost a tail the index had
seen), the consume queues are rebuilt from the whole log. Deleting ``index/`` is a valid (slow) repair:
queues and topics are rebuilt from the log; committed consumer offsets are lost.

Queue lifecycle (:mod:`.embedded_queues`; index only, the log is never rewritten): ``rewrite_queue``
moves kept entries to a queue's end and raises its persisted floor; ``delete_idle_lmqs`` drops idle
light queues. Neither writes a log record, so a full rebuild from the log shows the layout before them;
a record at offset 0 of a light queue the index already holds marks a new generation of it, and
recovery drops the old one.

Retention and a full disk (:mod:`.embedded_retention`, decisions in :mod:`.retention`): expired (or, on
a too-full disk, the oldest) sealed segments are deleted after the live state in them was copied to the
head; queue min offsets rise. Above the disk warning ratio, or after a write failed with ENOSPC, new
writes are refused (:class:`~mqproxy.model.errors.StoreFull`) until space is freed; reads keep working.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import trio

from mqproxy.backends.embedded.coalescer import WriteCoalescer
from mqproxy.backends.embedded.embedded_core import CACHE_SIZE, LRUCache, statvfs_usage
from mqproxy.backends.embedded.embedded_retention import EmbeddedRetention
from mqproxy.backends.embedded.groups import ConsumerRegistry
from mqproxy.backends.embedded.handoff import Handoff
from mqproxy.backends.embedded.index import LMQ_KEY_PREFIX, Index
from mqproxy.backends.embedded.retention import DiskUsage, RetentionPolicy
from mqproxy.backends.embedded.sending import DEFAULT_MAX_MESSAGE_BYTES, StoreClock
from mqproxy.backends.embedded.waiters import QueueWaiters
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.topics import TopicTable

__all__ = [
    "CACHE_SIZE",
    "EmbeddedStore",
    "FlushPolicy",
    "open_embedded_store",
]

FlushPolicy = Literal["async", "sync"]


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
    retention: RetentionPolicy | None = None,
    check_interval_s: float = 1.0,
    clean_interval_s: float = 10.0,
    disk_probe: Callable[[Path], DiskUsage] = statvfs_usage,
    wall_ms: Callable[[], int] | None = None,
) -> AsyncIterator[EmbeddedStore]:
    """Open (recovering) the store, run its flusher tasks, and close it cleanly on exit.

    ``fsync_in_thread`` moves fdatasync to a worker thread so the event loop keeps running during it
    (costs a ~100 µs thread hop per flush). ``retention`` (default: RocketMQ's 72 h, deleting at 04:00,
    disk ratios 0.75 / 0.85 / 0.90) is checked every ``clean_interval_s`` (RocketMQ's
    ``cleanResourceInterval``, 10 s) and the disk every ``check_interval_s``; ``disk_probe`` and ``wall_ms``
    are for tests.
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
        disk_probe=disk_probe,
    )
    store._retention = retention or RetentionPolicy()
    store._check_interval_s = check_interval_s
    store._clean_interval_s = clean_interval_s
    store._wall_ms = wall_ms or (lambda: time.time_ns() // 1_000_000)
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


class EmbeddedStore(EmbeddedRetention):
    """A durable :class:`~mqproxy.backends.embedded.store.MessageStore`; open with
    :func:`open_embedded_store`."""

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
        disk_probe: Callable[[Path], DiskUsage] = statvfs_usage,
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
        #: Messages just written for waiting readers, served to their pulls without a read back.
        self._handoff = Handoff()
        #: Concurrent sends share one append (one pwrite, one index transaction).
        self._writes = WriteCoalescer(self._append)
        self._clock = StoreClock()
        self._qids = LRUCache(CACHE_SIZE)
        self._next_offsets = LRUCache(CACHE_SIZE)
        self._closed = False
        self._flush_error = None
        self._durable = 0
        self._flush_wanted = trio.Event()
        self._durable_changed = trio.Event()
        self._index_dirty = False
        self.fsync_count = 0
        self._sweep_from = LMQ_KEY_PREFIX
        self._refusal = None
        self._refused_at = 0.0
        self._disk_probe = disk_probe
        self._fsync_lock = trio.Lock()

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
