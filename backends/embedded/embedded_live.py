"""Keeping live state when retention deletes segments: copy the live records to the head of the log and
re-point their index entries (:meth:`EmbeddedLiveState._move_all_live`), then drop the entries that
pointed into the deleted segments (:meth:`EmbeddedLiveState._drop_entries`).

What is live is decided by :func:`~mqproxy.backends.embedded.retention.live_from`. Records are moved in
chunks of :data:`MOVE_CHUNK`: scan the live queues for entries below the new log start and append one copy
per record (no await), fdatasync the copies (in the flusher's worker thread), then re-point every entry
that still names the old offset (one index transaction). Each queue's scan goes on where the previous
chunk stopped, so a run reads each live entry about once. An entry a compaction moved during the fsync
went to the queue's end, still ahead of the scan, and is copied again there; the loop ends with a pass
that finds nothing and every live queue scanned to its end, so no live entry is left pointing into the
doomed segments. Copies nobody points at are garbage that expires like any record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog
import trio
import trio.lowlevel

from mqproxy.backends.embedded.commitlog import CommitLog
from mqproxy.backends.embedded.embedded_queues import EmbeddedQueues
from mqproxy.backends.embedded.index import key_rows, offset_key, queue_key
from mqproxy.backends.embedded.index_retention import Relocation
from mqproxy.backends.embedded.records import decode_message, decode_moved, encode_moved, expand_shared
from mqproxy.backends.embedded.retention import PROGRESS_GROUPS, STATE_TOPICS, live_from, records_to_move
from mqproxy.backends.embedded.sending import index_keys
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.topics import LMQ_QUEUE_ID, is_lmq

#: Entries (or key rows) per index transaction when retention drops them; the event loop runs between
#: (~1-2 µs each, so a few ms per transaction).
DROP_CHUNK = 2048
#: Live entries moved per step (scanned and copied without an await; then fsynced; then re-pointed).
MOVE_CHUNK = 1024
#: Steps one run takes at most before it gives up on moving the rest (a queue rewritten under it forever).
_MAX_MOVE_STEPS = 100_000

_log = structlog.get_logger("mqproxy.store")

#: An index entry: queue id, queue offset, commit-log offset, frame size, tag hash, store time.
_Entry = tuple[int, int, int, int, int, int]


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
        record = decode_message(payload, offset, log)
        found.queues.add(queue_key(record.topic, record.queue_id))
        found.queues.update(queue_key(name, LMQ_QUEUE_ID) for name, _ in record.lmqs)
        keys = index_keys(record.properties)
        if keys:
            found.key_rows += key_rows(record.topic, keys, record.store_timestamp_ms, offset)
    return found


@dataclass(slots=True)
class _Copies:
    """One step's copies: entries by the record they point at, and each copy's (offset, frame size)."""

    moves: dict[int, list[_Entry]]
    positions: list[tuple[int, int]]
    firsts: list[int]  # the offset each record was first written at
    end: int


class EmbeddedLiveState(EmbeddedQueues):
    """Moving live records out of doomed segments and dropping the entries left behind."""

    # Re-declared for mypy, which sees the layer below as Any (mqproxy is an editable install).
    _durable: int
    _flush_error: BaseException | None

    def _live_queues(self) -> list[tuple[bytes, int, int]]:
        """(queue name key, qid, live-from offset) of every queue holding live state."""
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
                key = queue_key(topic, queue_id)
                qid = self._lookup_qid(key)
                if start is not None and qid is not None:
                    out.append((key, qid, start))
        for name in STATE_TOPICS:
            if is_lmq(name):
                key = queue_key(name, LMQ_QUEUE_ID)
                qid = self._lookup_qid(key)
                if qid is not None:
                    out.append((key, qid, 0))
        return out

    async def _move_all_live(self, below: int) -> tuple[int, int, int, int | None]:
        """Move every live record below ``below``; return (records, bytes, queues, None), or with the
        lowest offset still live last when the copies could not be written (a full disk)."""
        records = size = 0
        queues: set[int] = set()
        resume: dict[int, int] = {}  # qid -> queue offset its scan goes on from
        for _ in range(_MAX_MOVE_STEPS):
            if self._closed:
                raise StoreUnavailable("store is closed")
            keys: dict[int, bytes] = {}
            live: list[_Entry] = []
            pending = False
            for key, qid, start in self._live_queues():
                if len(live) >= MOVE_CHUNK:
                    pending = True
                    break
                keys[qid] = key
                found, resume[qid], at_end = self._index.live_entries(
                    qid, max(resume.get(qid, start), start), below, MOVE_CHUNK - len(live)
                )
                live.extend(found)
                pending = pending or not at_end
            if not live:
                if pending:
                    await trio.lowlevel.checkpoint()
                    continue
                return records, size, len(queues), None
            copies = self._copy(records_to_move(live, below), keys)
            if copies is None:
                return records, size, len(queues), self._lowest_live(below)
            await self._flush_once()  # the copies are durable before any entry names them
            if self._durable < copies.end:
                raise StoreUnavailable(f"commit log fsync failed: {self._flush_error}")
            self._repoint(copies)
            records += len(copies.moves)
            size += sum(n for _, n in copies.positions)
            queues.update(e[0] for e in live)
            await trio.lowlevel.checkpoint()
        return records, size, len(queues), self._lowest_live(below)

    def _copy(self, moves: dict[int, list[_Entry]], keys: dict[int, bytes]) -> _Copies | None:
        """Append one copy of each record (naming its old offset and entries); None if it cannot be
        written (nothing is left behind then)."""
        payloads = []
        firsts = []
        for clo, entries in moves.items():
            payload = expand_shared(self._log.read(clo, entries[0][3]), clo, self._log)
            moved = decode_moved(payload)
            firsts.append(clo if moved is None else moved.original)
            payloads.append(encode_moved(clo, [(keys[e[0]], e[1]) for e in entries], payload))
        start = self._log.end
        try:
            positions = self._log.append(payloads)
        except StoreUnavailable as exc:  # a full disk: keep them, say why
            if self._log.end != start:
                self._log.truncate_to(start)
            _log.warning("store.retention_failed", detail=f"cannot move live records: {exc}")
            return None
        return _Copies(moves, positions, firsts, self._log.end)

    def _repoint(self, copies: _Copies) -> None:
        relocations: list[Relocation] = []
        for (clo, entries), (new, size), first in zip(
            copies.moves.items(), copies.positions, copies.firsts, strict=True
        ):
            relocations.extend(
                (qid, offset, clo, new, size, tag, ts, first) for qid, offset, _, _, tag, ts in entries
            )
        self._index.relocate(relocations, checkpoint=copies.end)
        self._index_dirty = True

    def _lowest_live(self, below: int) -> int:
        """The lowest commit-log offset below ``below`` a live entry still points at (``below`` if none)."""
        lowest = below
        for _key, qid, start in self._live_queues():
            position, at_end = start, False
            while not at_end:
                found, position, at_end = self._index.live_entries(qid, position, below, 1 << 30)
                lowest = min([lowest, *(entry[2] for entry in found)])
        return lowest

    async def _drop_entries(self, below: int, doomed: list[DoomedSegment]) -> tuple[int, int]:
        """Drop the entries below ``below`` of the queues the doomed records fed, their key rows and dead
        ``moved`` rows, in transactions of :data:`DROP_CHUNK`; return (entries, queues whose min rose)."""
        names = set().union(*(d.queues for d in doomed))
        qids = sorted(q for q in (self._lookup_qid(name) for name in names) if q is not None)
        entries = 0
        rose: set[int] = set()
        while qids:
            dropped, raised, done = self._index.drop_below(below, qids, DROP_CHUNK)
            entries += dropped
            rose |= raised
            qids = qids[done:]
            await trio.lowlevel.checkpoint()
        rows = [row for d in doomed for row in d.key_rows]
        for i in range(0, len(rows), DROP_CHUNK):
            self._index.delete_key_rows(rows[i : i + DROP_CHUNK])
            await trio.lowlevel.checkpoint()
        self._index.prune_moved(below)
        return entries, len(rose)
