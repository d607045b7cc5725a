"""The value of one consume-queue row in the index (``cq``): where the message's record is, its tag hash and
store time.

Two layouts, told apart by length (both are read; :func:`pack_entry` writes the short one whenever the
numbers fit, issue 18):

* 16 B ``>HIIHI``: commit-log offset (48 bits, high 16 then low 32), frame size, store time ms (48 bits,
  high 16 then low 32); the tag hash is 0. 20 B: the same followed by ``>I`` tag hash.
* 24 B ``>qIIq`` (commit-log offset, frame size, tag hash, store time ms): written before issue 18, and
  still for numbers the short one cannot hold (an offset or time beyond 48 bits, or a negative one).
"""

from __future__ import annotations

import struct

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
