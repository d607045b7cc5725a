"""Consume-queue rows in the index: where a message's record is, its tag hash and store time.

Since issue 18 the rows live in ``cqd``, a duplicate-sorted database with fixed-size values: key = queue
id (:data:`QID`), values = :data:`ROW` (queue offset first, so a queue's values sort by offset), appended
with ``MDB_APPENDDUP`` so LMDB fills their pages instead of splitting them in half.

Before, ``cq`` held one key (``>QQ`` queue id, queue offset) per row, its value in one of these layouts,
told apart by length (read once, when an old store is opened and ``cq`` moves to ``cqd``):

* 16 B ``>HIIHI``: commit-log offset (48 bits, high 16 then low 32), frame size, store time ms (48 bits,
  high 16 then low 32); the tag hash is 0. 20 B: the same followed by ``>I`` tag hash.
* 24 B ``>qIIq`` (commit-log offset, frame size, tag hash, store time ms): written before issue 18, and
  still for numbers the short one cannot hold (an offset or time beyond 48 bits, or a negative one).
"""

from __future__ import annotations

import struct

import lmdb

LONG = struct.Struct(">qIIq")
_SHORT = struct.Struct(">HIIHI")
_SHORT_TAG = struct.Struct(">HIIHII")
_MAX48 = (1 << 48) - 1
_LOW32 = 0xFFFFFFFF


def pack_entry(commitlog_offset: int, size: int, tag: int, store_ms: int) -> bytes:
    """The value for (commit-log offset, frame size, tag hash, store time ms)."""
    if 0 <= commitlog_offset <= _MAX48 and 0 <= store_ms <= _MAX48:
        if tag:
            return _SHORT_TAG.pack(
                commitlog_offset >> 32,
                commitlog_offset & _LOW32,
                size,
                store_ms >> 32,
                store_ms & _LOW32,
                tag,
            )
        return _SHORT.pack(
            commitlog_offset >> 32, commitlog_offset & _LOW32, size, store_ms >> 32, store_ms & _LOW32
        )
    return LONG.pack(commitlog_offset, size, tag, store_ms)


def unpack_entry(value: bytes) -> tuple[int, int, int, int]:
    """(commit-log offset, frame size, tag hash, store time ms) of a value of either layout."""
    n = len(value)
    if n == 16:
        clo_hi, clo_lo, size, ms_hi, ms_lo = _SHORT.unpack(value)
        return clo_hi << 32 | clo_lo, size, 0, ms_hi << 32 | ms_lo
    if n == 20:
        clo_hi, clo_lo, size, ms_hi, ms_lo, tag = _SHORT_TAG.unpack(value)
        return clo_hi << 32 | clo_lo, size, tag, ms_hi << 32 | ms_lo
    return LONG.unpack(value)  # type: ignore[return-value]


# --- the ``cqd`` database: one duplicate-sorted key per queue --------------------------------------------
#: ``cqd`` key: the queue id.
QID = struct.Struct(">Q")
#: ``cqd`` value (fixed size, so LMDB packs a queue's values densely), 26 B: queue offset (sorts them),
#: commit-log offset, frame size, tag hash, store time ms; offsets and time are 48 bits (high 16, low 32).
ROW = struct.Struct(">HIHIIIHI")
_PREFIX = 6  # bytes of the queue offset at the start of a value
#: A ``cqd`` value after its queue offset (see :func:`row_tail`).
TAIL = _TAIL = struct.Struct(">HIIIHI")


def row_tail(commitlog_offset: int, size: int, tag: int, store_ms: int) -> bytes:
    """A ``cqd`` value without its queue offset (the same for a message's queue and LMQ rows); raise
    ValueError for numbers the layout cannot hold (beyond 48 bits or negative)."""
    if not (0 <= commitlog_offset <= _MAX48 and 0 <= store_ms <= _MAX48):
        raise ValueError(f"commit-log offset {commitlog_offset} or store time {store_ms} out of range")
    return _TAIL.pack(
        commitlog_offset >> 32, commitlog_offset & _LOW32, size, tag, store_ms >> 32, store_ms & _LOW32
    )


def tail_fields(log_end: int, store_ms: int) -> tuple[int, int]:
    """The store time's two fields of :data:`TAIL` for rows of records that lie below ``log_end``
    (``TAIL.pack(clo >> 32, clo & 0xFFFFFFFF, size, tag, *tail_fields(...))`` is :func:`row_tail`, its
    range checks done once); raise ValueError as :func:`row_tail` does."""
    if not (0 <= log_end <= _MAX48 and 0 <= store_ms <= _MAX48):
        raise ValueError(f"commit-log end {log_end} or store time {store_ms} out of range")
    return store_ms >> 32, store_ms & _LOW32


def pack_row(offset: int, commitlog_offset: int, size: int, tag: int, store_ms: int) -> bytes:
    return offset_prefix(offset) + row_tail(commitlog_offset, size, tag, store_ms)


def offset_prefix(offset: int) -> bytes:
    """The first bytes of a ``cqd`` value: the queue offset (raises OverflowError beyond 48 bits)."""
    return offset.to_bytes(_PREFIX, "big")


def unpack_row(value: bytes) -> tuple[int, int, int, int, int]:
    """(queue offset, commit-log offset, frame size, tag hash, store time ms) of a ``cqd`` value."""
    off_hi, off_lo, clo_hi, clo_lo, size, tag, ms_hi, ms_lo = ROW.unpack(value)
    return off_hi << 32 | off_lo, clo_hi << 32 | clo_lo, size, tag, ms_hi << 32 | ms_lo


def seek(cursor: lmdb.Cursor, qid: int, offset: int) -> bool:
    """Position ``cursor`` (on ``cqd``) at queue ``qid``'s first row at or after ``offset``."""
    if offset > _MAX48:
        return False
    return bool(cursor.set_range_dup(QID.pack(qid), offset_prefix(max(offset, 0))))


def find(cursor: lmdb.Cursor, qid: int, offset: int) -> bytes | None:
    """Queue ``qid``'s row at ``offset`` (the cursor is left on it), or None."""
    if not 0 <= offset <= _MAX48:
        return None
    prefix = offset_prefix(offset)
    if cursor.set_range_dup(QID.pack(qid), prefix):
        value = cursor.value()
        if value[:_PREFIX] == prefix:
            return bytes(value)
    return None


def first_row(cursor: lmdb.Cursor, qid: int) -> bytes | None:
    return bytes(cursor.value()) if cursor.set_key(QID.pack(qid)) else None


def last_row(cursor: lmdb.Cursor, qid: int) -> bytes | None:
    if cursor.set_key(QID.pack(qid)) and cursor.last_dup():
        return bytes(cursor.value())
    return None


def delete_below(cursor: lmdb.Cursor, qid: int, below: int) -> None:
    """Delete queue ``qid``'s rows below offset ``below``."""
    key = QID.pack(qid)
    if not cursor.set_key(key):
        return
    if below > _MAX48:
        cursor.delete(dupdata=True)
        return
    limit = offset_prefix(max(below, 0))
    while cursor.key() == key and bytes(cursor.value()[:_PREFIX]) < limit:
        if not cursor.delete():  # moves to the next row
            return


def upsert(cursor: lmdb.Cursor, key: bytes, value: bytes) -> None:
    """Put a row, replacing the queue's row at the same offset if there is one."""
    prefix = value[:_PREFIX]
    if cursor.set_range_dup(key, prefix) and cursor.value()[:_PREFIX] == prefix:
        if cursor.value() == value:
            return
        cursor.delete()
    cursor.put(key, value)


def put_rows(cursor: lmdb.Cursor, rows: list[tuple[bytes, bytes]]) -> bool:
    """Put rows, a row replacing the queue's row at its offset if there is one. When every row of a queue
    lies past the queue's last row (one look-up per queue; the usual case) they go in with
    ``MDB_APPENDDUP``, which fills pages, and True is returned; else each by :func:`upsert` (an appended
    duplicate offset would otherwise sit beside the old row), and False."""
    lowest: dict[bytes, bytes] = {}  # the smallest value has the smallest offset (values start with it)
    for key, value in rows:
        known = lowest.get(key)
        if known is None or value < known:
            lowest[key] = value
    for key, value in lowest.items():
        prefix = value[:_PREFIX]
        if cursor.set_key(key) and cursor.last_dup() and bytes(cursor.value()[:_PREFIX]) >= prefix:
            for key_, value in rows:
                upsert(cursor, key_, value)
            return False
    _, added = cursor.putmulti(rows, append=True)
    if added != len(rows):  # a row equal to another of the batch, or the queue changed under us
        for key, value in rows:
            upsert(cursor, key, value)
        return False
    return True


_OLD_KEY = struct.Struct(">QQ")


def move_old_rows(env: lmdb.Environment, cqd: lmdb._Database) -> None:
    """Move the rows of a store written before issue 18 (``cq``: a ``>QQ`` (queue id, queue offset) key per
    row) to ``cqd`` and drop ``cq``, in one transaction; nothing to do when there is no ``cq``."""
    try:
        old = env.open_db(b"cq", create=False)
    except lmdb.NotFoundError:
        return
    with env.begin(write=True) as txn:
        rows = txn.cursor(db=cqd)
        for key, value in txn.cursor(db=old):
            qid, offset = _OLD_KEY.unpack(key)
            row_key, row = QID.pack(qid), pack_row(offset, *unpack_entry(value))
            if not rows.put(row_key, row, append=True):  # sorted, so this appends but for a duplicate
                upsert(rows, row_key, row)
        txn.drop(old, delete=True)
