"""Queue lifecycle of the embedded store, in the index only (the commit log is never rewritten).

``rewrite_queue`` moves kept entries to a queue's end and raises its persisted floor;
``delete_idle_lmqs`` drops idle light queues. Neither writes a log record, so a full rebuild from the
log shows the layout before them; recovery tells a re-created light queue by its record at offset 0.
"""

from __future__ import annotations

import time
from collections.abc import Container, Sequence

import trio
import trio.lowlevel

from mqproxy.backends.embedded.embedded_read import EmbeddedReading
from mqproxy.backends.embedded.index import LMQ_KEY_PREFIX
from mqproxy.backends.embedded.store import check_rewrite
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.topics import LMQ_QUEUE_ID

#: Longest :meth:`EmbeddedQueues.delete_idle_lmqs` examines light queues in one event-loop turn (s) ...
SWEEP_SLICE_S = 0.002
#: ... and most queues it deletes in one turn (one index transaction, ~7 µs each).
SWEEP_CHUNK = 64
#: Event-loop time one call may spend in slices; the next call resumes where it stopped.
SWEEP_CALL_BUDGET_S = 1.0


class EmbeddedQueues(EmbeddedReading):
    """``rewrite_queue`` (compaction) and ``delete_idle_lmqs`` (light-queue sweeping)."""

    # Re-declared for mypy, which sees the layer below as Any (mqproxy is an editable install).
    _sweep_from: bytes

    async def rewrite_queue(self, topic: str, queue_id: int, keep: Sequence[int], below: int) -> int:
        """See :meth:`MessageStore.rewrite_queue`. One LMDB transaction moves the entries, deletes the old
        ones and raises the queue's persisted floor (so its max offset survives losing every entry).

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
