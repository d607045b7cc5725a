"""The index side of commit-log retention (a mixin of :class:`~mqproxy.backends.embedded.index.Index`).

* :meth:`RetentionIndex.relocate` points index entries at the moved copy of a record and records the
  move in the ``moved`` database (old commit-log offset → new), so a message id naming the old offset
  (END_TRANSACTION of a half message, VIEW_MESSAGE_BY_ID) still finds it.
* :meth:`RetentionIndex.drop_below` deletes, in the queues the deleted records named, the leading
  entries whose record lies below the log's new start (the queue's min offset rises; a queue left without
  entries gets a floor, so its max offset never goes back); :meth:`RetentionIndex.delete_key_rows` the
  ``keys`` rows of those records and :meth:`RetentionIndex.prune_moved` ``moved`` rows whose record is
  gone. The caller splits the work into chunks, so no transaction holds the event loop long.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import lmdb

from mqproxy.backends.embedded.cq_entry import QID, find, pack_row, seek, unpack_row, upsert
from mqproxy.model.errors import StoreUnavailable

_U64 = struct.Struct(">Q")
_FLOOR = struct.Struct(">Qq")
_CHECKPOINT = b"checkpoint"
_CHECKPOINT_VALUE = struct.Struct(">Qq")

#: One relocation: queue id, queue offset, old commit-log offset, new commit-log offset, new frame size,
#: tag hash and store time (these two only for an entry ``relocate(create=True)`` creates), and the offset
#: the record was first written at.
Relocation = tuple[int, int, int, int, int, int, int, int]


class RetentionIndex:
    """Retention operations over the ``cq``, ``keys`` and ``moved`` databases."""

    if TYPE_CHECKING:
        _env: lmdb.Environment
        _cq: lmdb._Database
        _keys: lmdb._Database
        _moved: lmdb._Database
        _moved_rev: lmdb._Database
        _floors: lmdb._Database
        _meta: lmdb._Database
        _firsts: dict[int, int]

    def _rewriting(self) -> lmdb.Transaction:
        """A write transaction that may delete, move or re-create consume-queue rows: forgets every
        remembered first offset (:meth:`~mqproxy.backends.embedded.index.Index.first_offset`) first."""
        self._firsts.clear()
        return self._env.begin(write=True)

    def relocate(self, moves: Sequence[Relocation], *, create: bool = False, checkpoint: int = 0) -> int:
        """Point each entry (qid, queue offset) that still names the old offset at the new one, and record
        old → new in ``moved`` (earlier rows naming the old offset follow it). With ``create`` (a rebuild
        from the log) a missing entry is created. A ``checkpoint`` past the current one advances it (the
        moved copies are indexed, so recovery need not look at them again). Returns the entries changed.
        One transaction."""
        changed = 0
        try:
            with self._rewriting() as txn:
                if checkpoint:
                    value = txn.get(_CHECKPOINT, db=self._meta)
                    current, latest_ms = (0, 0) if value is None else _CHECKPOINT_VALUE.unpack(value)
                    if checkpoint > current:
                        txn.put(_CHECKPOINT, _CHECKPOINT_VALUE.pack(checkpoint, latest_ms), db=self._meta)
                retarget: dict[int, tuple[int, int]] = {}
                rows = txn.cursor(db=self._cq)
                for qid, offset, old, new, size, tag, ts, first in moves:
                    value = find(rows, qid, offset)
                    if value is None:
                        if not create:
                            continue
                    else:
                        _offset, clo, _size, tag, ts = unpack_row(value)
                        if clo != old:
                            continue
                    upsert(rows, QID.pack(qid), pack_row(offset, new, size, tag, ts))
                    retarget[old] = (new, first)
                    changed += 1
                for old, (new, first) in retarget.items():
                    self._record_move(txn, old, new, first)
        except lmdb.Error as exc:
            raise StoreUnavailable(f"index write failed: {exc}") from exc
        return changed

    def _record_move(self, txn: lmdb.Transaction, old: int, new: int, first: int) -> None:
        """``moved`` rows for a record first written at ``first``, moved from ``old`` to ``new``. If ``old``
        was itself a copy, the rows naming it (found through ``movedrev``) follow it to ``new`` and ``old``
        gets no row of its own: rows exist only for the offsets records were first written at (what send
        results and message ids name), so they stay as many as the live records moved."""
        rev = txn.cursor(db=self._moved_rev)
        prefix = _U64.pack(old)
        sources = []
        if rev.set_range(prefix):
            for row in rev.iternext(values=False):
                if row[:8] != prefix:
                    break
                sources.append(bytes(row[8:]))
        for source in sources:
            txn.delete(prefix + source, db=self._moved_rev)
        if not sources:
            sources = [_U64.pack(first)]
        target = _U64.pack(new)
        for source in sources:
            txn.put(source, target, db=self._moved)
            txn.put(target + source, b"", db=self._moved_rev)

    def _raise_floor(self, txn: lmdb.Transaction, qid: int, floor: int, ms: int) -> None:
        key = _U64.pack(qid)
        old = txn.get(key, db=self._floors)
        if old is not None:
            old_floor, old_ms = _FLOOR.unpack(old)
            floor, ms = max(floor, old_floor), max(ms, old_ms)
        txn.put(key, _FLOOR.pack(floor, ms), db=self._floors)

    def moved_to(self, offset: int) -> int | None:
        """Where the record once at commit-log ``offset`` lives now, or None if it was never moved."""
        with self._env.begin(db=self._moved) as txn:
            value = txn.get(_U64.pack(offset))
        return None if value is None else _U64.unpack(value)[0]

    def live_entries(
        self, qid: int, start: int, below: int, limit: int, examine: int = 8192
    ) -> tuple[list[tuple[int, int, int, int, int, int]], int, bool]:
        """Up to ``limit`` entries of queue ``qid`` from queue offset ``start`` whose record lies below
        commit-log offset ``below``, as (qid, queue offset, commit-log offset, size, tag hash, store
        time), looking at no more than ``examine`` entries; the offset to go on from; and whether the
        queue's end was reached."""
        found: list[tuple[int, int, int, int, int, int]] = []
        resume = start
        with self._env.begin(db=self._cq) as txn:
            cursor = txn.cursor()
            if not seek(cursor, qid, start):
                return found, resume, True
            for value in cursor.iternext_dup():
                offset, clo, size, tag, ts = unpack_row(value)
                if len(found) >= limit or examine <= 0:
                    return found, offset, False
                examine -= 1
                resume = offset + 1
                if clo < below:
                    found.append((qid, offset, clo, size, tag, ts))
        return found, resume, True

    def drop_below(self, below: int, qids: Sequence[int], limit: int) -> tuple[int, set[int], int]:
        """Delete the leading entries of queues ``qids`` whose record lies below ``below`` (stopping, per
        queue, at the first entry at or above it), at most ``limit`` in this transaction; a queue left
        empty gets a floor at its old end. Returns (entries deleted, queues whose min offset rose, how many
        of ``qids`` are done): call again with the rest."""
        entries = 0
        queues: set[int] = set()
        done = 0
        try:
            with self._rewriting() as txn:
                cursor = txn.cursor(db=self._cq)
                for qid in qids:
                    if entries >= limit:
                        break
                    key = QID.pack(qid)
                    positioned = cursor.set_key(key)
                    dropped = 0
                    last = (0, 0)  # (queue offset, store time) of the last entry dropped
                    emptied = True
                    while positioned:
                        if cursor.key() != key:
                            break
                        offset, clo, _size, _tag, ts = unpack_row(cursor.value())
                        if clo >= below:
                            emptied = False
                            break
                        if entries + dropped >= limit:  # this queue goes on in the next call
                            emptied = False
                            done -= 1
                            break
                        last = (offset, ts)
                        cursor.delete()  # moves to the next entry
                        dropped += 1
                        positioned = cursor.key() != b""
                    done += 1
                    if dropped:
                        entries += dropped
                        queues.add(qid)
                        if emptied:  # keep the queue's max offset: a floor, as a rewrite leaves one
                            self._raise_floor(txn, qid, last[0] + 1, last[1])
        except lmdb.Error as exc:
            raise StoreUnavailable(f"index write failed: {exc}") from exc
        return entries, queues, done

    def delete_key_rows(self, rows: Iterable[bytes]) -> None:
        """Delete ``keys`` rows (those of deleted records). One transaction."""
        try:
            with self._env.begin(write=True, db=self._keys) as txn:
                for row in rows:
                    txn.delete(row)
        except lmdb.Error as exc:
            raise StoreUnavailable(f"index write failed: {exc}") from exc

    def prune_moved(self, below: int) -> int:
        """Delete the ``moved`` rows whose record is gone (target below ``below``); return how many."""
        try:
            with self._env.begin(write=True) as txn:
                rev = txn.cursor(db=self._moved_rev)
                gone = []
                if rev.first():
                    for row in rev.iternext(values=False):
                        if _U64.unpack(row[:8])[0] >= below:
                            break  # ``movedrev`` sorts by target
                        gone.append(bytes(row))
                for row in gone:
                    txn.delete(row, db=self._moved_rev)
                    txn.delete(row[8:], db=self._moved)
        except lmdb.Error as exc:
            raise StoreUnavailable(f"index write failed: {exc}") from exc
        return len(gone)
