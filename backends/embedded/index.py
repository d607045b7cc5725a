"""The embedded store's index in LMDB: consume queues, queue names, consumer offsets, topics, checkpoint.

Named databases (one keyspace per kind, store-notes §8):

* ``cqd``: ``>Q`` queue id → duplicate-sorted fixed-size values (queue offset, commit-log offset, frame size,
  tag hash, store timestamp ms; 26 B; :mod:`~mqproxy.backends.embedded.cq_entry`). A queue is one key; its
  values sort by offset and are appended with ``MDB_APPENDDUP``, which fills LMDB's pages (a key per entry,
  as ``cq`` had before issue 18, left queues written side by side in half-full pages). A store written
  before then has its ``cq`` rows moved to ``cqd`` when opened.
* ``qids``: queue name key (``topic \\x00 >I queue_id``) → ``>Q`` queue id. Ids are dense u64s, so a
  million light queues cost one small row each and no file or Python object per queue.
* ``offsets``: ``>H len(group)`` group, queue name key → ``>q`` committed consumer offset.
* ``lmqoffs``: reverse index of the light-queue rows of ``offsets``: queue name key, group → ``>q`` offset
  (same value, written in the same transaction), so the groups reading one LMQ are one range seek.
* ``floors``: ``>Q`` queue id → ``>Qq`` (floor, ms): the queue's entries below ``floor`` were deleted by a
  rewrite at ``ms``. Its next offset is never below the floor, even when every entry is gone.
* ``keys``: ``topic \x00 key \x00 >qQ`` (store timestamp ms, commit-log offset) → empty: every message's
  ``KEYS`` entries and ``UNIQ_KEY`` (:func:`~mqproxy.backends.embedded.sending.index_keys`), so
  QUERY_MESSAGE is one range seek per (topic, key), in store-time order. Written in the dispatch
  transaction, like ``cq``.
* ``moved``: ``>Q`` commit-log offset a record was first written at → ``>Q`` offset of the copy
  retention moved it to; ``movedrev``: ``>QQ`` (copy, first offset) → empty
  (:mod:`~mqproxy.backends.embedded.index_retention`).
* ``topics``: topic name → JSON topic config.
* ``meta``: ``checkpoint`` (``>Qq``: commit-log offset up to which every record is indexed, latest store
  timestamp among them), ``next_qid`` and ``lmqoffs`` (present once ``lmqoffs`` covers every row).

Durability: the environment runs with ``sync=False, metasync=False``. That is safe for the
index because the commit log is the source of truth: every dispatch writes its entries *and* the
checkpoint in one write transaction, so after a crash the index is a consistent prefix of the log and
recovery re-dispatches the records past the checkpoint. The store calls :meth:`Index.sync`
periodically to bound how much an OS crash can roll back (consumer offsets and topic configs, which
are not derivable from the log, can lose at most that window — clients re-commit offsets every 5 s).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import lmdb
import orjson

from mqproxy.backends.embedded.cq_entry import (
    QID,
    delete_below,
    find,
    first_row,
    last_row,
    move_old_rows,
    pack_row,
    put_rows,
    seek,
    unpack_row,
)
from mqproxy.backends.embedded.index_retention import RetentionIndex
from mqproxy.model.errors import BackendError, StoreUnavailable
from mqproxy.model.types import TopicConfig

_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
INT64_MAX = 2**63 - 1
_H = struct.Struct(">H")
_CHECKPOINT = b"checkpoint"
_CHECKPOINT_VALUE = struct.Struct(">Qq")
_NEXT_QID = b"next_qid"
_LMQ_OFFSETS_BUILT = b"lmqoffs"
_FLOOR = struct.Struct(">Qq")
#: At most this many remembered first offsets (:meth:`Index.first_offset`); ~100 B each.
_FIRST_LIMIT = 65536
#: Every light queue's ``qids`` key starts with this (``%LMQ%``); the range ends before ``%LMQ&``.
LMQ_KEY_PREFIX = b"%LMQ%"
_LMQ_KEY_END = b"%LMQ&"

#: One consume-queue entry as the store hands it to :meth:`Index.commit`.
Entry = tuple[int, int, int, int, int, int]  # qid, queue offset, commit-log offset, size, tag hash, ts
_KEY_SUFFIX = struct.Struct(">qQ")


def key_rows(topic: str, keys: Iterable[str], store_ms: int, commitlog_offset: int) -> list[bytes]:
    """The ``keys`` rows of one stored message (``keys`` from
    :func:`~mqproxy.backends.embedded.sending.index_keys`)."""
    suffix = _KEY_SUFFIX.pack(store_ms, commitlog_offset)
    prefix = topic.encode() + b"\x00"
    return [prefix + key.encode() + b"\x00" + suffix for key in keys]


def queue_key(topic: str, queue_id: int) -> bytes:
    """The ``qids`` key of a queue (topic names never contain NUL)."""
    return topic.encode() + b"\x00" + _U32.pack(queue_id)


def offset_key(group: str, topic: str, queue_id: int) -> bytes:
    g = group.encode()[:65535]
    return _H.pack(len(g)) + g + queue_key(topic, queue_id)


class Index(RetentionIndex):
    def __init__(self, path: Path, map_size: int = 64 * 1024**3) -> None:
        path.mkdir(parents=True, exist_ok=True)
        try:
            self._env = lmdb.open(
                str(path),
                map_size=map_size,
                max_dbs=16,
                sync=False,
                metasync=False,
                readahead=False,
                max_readers=126,
            )
        except lmdb.Error as exc:
            raise StoreUnavailable(f"cannot open index at {path}: {exc}") from exc
        self._cq = self._env.open_db(b"cqd", dupsort=True, dupfixed=True)
        self._qids = self._env.open_db(b"qids")
        self._offsets = self._env.open_db(b"offsets")
        self._topics = self._env.open_db(b"topics")
        self._meta = self._env.open_db(b"meta")
        self._lmq_offsets = self._env.open_db(b"lmqoffs")
        self._floors = self._env.open_db(b"floors")
        self._keys = self._env.open_db(b"keys")
        self._moved = self._env.open_db(b"moved")
        self._moved_rev = self._env.open_db(b"movedrev")
        #: Queue id -> its first offset, as read from ``cqd`` (queues with rows only; at most
        #: _FIRST_LIMIT, emptied when full). An append only adds rows past a queue's last one, so it keeps
        #: these; every transaction that may delete, move or re-create rows empties it
        #: (:meth:`_rewriting`), as does an append that had to replace rows.
        self._firsts: dict[int, int] = {}
        self._build_lmq_offsets()
        try:
            move_old_rows(self._env, self._cq)
        except lmdb.Error as exc:
            raise StoreUnavailable(f"index write failed: {exc}") from exc

    def _build_lmq_offsets(self) -> None:
        """Fill ``lmqoffs`` from ``offsets`` once (stores written before the reverse index existed)."""
        try:
            with self._env.begin(write=True) as txn:
                if txn.get(_LMQ_OFFSETS_BUILT, db=self._meta) is not None:
                    return
                for key, value in txn.cursor(db=self._offsets):
                    key = bytes(key)
                    (glen,) = _H.unpack_from(key)
                    name_key = key[2 + glen :]
                    if name_key.startswith(LMQ_KEY_PREFIX):
                        txn.put(name_key + key[2 : 2 + glen], value, db=self._lmq_offsets)
                txn.put(_LMQ_OFFSETS_BUILT, b"1", db=self._meta)
        except lmdb.Error as exc:
            raise StoreUnavailable(f"index write failed: {exc}") from exc

    # --- meta -----------------------------------------------------------------------------------
    def checkpoint(self) -> tuple[int, int]:
        """(commit-log offset indexed up to, latest store timestamp ms among indexed records)."""
        with self._env.begin(db=self._meta) as txn:
            value = txn.get(_CHECKPOINT)
        return (0, 0) if value is None else _CHECKPOINT_VALUE.unpack(value)

    def next_qid(self) -> int:
        with self._env.begin(db=self._meta) as txn:
            value = txn.get(_NEXT_QID)
        return 1 if value is None else _U64.unpack(value)[0]

    # --- queues ---------------------------------------------------------------------------------
    def lookup_qid(self, key: bytes) -> int | None:
        with self._env.begin(db=self._qids) as txn:
            value = txn.get(key)
        return None if value is None else _U64.unpack(value)[0]

    def next_offset(self, qid: int) -> int:
        """One past the queue's last entry, never below its floor (0 for a queue never written)."""
        with self._env.begin() as txn:
            return self._last(txn, qid)[0]

    def _last(self, txn: lmdb.Transaction, qid: int) -> tuple[int, int]:
        """(next offset, ms of the last append or rewrite; 0 if none) of queue ``qid``."""
        row = last_row(txn.cursor(db=self._cq), qid)
        offset = ts = 0
        if row is not None:
            last, _clo, _size, _tag, ts = unpack_row(row)
            offset = last + 1
        floor = txn.get(_U64.pack(qid), db=self._floors)
        if floor is not None:
            floor_offset, floor_ms = _FLOOR.unpack(floor)
            offset, ts = max(offset, floor_offset), max(ts, floor_ms)
        return offset, ts

    def first_offset(self, qid: int) -> int | None:
        """The queue's first offset in ``cqd`` (None without rows); remembered, so a pull's bounds
        (an MQTT push hub pulls after every write) read no LMDB page again."""
        first = self._firsts.get(qid)
        if first is not None:
            return first
        with self._env.begin(db=self._cq) as txn:
            row = first_row(txn.cursor(), qid)
        if row is None:
            return None
        first = unpack_row(row)[0]
        if len(self._firsts) >= _FIRST_LIMIT:
            self._firsts.clear()
        self._firsts[qid] = first
        return first

    def entries(self, qid: int, start: int, limit: int) -> list[tuple[int, int, int, int, int]]:
        """Up to ``limit`` entries from ``start``: (queue offset, commit-log offset, size, tag hash, ts)."""
        out: list[tuple[int, int, int, int, int]] = []
        if limit <= 0:
            return out
        with self._env.begin(db=self._cq) as txn:
            cursor = txn.cursor()
            if not seek(cursor, qid, start):
                return out
            for value in cursor.iternext_dup():
                out.append(unpack_row(value))
                if len(out) >= limit:
                    break
        return out

    def entry(self, qid: int, offset: int) -> tuple[int, int, int, int] | None:
        with self._env.begin(db=self._cq) as txn:
            row = find(txn.cursor(), qid, offset)
        return None if row is None else unpack_row(row)[1:]

    def commit_entries(
        self,
        entries: Iterable[Entry],
        new_queues: Iterable[tuple[bytes, int]],
        next_qid: int,
        checkpoint: int,
        latest_store_ms: int,
        keys: Iterable[bytes] = (),
    ) -> None:
        """:meth:`commit` of consume-queue entries as tuples (recovery re-dispatching)."""
        pack_key = QID.pack
        rows = [(pack_key(q), pack_row(o, c, s, t, ts)) for q, o, c, s, t, ts in entries]
        self.commit(rows, new_queues, next_qid, checkpoint, latest_store_ms, keys)

    def commit(
        self,
        rows: list[tuple[bytes, bytes]],
        new_queues: Iterable[tuple[bytes, int]],
        next_qid: int,
        checkpoint: int,
        latest_store_ms: int,
        keys: Iterable[bytes] = (),
    ) -> None:
        """Write a dispatched batch (consume-queue rows: ``QID`` key and
        :func:`~mqproxy.backends.embedded.cq_entry.pack_row` value; one at an offset already held
        replaces that row; :func:`key_rows`) and the new checkpoint in one transaction."""
        try:
            with self._env.begin(write=True) as txn:
                new_queues = list(new_queues)
                for name, qid in new_queues:
                    txn.put(name, _U64.pack(qid), db=self._qids)
                cursor = txn.cursor(db=self._cq)
                if not put_rows(cursor, rows):
                    self._firsts.clear()  # rows replaced at offsets held: a first offset may differ
                if keys:
                    txn.cursor(db=self._keys).putmulti([(row, b"") for row in keys])
                if new_queues:
                    txn.put(_NEXT_QID, _U64.pack(next_qid), db=self._meta)
                txn.put(_CHECKPOINT, _CHECKPOINT_VALUE.pack(checkpoint, latest_store_ms), db=self._meta)
        except lmdb.Error as exc:
            raise StoreUnavailable(f"index write failed: {exc}") from exc

    def reset_queues(self) -> None:
        """Forget every consume queue and queue id (before re-dispatching the whole log)."""
        with self._rewriting() as txn:
            txn.drop(self._cq, delete=False)
            txn.drop(self._qids, delete=False)
            txn.drop(self._floors, delete=False)
            txn.drop(self._keys, delete=False)
            txn.drop(self._moved, delete=False)
            txn.drop(self._moved_rev, delete=False)
            txn.put(_NEXT_QID, _U64.pack(1), db=self._meta)
            txn.put(_CHECKPOINT, _CHECKPOINT_VALUE.pack(0, 0), db=self._meta)

    # --- message keys ---------------------------------------------------------------------------
    def find_key(self, topic: str, key: str, begin_ms: int, end_ms: int, limit: int) -> list[int]:
        """Commit-log offsets of ``topic``'s messages indexed under ``key`` with a store time in
        [``begin_ms``, ``end_ms``], newest first, at most ``limit``."""
        prefix = topic.encode() + b"\x00" + key.encode() + b"\x00"
        low = prefix + _KEY_SUFFIX.pack(max(begin_ms, 0), 0)  # store times are never negative
        high = prefix + _KEY_SUFFIX.pack(min(max(end_ms, 0), INT64_MAX), 2**64 - 1)
        out: list[int] = []
        with self._env.begin(db=self._keys) as txn:
            cursor = txn.cursor()
            positioned = cursor.set_range(high)
            found = cursor.prev() if positioned else cursor.last()
            while found and len(out) < limit:
                row = bytes(cursor.key())
                if row < low:
                    break
                out.append(_KEY_SUFFIX.unpack(row[-_KEY_SUFFIX.size :])[1])
                found = cursor.prev()
        return out

    # --- consumer offsets -----------------------------------------------------------------------
    def get_consumer_offset(self, key: bytes) -> int | None:
        with self._env.begin(db=self._offsets) as txn:
            value = txn.get(key)
        return None if value is None else _I64.unpack(value)[0]

    def consumer_offsets(self) -> list[tuple[str, str, int, int]]:
        """Every committed offset as (group, topic, queue id, offset)."""
        out = []
        with self._env.begin(db=self._offsets) as txn:
            for key, value in txn.cursor():
                key = bytes(key)
                (glen,) = _H.unpack_from(key)
                group = key[2 : 2 + glen].decode()
                topic = key[2 + glen : -5].decode()  # queue_key: topic, NUL, u32 queue id
                out.append((group, topic, _U32.unpack(key[-4:])[0], _I64.unpack(bytes(value))[0]))
        return out

    def put_consumer_offset(self, key: bytes, offset: int) -> None:
        """Store an :func:`offset_key` row (and its ``lmqoffs`` twin for a light queue)."""
        value = _I64.pack(offset)
        (glen,) = _H.unpack_from(key)
        name_key = key[2 + glen :]
        try:
            with self._env.begin(write=True) as txn:
                txn.put(key, value, db=self._offsets)
                if name_key.startswith(LMQ_KEY_PREFIX):
                    txn.put(name_key + key[2 : 2 + glen], value, db=self._lmq_offsets)
        except lmdb.Error as exc:
            raise StoreUnavailable(f"index write failed: {exc}") from exc

    # --- queue lifecycle ------------------------------------------------------------------------
    def rewrite(self, qid: int, keep: Sequence[int], below: int, now_ms: int) -> tuple[int, int]:
        """Re-append the entries at ``keep`` at the queue's end (index time ``now_ms``), delete every entry
        below ``below`` and raise the floor to ``below``, in one transaction; return (min, next offset).

        The caller validated ``keep`` and ``below`` against the queue's bounds.
        """
        try:
            with self._rewriting() as txn:
                end, _ = self._last(txn, qid)
                cursor = txn.cursor(db=self._cq)
                kept = []
                for i, offset in enumerate(keep):
                    value = find(cursor, qid, offset)
                    if value is None:
                        raise BackendError(f"queue {qid} has no entry at offset {offset}")
                    _offset, clo, size, tag, _ts = unpack_row(value)
                    kept.append((QID.pack(qid), pack_row(end + i, clo, size, tag, now_ms)))
                put_rows(cursor, kept)
                delete_below(cursor, qid, below)
                floor = below
                old = txn.get(_U64.pack(qid), db=self._floors)
                if old is not None:
                    floor = max(floor, _FLOOR.unpack(old)[0])
                txn.put(_U64.pack(qid), _FLOOR.pack(floor, now_ms), db=self._floors)
                first = self._first(txn, qid)
                new_end = end + len(kept)
                return (new_end if first is None else first), new_end
        except lmdb.Error as exc:
            raise StoreUnavailable(f"index write failed: {exc}") from exc

    def _first(self, txn: lmdb.Transaction, qid: int) -> int | None:
        row = first_row(txn.cursor(db=self._cq), qid)
        return None if row is None else unpack_row(row)[0]

    def scan_lmqs(
        self,
        start: bytes,
        stop: bytes | None,
        idle_before_ms: int,
        *,
        max_found: int,
        deadline: float,
    ) -> tuple[list[tuple[bytes, int]], bytes | None]:
        """Visit light queues from ``qids`` key ``start`` (inclusive) to ``stop`` (exclusive; None: the end
        of the LMQ range) until ``max_found`` qualify or ``time.perf_counter()`` passes ``deadline``
        (checked every 16 queues); return those idle since ``idle_before_ms`` whose every consumer offset is
        at their end, as (key, qid), and the key to resume from (None once ``stop`` is reached).

        One read transaction; a few B-tree seeks per queue and no allocation beyond the result.
        """
        stop = _LMQ_KEY_END if stop is None else min(stop, _LMQ_KEY_END)
        found: list[tuple[bytes, int]] = []
        unpack_u64, unpack_i64 = _U64.unpack, _I64.unpack
        with self._env.begin() as txn:
            names = txn.cursor(db=self._qids)
            readers = txn.cursor(db=self._lmq_offsets)
            if not names.set_range(max(start, LMQ_KEY_PREFIX)):
                return found, None
            clock = time.perf_counter
            visited = 0
            while len(found) < max_found and (visited & 15 or clock() < deadline):
                visited += 1
                key = names.key()
                if key >= stop:
                    return found, None
                (qid,) = unpack_u64(names.value())
                end, ts = self._last(txn, qid)
                if ts <= idle_before_ms:
                    read = True
                    if readers.set_range(key):
                        for reader_key, value in readers:
                            if reader_key[: len(key)] != key:
                                break
                            if unpack_i64(value)[0] < end:
                                read = False
                                break
                    if read:
                        found.append((bytes(key), qid))
                if not names.next():
                    return found, None
            return found, bytes(names.key())

    def delete_queues(self, queues: Sequence[tuple[bytes, int]]) -> None:
        """Delete light queues given as (``qids`` key, qid): entries, name row, floor, consumer offsets."""
        try:
            with self._rewriting() as txn:
                for key, qid in queues:
                    self._drop_queue(txn, key, qid)
                    txn.delete(key, db=self._qids)
        except lmdb.Error as exc:
            raise StoreUnavailable(f"index write failed: {exc}") from exc

    def _drop_queue(self, txn: lmdb.Transaction, key: bytes, qid: int) -> None:
        """Delete a queue's entries, floor and (light queue) consumer offsets; keep its name row."""
        cursor = txn.cursor(db=self._cq)
        if cursor.set_key(QID.pack(qid)):
            cursor.delete(dupdata=True)
        txn.delete(_U64.pack(qid), db=self._floors)
        readers = txn.cursor(db=self._lmq_offsets)
        groups = []
        if readers.set_range(key):
            for reader_key in readers.iternext(values=False):
                if reader_key[: len(key)] != key:
                    break
                groups.append(bytes(reader_key[len(key) :]))
        for group in groups:
            txn.delete(key + group, db=self._lmq_offsets)
            txn.delete(_H.pack(len(group)) + group + key, db=self._offsets)

    def restart_queue(self, key: bytes, qid: int, commitlog_offset: int) -> bool:
        """Recovery: the record at ``commitlog_offset`` is offset 0 of light queue ``key``. If the index
        holds anything else for that queue, it is an older generation whose deletion was lost: drop it
        (entries, floor, consumer offsets) and return True. A re-dispatch of the same record is a no-op."""
        try:
            with self._rewriting() as txn:
                first = find(txn.cursor(db=self._cq), qid, 0)
                if first is not None and unpack_row(first)[1] == commitlog_offset:
                    return False
                if first is None and self._last(txn, qid)[0] == 0:
                    return False
                self._drop_queue(txn, key, qid)
                return True
        except lmdb.Error as exc:
            raise StoreUnavailable(f"index write failed: {exc}") from exc

    def used_bytes(self) -> int:
        """Bytes of B-tree pages in use (the file keeps freed pages for reuse; it never shrinks)."""
        total = 0
        with self._env.begin() as txn:
            dbs = [None, self._cq, self._qids, self._offsets, self._topics, self._meta]
            dbs += [self._lmq_offsets, self._floors]
            for db in dbs:
                stat = txn.stat(db) if db is not None else self._env.stat()
                total += (stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]) * stat["psize"]
        return total

    # --- topics ---------------------------------------------------------------------------------
    def put_topic(self, config: TopicConfig) -> None:
        value = orjson.dumps(
            {
                "read_queues": config.read_queues,
                "write_queues": config.write_queues,
                "perm": config.perm,
                "sys_flag": config.sys_flag,
            }
        )
        try:
            with self._env.begin(write=True, db=self._topics) as txn:
                txn.put(config.name.encode(), value)
        except lmdb.Error as exc:
            raise StoreUnavailable(f"index write failed: {exc}") from exc

    def topics(self) -> list[TopicConfig]:
        with self._env.begin(db=self._topics) as txn:
            return [TopicConfig(name=k.decode(), **orjson.loads(v)) for k, v in txn.cursor()]

    # --- lifecycle ------------------------------------------------------------------------------
    def sync(self) -> None:
        """Flush the environment to disk (releases the GIL; may run in a worker thread)."""
        self._env.sync(True)

    def close(self) -> None:
        self._env.close()
