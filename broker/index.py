"""The embedded store's index in LMDB: consume queues, queue names, consumer offsets, topics, checkpoint.

Named databases (one keyspace per kind, store-notes §8):

* ``cq``: ``>QQ`` (queue id, queue offset) → ``>qIIq`` (commit-log offset, frame size, tag hash,
  store timestamp ms). Big-endian keys sort by (queue, offset), so a queue is one contiguous range.
* ``qids``: queue name key (``topic \\x00 >I queue_id``) → ``>Q`` queue id. Ids are dense u64s, so a
  million light queues cost one small row each and no file or Python object per queue.
* ``offsets``: ``>H len(group)`` group, queue name key → ``>q`` committed consumer offset.
* ``topics``: topic name → JSON topic config.
* ``meta``: ``checkpoint`` (``>Qq``: commit-log offset up to which every record is indexed, latest store
  timestamp among them) and ``next_qid``.

Durability: the environment runs with ``sync=False, metasync=False``. That is safe for the
index because the commit log is the source of truth: every dispatch writes its entries *and* the
checkpoint in one write transaction, so after a crash the index is a consistent prefix of the log and
recovery re-dispatches the records past the checkpoint. The store calls :meth:`Index.sync`
periodically to bound how much an OS crash can roll back (consumer offsets and topic configs, which
are not derivable from the log, can lose at most that window — clients re-commit offsets every 5 s).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

import lmdb
import orjson

from mqproxy.broker.errors import StoreUnavailable
from mqproxy.broker.types import TopicConfig

CQ_KEY = struct.Struct(">QQ")
CQ_VALUE = struct.Struct(">qIIq")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_H = struct.Struct(">H")
_CHECKPOINT = b"checkpoint"
_CHECKPOINT_VALUE = struct.Struct(">Qq")
_NEXT_QID = b"next_qid"

#: One consume-queue entry as the store hands it to :meth:`Index.commit`.
Entry = tuple[int, int, int, int, int, int]  # qid, queue offset, commit-log offset, size, tag hash, ts


def queue_key(topic: str, queue_id: int) -> bytes:
    """The ``qids`` key of a queue (topic names never contain NUL)."""
    return topic.encode() + b"\x00" + _U32.pack(queue_id)


def offset_key(group: str, topic: str, queue_id: int) -> bytes:
    g = group.encode()[:65535]
    return _H.pack(len(g)) + g + queue_key(topic, queue_id)


class Index:
    def __init__(self, path: Path, map_size: int = 64 * 1024**3) -> None:
        path.mkdir(parents=True, exist_ok=True)
        try:
            self._env = lmdb.open(
                str(path),
                map_size=map_size,
                max_dbs=8,
                sync=False,
                metasync=False,
                readahead=False,
                max_readers=126,
            )
        except lmdb.Error as exc:
            raise StoreUnavailable(f"cannot open index at {path}: {exc}") from exc
        self._cq = self._env.open_db(b"cq")
        self._qids = self._env.open_db(b"qids")
        self._offsets = self._env.open_db(b"offsets")
        self._topics = self._env.open_db(b"topics")
        self._meta = self._env.open_db(b"meta")

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
        """One past the queue's last entry (0 for an empty queue)."""
        with self._env.begin(db=self._cq) as txn:
            cursor = txn.cursor()
            positioned = cursor.set_range(CQ_KEY.pack(qid + 1, 0))
            found = cursor.prev() if positioned else cursor.last()
            if not found:
                return 0
            key_qid, offset = CQ_KEY.unpack(cursor.key())
            return offset + 1 if key_qid == qid else 0

    def first_offset(self, qid: int) -> int | None:
        with self._env.begin(db=self._cq) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(CQ_KEY.pack(qid, 0)):
                return None
            key_qid, offset = CQ_KEY.unpack(cursor.key())
            return offset if key_qid == qid else None

    def entries(self, qid: int, start: int, limit: int) -> list[tuple[int, int, int, int, int]]:
        """Up to ``limit`` entries from ``start``: (queue offset, commit-log offset, size, tag hash, ts)."""
        out: list[tuple[int, int, int, int, int]] = []
        with self._env.begin(db=self._cq) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(CQ_KEY.pack(qid, start)):
                return out
            unpack_key, unpack_value = CQ_KEY.unpack, CQ_VALUE.unpack
            for key, value in cursor:
                key_qid, offset = unpack_key(key)
                if key_qid != qid or len(out) >= limit:
                    break
                out.append((offset, *unpack_value(value)))
        return out

    def entry(self, qid: int, offset: int) -> tuple[int, int, int, int] | None:
        with self._env.begin(db=self._cq) as txn:
            value = txn.get(CQ_KEY.pack(qid, offset))
        return None if value is None else CQ_VALUE.unpack(value)

    def commit(
        self,
        entries: Iterable[Entry],
        new_queues: Iterable[tuple[bytes, int]],
        next_qid: int,
        checkpoint: int,
        latest_store_ms: int,
    ) -> None:
        """Write a dispatched batch and the new checkpoint in one transaction."""
        pack_key, pack_value = CQ_KEY.pack, CQ_VALUE.pack
        try:
            with self._env.begin(write=True) as txn:
                new_queues = list(new_queues)
                for name, qid in new_queues:
                    txn.put(name, _U64.pack(qid), db=self._qids)
                cursor = txn.cursor(db=self._cq)
                cursor.putmulti([(pack_key(q, o), pack_value(c, s, t, ts)) for q, o, c, s, t, ts in entries])
                if new_queues:
                    txn.put(_NEXT_QID, _U64.pack(next_qid), db=self._meta)
                txn.put(_CHECKPOINT, _CHECKPOINT_VALUE.pack(checkpoint, latest_store_ms), db=self._meta)
        except lmdb.Error as exc:
            raise StoreUnavailable(f"index write failed: {exc}") from exc

    def reset_queues(self) -> None:
        """Forget every consume queue and queue id (before re-dispatching the whole log)."""
        with self._env.begin(write=True) as txn:
            txn.drop(self._cq, delete=False)
            txn.drop(self._qids, delete=False)
            txn.put(_NEXT_QID, _U64.pack(1), db=self._meta)
            txn.put(_CHECKPOINT, _CHECKPOINT_VALUE.pack(0, 0), db=self._meta)

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
        try:
            with self._env.begin(write=True, db=self._offsets) as txn:
                txn.put(key, _I64.pack(offset))
        except lmdb.Error as exc:
            raise StoreUnavailable(f"index write failed: {exc}") from exc

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
