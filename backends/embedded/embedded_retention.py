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
from dataclasses import dataclass, field

import structlog
import trio
import trio.lowlevel

from mqproxy.backends.embedded.commitlog import CommitLog, segment_name
from mqproxy.backends.embedded.embedded_queues import EmbeddedQueues
from mqproxy.backends.embedded.index import key_rows, offset_key, queue_key
from mqproxy.backends.embedded.index_retention import Relocation
from mqproxy.backends.embedded.records import decode_message, decode_moved, encode_moved
from mqproxy.backends.embedded.retention import (
    PROGRESS_GROUPS,
    STATE_TOPICS,
    Deletion,
    DiskUsage,
    RetentionPolicy,
    Segment,
    live_from,
    plan_deletions,
    records_to_move,
    refuse_writes,
)
from mqproxy.backends.embedded.sending import index_keys
from mqproxy.model.errors import BackendError
from mqproxy.model.topics import LMQ_QUEUE_ID, is_lmq

#: Free bytes needed (with the ratio under the warning level) before refused writes resume (a 16th of
#: the file system if that is less).
RESUME_FREE_BYTES = 1024 * 1024
#: After a write failed for another reason than space, the next write is tried after this long.
WRITE_ERROR_RETRY_S = 5.0
#: Entries (or key rows) per index transaction when retention drops them; the event loop runs between
#: (~1-2 µs each, so a few ms per transaction).
_DROP_CHUNK = 2048


@dataclass(slots=True)
class DoomedSegment:
    """What a segment about to be deleted holds: its record count, the ``keys`` rows of its messages and
    the name keys of every queue with an entry pointing into it."""

    records: int = 0
    key_rows: list[bytes] = field(default_factory=list)
    queues: set[bytes] = field(default_factory=set)


def scan_segment(log: CommitLog, base: int) -> DoomedSegment:
    """Read a sealed segment (in a worker thread) for :class:`DoomedSegment`."""
    found = DoomedSegment()
    for offset, payload in log.segment_records(base):
        found.records += 1
        moved = decode_moved(payload)
        if moved is not None:
            found.queues.update(key for key, _ in moved.targets)
        record = decode_message(payload)
        found.queues.add(queue_key(record.topic, record.queue_id))
        found.queues.update(queue_key(name, LMQ_QUEUE_ID) for name, _ in record.lmqs)
        keys = index_keys(record.properties)
        if keys:
            found.key_rows += key_rows(record.topic, keys, record.store_timestamp_ms, offset)
    return found


_log = structlog.get_logger("mqproxy.store")


class EmbeddedRetention(EmbeddedQueues):
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
        moved, moved_bytes, queues = self._move_live(below)
        if moved < 0:  # no room to keep the live state: delete nothing
            return []
        names = set().union(*(d.queues for d in doomed))
        qids = sorted(q for q in (self._lookup_qid(name) for name in names) if q is not None)
        entries = 0
        rose: set[int] = set()
        while qids:  # no long transaction on the event loop
            dropped, raised, done = self._index.drop_below(below, qids, _DROP_CHUNK)
            entries += dropped
            rose |= raised
            qids = qids[done:]
            await trio.lowlevel.checkpoint()
        lowered = len(rose)
        rows = [row for d in doomed for row in d.key_rows]
        for i in range(0, len(rows), _DROP_CHUNK):
            self._index.delete_key_rows(rows[i : i + _DROP_CHUNK])
            await trio.lowlevel.checkpoint()
        self._index.prune_moved(below)
        self._index_dirty = True
        await trio.to_thread.run_sync(self._index.sync)  # the index forgets them before the files go
        async with self._fsync_lock:  # no flush thread may hold a segment fd we close
            if self._closed:
                return []
            self._log.drop_segments(below)
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

    def _live_queues(self) -> list[tuple[str, int, int, int]]:
        """(topic, queue id, qid, live-from offset) of every queue holding live state."""
        out = []
        for topic in self._topics.names():
            if topic not in STATE_TOPICS and topic not in PROGRESS_GROUPS:
                continue
            config = self._topics.require(topic)
            group = PROGRESS_GROUPS.get(topic)
            for queue_id in range(max(config.read_queues, config.write_queues)):
                committed = {}
                if group is not None:
                    offset = self._index.get_consumer_offset(offset_key(group, topic, queue_id))
                    if offset is not None:
                        committed[(group, topic, queue_id)] = offset
                start = live_from(topic, queue_id, committed)
                qid = self._lookup_qid(queue_key(topic, queue_id))
                if start is not None and qid is not None:
                    out.append((topic, queue_id, qid, start))
        for name in STATE_TOPICS:
            if is_lmq(name):
                qid = self._lookup_qid(queue_key(name, LMQ_QUEUE_ID))
                if qid is not None:
                    out.append((name, LMQ_QUEUE_ID, qid, 0))
        return out

    def _move_live(self, below: int) -> tuple[int, int, int]:
        """Copy every live record below ``below`` to the head and re-point its entries; return (records,
        bytes, queues), or (-1, 0, 0) when the copies could not be written (nothing changed then)."""
        keys: dict[int, bytes] = {}
        live = []
        for topic, queue_id, qid, start in self._live_queues():
            keys[qid] = queue_key(topic, queue_id)
            live.extend(self._index.iter_live_entries(qid, start, below))
        moves = records_to_move(live, below)
        if not moves:
            return 0, 0, 0
        payloads = []
        for clo, entries in moves.items():
            payload = self._log.read(clo, entries[0][3])
            payloads.append(encode_moved(clo, [(keys[e[0]], e[1]) for e in entries], payload))
        start = self._log.end
        try:
            positions = self._log.append(payloads)
            self._log.sync()
        except Exception as exc:  # a full disk: keep everything, say why
            if self._log.end != start:
                self._log.truncate_to(start)
            _log.warning("store.retention_failed", detail=f"cannot move live records: {exc}")
            return -1, 0, 0
        relocations: list[Relocation] = []
        for (clo, entries), (new, size) in zip(moves.items(), positions, strict=True):
            relocations.extend(
                (qid, offset, clo, new, size, tag, ts) for qid, offset, _, _, tag, ts in entries
            )
        self._index.relocate(relocations, checkpoint=self._log.end)
        self._durable = max(self._durable, self._log.end)
        return len(moves), sum(size for _, size in positions), len({e[0] for e in live})
