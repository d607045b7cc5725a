"""Flushing of the embedded store: the background flusher tasks, waiting for durability, and close.

``async`` flush: :meth:`EmbeddedFlushing._periodic_flusher` fdatasyncs the commit log every flush
interval. ``sync`` flush: group commit, :meth:`EmbeddedFlushing._wait_durable` wakes
:meth:`EmbeddedFlushing._sync_flusher`, whose one fdatasync covers every record appended before it
started. A failed fdatasync stops all writes for good (the page cache state is unknown). The LMDB
index is synced every :data:`INDEX_SYNC_INTERVAL_S` when it changed.
"""

from __future__ import annotations

import os

import trio

from mqproxy.backends.embedded.commitlog import sync_fds
from mqproxy.backends.embedded.embedded_core import EmbeddedCore
from mqproxy.model.errors import StoreUnavailable

#: How often the LMDB environment is flushed to disk (bounds what an OS crash rolls back there).
INDEX_SYNC_INTERVAL_S = 1.0


class EmbeddedFlushing(EmbeddedCore):
    """Background flush tasks (:meth:`_start`), durability waits and :meth:`_close`."""

    # Re-declared for mypy, which sees the layer below as Any (mqproxy is an editable install).
    _closed: bool
    _flush_error: BaseException | None
    _durable: int
    _flush_wanted: trio.Event
    _durable_changed: trio.Event
    _index_dirty: bool

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
