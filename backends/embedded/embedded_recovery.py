"""Recovery of the embedded store on open: scan the commit log and re-dispatch what the index lacks.

The log is scanned (CRC per record) from the segment holding the index checkpoint; a torn or corrupt
tail is cut at the last valid record; records past the checkpoint are dispatched to their consume
queues again, :data:`_RECOVERY_BATCH` per index transaction. If the checkpoint lies beyond the valid
log (the log lost a tail the index had seen), every consume queue is rebuilt from the whole log. A
record at offset 0 of a light queue the index already holds starts a new generation of that queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import structlog

from mqproxy.backends.embedded.commitlog import CommitLog, read_payload
from mqproxy.backends.embedded.embedded_core import tag_hash
from mqproxy.backends.embedded.embedded_flush import EmbeddedFlushing
from mqproxy.backends.embedded.index import Entry, key_rows, queue_key
from mqproxy.backends.embedded.record_layout import MAX_BASE_BYTES
from mqproxy.backends.embedded.record_shared import is_shared
from mqproxy.backends.embedded.records import MessageRecord, MovedRecord, decode_message, decode_moved
from mqproxy.backends.embedded.sending import index_keys
from mqproxy.model.topics import LMQ_QUEUE_ID, MAX_QUEUE_COUNT, default_queue_count
from mqproxy.model.types import PROPERTY_TAGS

#: Entries dispatched per LMDB transaction while recovering.
_RECOVERY_BATCH = 4096

_log = structlog.get_logger("mqproxy.store")


class _ScannedBases:
    """The base records of SHARED ones while recovery scans: those just scanned, else read from the
    segment files (a base before the scan's start)."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._payloads: dict[int, bytes] = {}

    def seen(self, offset: int, payload: bytes) -> None:
        if len(payload) <= MAX_BASE_BYTES and not is_shared(payload):
            if len(self._payloads) >= 4096:
                self._payloads.clear()
            self._payloads[offset] = payload

    def payload_at(self, offset: int) -> bytes:
        payload = self._payloads.get(offset)
        if payload is None:
            payload = self._payloads[offset] = read_payload(self._directory, offset)
        return payload


class EmbeddedRecovery(EmbeddedFlushing):
    """:meth:`_recover`: bring the index up to the commit log (called once, from the constructor)."""

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
            index.commit_entries(batch, new_queues.items(), self._next_qid, checkpoint, latest_store_ms, keys)
            rebuilt += len(batch)
            batch.clear()
            keys.clear()
            new_queues.clear()

        # An empty index (deleted for repair) is a rebuild too: moved records re-create their entries.
        rebuilding = checkpoint == 0

        bases = _ScannedBases(self.data_dir / "commitlog")

        def on_record(offset: int, size: int, payload: bytes) -> None:
            nonlocal latest_store_ms
            moved = decode_moved(payload)
            if moved is not None:  # a live record retention moved here: re-point its entries
                flush_batch(offset)
                self._redispatch_moved(moved, offset, size, rebuilding, new_queues)
                return
            bases.seen(offset, payload)
            record = decode_message(payload, offset, bases)
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
                rebuilding = True
                for offset, size, payload in self._log.iter_records(self._log.start):
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

    def _redispatch_moved(
        self, moved: MovedRecord, offset: int, size: int, rebuilding: bool, new_queues: dict[bytes, int]
    ) -> None:
        """Recovery of a record retention moved to ``offset``: each entry that still names the old place
        points at the new one (a rebuild from the log creates missing ones, its queue's next offset
        included)."""
        record = decode_message(moved.payload)
        tag = tag_hash(record.properties.get(PROPERTY_TAGS))
        moves = []
        for key, queue_offset in moved.targets:
            if rebuilding:
                self._ensure_topic(record)
                qid: int | None = self._qid_for_write(key, new_queues)
            else:
                qid = self._lookup_qid(key)
            if qid is None:
                continue
            moves.append(
                (
                    qid,
                    queue_offset,
                    moved.moved_from,
                    offset,
                    size,
                    tag,
                    record.store_timestamp_ms,
                    moved.original,
                )
            )
            if rebuilding:
                current = self._next_offsets.lookup(qid) or 0
                self._next_offsets.store(qid, max(current, queue_offset + 1))
        if moves:
            self._index.relocate(moves, create=rebuilding)

    def _entries_for(
        self, record: MessageRecord, offset: int, size: int, new_queues: dict[bytes, int]
    ) -> list[Entry]:
        """Index entries of one recovered record; advances the in-memory next offsets.

        A topic the index does not know (the index was deleted) is re-created, large enough for the
        record's queue id.
        """
        self._ensure_topic(record)
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

    def _ensure_topic(self, record: MessageRecord) -> None:
        """Re-create a topic the index does not know, large enough for the record's queue id."""
        if self._topics.get(record.topic) is None:
            count = max(
                default_queue_count(record.topic, self._topics.default_queue_count), record.queue_id + 1
            )
            self._create(record.topic, min(count, MAX_QUEUE_COUNT))

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
