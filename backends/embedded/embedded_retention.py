"""Retention and disk-space guarding of the embedded store (the I/O around :mod:`.retention`).

A background task (:meth:`EmbeddedRetention._retention_loop`) checks the disk every ``check_interval_s``:

* above the warning ratio it refuses new writes (:class:`~mqproxy.model.errors.StoreFull`, one
  ``store.write_refused`` event per episode); a write that failed with ENOSPC does the same at once
  (:mod:`.embedded_write`). Writes resume (``store.write_resumed``) once the ratio is back under the
  warning level and at least :data:`RESUME_FREE_BYTES` (or a 16th of the file system) are free; after
  a ``write_error`` (not a full disk) the next write is simply tried again after
  :data:`WRITE_ERROR_RETRY_S`.
* every ``clean_interval_s`` (and at once while writes are refused) it deletes the segments
  :func:`~mqproxy.backends.embedded.retention.plan_deletions` picks (:meth:`enforce_retention`).

Deleting segments, in this order (a crash at any point leaves a consistent store):

1. read the doomed segments in a worker thread (:func:`scan_segment`: records, key rows, the queues they
   feed);
2. collect the live entries pointing below the new log start (:func:`.retention.live_from`), copy each
   record once to the head (a kind-2 record naming its old offset and the entries), fdatasync the log,
   and in one index transaction point those entries at the copies (recording old → new for lookups by
   message id) — all on the trio thread without an await, so no send, pull or rewrite sees half of it;
3. drop the leading entries below the new start of the queues those records fed (min offsets rise: a
   pull below gets OFFSET_ILLEGAL → PULL_OFFSET_MOVED with next begin offset = min offset, as the stock
   broker answers OFFSET_TOO_SMALL), their key rows and dead ``moved`` rows, in chunks of
   :data:`_DROP_CHUNK` with the event loop running between (the files are still there, so readers of a
   not-yet-dropped entry still find its record);
4. sync the index, then unlink the segment files (never the one being written).

The cost of a run is proportional to what it deletes plus the live state (state queues, undelivered
service backlogs), never to the whole index.
"""

from __future__ import annotations

import datetime
import time

import structlog
import trio
import trio.lowlevel

from mqproxy.backends.embedded.commitlog import segment_name, unlink_segments
from mqproxy.backends.embedded.embedded_live import DoomedSegment, EmbeddedLiveState, scan_segment
from mqproxy.backends.embedded.retention import (
    Deletion,
    DiskUsage,
    RetentionPolicy,
    Segment,
    plan_deletions,
    refuse_writes,
)
from mqproxy.model.errors import BackendError

#: Free bytes needed (with the ratio under the warning level) before refused writes resume (a 16th of
#: the file system if that is less).
RESUME_FREE_BYTES = 1024 * 1024
#: After a write failed for another reason than space, the next write is tried after this long.
WRITE_ERROR_RETRY_S = 5.0

_log = structlog.get_logger("mqproxy.store")


class EmbeddedRetention(EmbeddedLiveState):
    """Segment deletion with live-state preservation, and the disk-full guard."""

    # Re-declared for mypy, which sees the layer below as Any (mqproxy is an editable install).
    _durable: int
    _retention: RetentionPolicy
    _check_interval_s: float
    _clean_interval_s: float
    _wall_ms: object  # Callable[[], int]; wall clock of retention (tests inject one)
    _segments_deleted: int = 0
    _live_records_moved: int = 0

    # --- figures for /metrics ------------------------------------------------------------------
    def disk_stats(self) -> dict[str, float]:
        """The disk and retention figures ``/metrics`` exports (read at scrape time)."""
        try:
            disk = self._disk_usage()
        except OSError:
            disk = DiskUsage(0, 0)
        return {
            "disk_used_ratio": disk.used_ratio,
            "disk_free_bytes": disk.free,
            "writable": 0 if self._refusal is not None or self._flush_error is not None else 1,
            "segments": len(self._log.segment_bases()) if not self._closed else 0,
            "log_start_offset": self._log.start if not self._closed else 0,
            "segments_deleted": self._segments_deleted,
            "live_records_moved": self._live_records_moved,
        }

    # --- the background task ------------------------------------------------------------------
    def _start(self, nursery: trio.Nursery) -> None:
        super()._start(nursery)
        nursery.start_soon(self._retention_loop)

    async def _retention_loop(self) -> None:
        next_clean = trio.current_time() + self._clean_interval_s
        while not self._closed:
            await trio.sleep(self._check_interval_s)
            if self._closed:
                return
            self._check_disk()
            if self._refusal is not None or trio.current_time() >= next_clean:
                next_clean = trio.current_time() + self._clean_interval_s
                try:
                    await self.enforce_retention()
                except (BackendError, OSError) as exc:  # the store closing under it, a failing disk
                    if not self._closed:
                        _log.warning("store.retention_failed", detail=f"{type(exc).__name__}: {exc}")
                self._check_disk()

    def _check_disk(self) -> None:
        """Refuse writes above the warning ratio; resume them once the disk recovered."""
        if self._flush_error is not None:
            return  # a failed fsync stops writes for good
        try:
            disk = self._disk_usage()
        except OSError:
            return
        if refuse_writes(disk, self._retention):
            self._refuse("disk_full", self._disk_detail(disk.total, disk.free))
            return
        refusal = self._refusal
        if refusal is None:
            return
        if refusal.cause == "disk_full":
            if disk.free >= min(RESUME_FREE_BYTES, disk.total // 16):
                self._resume()
        elif time.monotonic() - self._refused_at >= WRITE_ERROR_RETRY_S:
            self._resume()

    def _disk_detail(self, total: int, free: int) -> str:
        used = (total - free) / total if total else 0.0
        warning = self._retention.warning_ratio
        return f"CL: {used:5.2f} used, {free} bytes free of {total}, warning ratio {warning}"

    # --- one retention run --------------------------------------------------------------------
    async def enforce_retention(self) -> list[Deletion]:
        """Delete the segments retention allows now (see the module docstring); return them."""
        if self._closed:
            return []
        now_ms = self._wall_ms()  # type: ignore[operator]
        hour = datetime.datetime.fromtimestamp(now_ms / 1000).hour
        segments = [Segment(base, size, modified) for base, size, modified in self._log.segments()]
        try:
            disk = self._disk_usage()
        except OSError:
            return []
        plan = plan_deletions(segments, now_ms, hour, disk, self._retention)
        if not plan:
            return []
        below = plan[-1].segment.base + plan[-1].segment.size
        doomed: list[DoomedSegment] = []
        for deletion in plan:  # sealed segments never change: read them in a worker thread
            doomed.append(await trio.to_thread.run_sync(scan_segment, self._log, deletion.segment.base))
        if self._closed or self._log.start != plan[0].segment.base:
            return []
        moved, moved_bytes, queues, stuck = await self._move_all_live(below)
        if stuck is not None:  # no room to copy the rest: delete only what lies below all of it
            plan = [d for d in plan if d.segment.base + d.segment.size <= stuck]
            if not plan:
                return []
            below = plan[-1].segment.base + plan[-1].segment.size
            doomed = doomed[: len(plan)]
        if self._closed:
            return []
        entries, lowered = await self._drop_entries(below, doomed)
        self._index_dirty = True
        await trio.to_thread.run_sync(self._index.sync)  # the index forgets them before the files go
        async with self._fsync_lock:  # no flush thread may hold a segment fd we close
            if self._closed:
                return []
            paths = self._log.detach_segments(below)
        await trio.to_thread.run_sync(unlink_segments, paths)
        self._segments_deleted += len(plan)
        self._live_records_moved += moved
        if moved:
            _log.info(
                "store.live_records_moved", records=moved, bytes=moved_bytes, queues=queues, below=below
            )
        for deletion in plan:
            _log.info(
                "store.segment_deleted",
                segment=segment_name(deletion.segment.base),
                reason=deletion.reason,
                bytes=deletion.segment.size,
                messages=doomed[plan.index(deletion)].records,
                entries=entries,
                queues=lowered,
            )
        return plan
