"""The fixed parts of the compact record (:mod:`~mqproxy.backends.embedded.record_compact` documents the
layout): kind, bits, head structs, varints, and the writing of SHARED records (:class:`SharedBases`,
:func:`encode_shared`). Part of the on-disk format."""

from __future__ import annotations

import struct
from collections.abc import Sequence

KIND_COMPACT = 3
_Q = struct.Struct(">q")
_I = struct.Struct(">I")
_EXT, _BORN_ABS, _IPV4, _LMQ_PROPS, _WIDE, _LMQ_SHORT = 1, 2, 4, 8, 16, 32
#: Bits :func:`~mqproxy.backends.embedded.records.layout` and :mod:`.record_shared` read.
IPV4, LMQ_SHORT, LMQ_PROPS, WIDE, EXT, BORN_ABS = _IPV4, _LMQ_SHORT, _LMQ_PROPS, _WIDE, _EXT, _BORN_ABS
#: The record refers to an earlier record of its append for its born host, topic, LMQ names, properties.
SHARED = 64
#: Bits that say how the shared fields are written: records sharing them must agree on these.
SHARED_KEY_BITS = _IPV4 | _LMQ_SHORT | _LMQ_PROPS
#: Bytes of the commit-log frame around each record (``commitlog.HEADER_SIZE``).
FRAME_HEADER_BYTES = 8
_HEAD = struct.Struct(">BBHIHIhH")
_HEAD_WIDE = struct.Struct(">BBiqqhH")
HEAD, HEAD_WIDE = _HEAD, _HEAD_WIDE
_MAX48 = (1 << 48) - 1
_EXT_FIELDS = EXT_FIELDS = struct.Struct(">iii")
_U32_MAX = 0xFFFFFFFF
_BYTE = tuple(bytes((n,)) for n in range(256))

#: Largest record that becomes a base: readers cache bases and read one per SHARED record, so a base is
#: small whatever the bodies (a large message's fields are a small part of it anyway).
MAX_BASE_BYTES = 1024
#: What a base is found by: born host, topic, LMQ names, stored property items, whether LMQ_PROPS.
SharedKey = tuple[str, str, tuple[str, ...], tuple[tuple[str, str], ...], bool]


#: A base: its frame position in bytes from the append's first frame, its :data:`SHARED_KEY_BITS` bits and
#: its LMQ offsets (a SHARED record stores its own as differences from them).
Base = tuple[int, int, tuple[int, ...]]


class SharedBases:
    """The records of one append that later ones may refer to: :data:`SharedKey` -> :data:`Base`;
    ``position`` is where
    the next record's frame goes. The last match is compared first (consecutive records from one
    publisher share their fields), the table searched when it differs."""

    __slots__ = ("_last", "_pending", "bases", "position")

    def __init__(self) -> None:
        self.bases: dict[SharedKey, Base] = {}
        self.position = 0
        self._last: tuple[SharedKey, Sequence[tuple[str, int]], Base] | None = None
        self._pending: tuple[SharedKey, Sequence[tuple[str, int]]] | None = None

    def find(
        self,
        host: str,
        topic: str,
        items: tuple[tuple[str, str], ...],
        lmqs: Sequence[tuple[str, int]],
        derived: bool,
    ) -> Base | None:
        """The base of a record with these fields (``items``: the stored properties), or None: then the
        record is written whole and :meth:`added` makes it the base of later ones."""
        last = self._last
        if last is not None:
            key, last_lmqs, entry = last
            n = len(lmqs)
            if (
                host == key[0]
                and topic == key[1]
                and items == key[3]
                and derived == key[4]
                and n == len(last_lmqs)
                and (n == 0 or lmqs[0][0] == last_lmqs[0][0])
                and (n < 2 or lmqs[1][0] == last_lmqs[1][0])
                and (n < 3 or _same_names(lmqs, last_lmqs))
            ):
                return entry
        key = (host, topic, tuple([name for name, _ in lmqs]), items, derived)
        found = self.bases.get(key)
        if found is None:
            self._pending = (key, lmqs)
        else:
            self._last = (key, lmqs, found)
        return found

    def added(self, bits: int, size: int) -> None:
        """The record :meth:`find` found no base for was written whole at :attr:`position`, with ``bits``,
        in ``size`` bytes; it becomes a base unless larger than :data:`MAX_BASE_BYTES`."""
        if self._pending is not None and size <= MAX_BASE_BYTES:
            key, lmqs = self._pending
            offsets = tuple([offset for _, offset in lmqs])
            entry = self.bases[key] = (self.position, bits & SHARED_KEY_BITS, offsets)
            self._last = (key, lmqs, entry)
        self._pending = None

    def rollback(self, position: int) -> None:
        """Forget the records from ``position`` on (their send failed; other records take their place)."""
        self.position = position
        self._last = self._pending = None
        for key in [k for k, (at, _, _) in self.bases.items() if at >= position]:
            del self.bases[key]


def _same_names(lmqs: Sequence[tuple[str, int]], other: Sequence[tuple[str, int]]) -> bool:
    for a, b in zip(lmqs, other, strict=True):
        if a[0] != b[0]:
            return False
    return True


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    n = data[pos]
    if n < 0x80:
        return n, pos + 1
    n &= 0x7F
    shift = 7
    while True:
        pos += 1
        b = data[pos]
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos + 1
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


#: (value, position after it) of the varint at ``pos``.
read_varint = _read_varint


def _varint2(n: int) -> bytes:
    """:func:`_varint` with the one- and two-byte cases inline."""
    if n < 0x80:
        return _BYTE[n]
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    return _varint(n)


def zigzag(n: int) -> int:
    """``n`` as an unsigned varint value (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...)."""
    return n << 1 if n >= 0 else (-n << 1) - 1


def unzigzag(n: int) -> int:
    return n >> 1 if not n & 1 else -((n + 1) >> 1)


def encode_shared(
    shared: SharedBases,
    base: Base,
    bits: int,
    parts: list[bytes],
    queue_id: int,
    queue_offset: int,
    store_timestamp_ms: int,
    delta: int,
    port: int,
    lmqs: Sequence[tuple[str, int]],
    body: bytes,
) -> bytes:
    """A SHARED record whose base is ``base`` (from :meth:`SharedBases.find`): ``parts`` holds the head's
    place and the EXT and BORN_ABS fields, ``bits`` their bits."""
    at, base_bits, base_offsets = base
    bits |= base_bits | SHARED
    parts.insert(1, _varint2(shared.position - at))
    n = len(lmqs)
    parts.append(_BYTE[n] if n < 0x80 else _varint(n))
    i = 0
    for _, offset in lmqs:  # (lmqs and base_offsets are as long: the same names)
        d = offset - base_offsets[i]  # > 0 in an append: its offsets come after its base's
        parts.append(_BYTE[d << 1] if 0 <= d < 0x40 else _varint(zigzag(d)))
        i += 1
    if 0 <= queue_offset <= _U32_MAX and 0 <= queue_id <= 0xFFFF and 0 <= store_timestamp_ms <= _MAX48:
        parts[0] = _HEAD.pack(
            KIND_COMPACT,
            bits,
            queue_id,
            queue_offset,
            store_timestamp_ms >> 32,
            store_timestamp_ms & _U32_MAX,
            delta,
            port,
        )
    else:
        parts[0] = _HEAD_WIDE.pack(
            KIND_COMPACT, bits | _WIDE, queue_id, queue_offset, store_timestamp_ms, delta, port
        )
    parts += (_varint2(len(body)), body)
    record = b"".join(parts)
    shared.position += len(record) + FRAME_HEADER_BYTES
    return record
