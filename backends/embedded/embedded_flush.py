"""Flushing of the embedded store: the background flusher tasks, waiting for durability, and close.

``async`` flush: :meth:`EmbeddedFlushing._periodic_flusher` fdatasyncs the commit log every flush
interval. ``sync`` flush: group commit, :meth:`EmbeddedFlushing._wait_durable` wakes
:meth:`EmbeddedFlushing._sync_flusher`, whose one fdatasync covers every record appended before it
started. A failed fdatasync stops all writes for good (the page cache state is unknown). The LMDB
index is synced every :data:`INDEX_SYNC_INTERVAL_S` when it changed.
"""

from __future__ import annotations

import errno
import os
import time

import structlog
import trio

from mqproxy.backends.embedded.commitlog import sync_fds
from mqproxy.backends.embedded.embedded_core import EmbeddedCore
from mqproxy.model.errors import StoreFull, StoreUnavailable

_log = structlog.get_logger("mqproxy.store")

#: errnos of a write that failed for lack of space (the rest are ``write_error``).
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

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
    _refusal: StoreFull | None
    _refused_at: float
    _fsync_lock: trio.Lock  # held while commit-log fds are being fdatasync'ed (retention closes some)

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
            async with self._fsync_lock:
                await self._fsync(self._log.take_dirty())
        except OSError as exc:
            # After a failed fsync the page cache state is unknown (fsyncgate): stop accepting writes.
            self._flush_error = exc
            self._refuse("write_error", f"commit log fsync failed: {exc}; writes stay refused until restart")
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
        if self._refusal is not None:
            raise self._refusal

    # --- refusing and resuming writes -----------------------------------------------------------
    def _free_bytes(self) -> int:
        try:
            return self._disk_usage().free
        except OSError:
            return -1

    def _refuse(self, cause: str, detail: str) -> None:
        """Refuse new writes (``store.write_refused``, once per episode) until :meth:`_resume`."""
        if self._refusal is not None:
            return
        self._refusal = StoreFull(cause, detail)
        self._refused_at = time.monotonic()
        _log.warning("store.write_refused", cause=cause, detail=detail, free_bytes=self._free_bytes())

    def _resume(self) -> None:
        if self._refusal is None:
            return
        cause = self._refusal.cause
        self._refusal = None
        _log.info(
            "store.write_resumed",
            cause=cause,
            free_bytes=self._free_bytes(),
            duration_ms=round((time.monotonic() - self._refused_at) * 1000, 3),
        )

    def _write_failed(self, exc: BaseException) -> None:
        """Classify a failed append (the records were already cut back): an OS error refuses writes for a
        while (``disk_full`` for ENOSPC / EDQUOT / EFBIG or an index that reports no space, else
        ``write_error``); any other failure fails only its own batch."""
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__cause__
        text = str(cause if cause is not None else exc)
        if (isinstance(cause, OSError) and cause.errno in _DISK_FULL_ERRNOS) or "No space" in text:
            self._refuse("disk_full", f"write failed: {text}")
        elif isinstance(cause, OSError):  # EIO and the like: refuse, retry after a pause
            self._refuse("write_error", f"write failed: {text}")
