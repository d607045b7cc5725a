"""Reading SHARED compact records: a record that takes its born host, topic, LMQ names and properties from
its base, an earlier record of the same append (layout: :mod:`~mqproxy.backends.embedded.record_compact`).

:func:`decode_shared` needs where the record is and a :class:`BaseSource` to read the base from (the commit
log, or during recovery the records just scanned). The base's shared fields are cached by the base's bytes,
so a pull of a batch parses its base once.
"""

from __future__ import annotations

import struct
import zlib
from itertools import islice
from typing import Protocol

from mqproxy.backends.embedded.record_compact import PROPERTY_CODES, Fields, decode_compact
from mqproxy.backends.embedded.record_layout import (
    BORN_ABS,
    EXT,
    EXT_FIELDS,
    HEAD,
    HEAD_WIDE,
    IPV4,
    KIND_COMPACT,
    LMQ_PROPS,
    SHARED,
    SHARED_KEY_BITS,
    WIDE,
    read_varint,
    unzigzag,
)
from mqproxy.model.types import PROPERTY_INNER_MULTI_DISPATCH, PROPERTY_INNER_MULTI_QUEUE_OFFSET

_Q = struct.Struct(">q")
_I = struct.Struct(">I")
_CACHE_LIMIT = 64
#: A base's shared fields: born host, topic, LMQ names, stored properties (the derived LMQ ones left
#: out), bits, LMQ offsets.
_Base = tuple[str, str, tuple[str, ...], dict[str, str], int, tuple[int, ...]]
_BASES: dict[bytes, _Base] = {}


class BaseSource(Protocol):
    """Where a SHARED record's base is read from."""

    def payload_at(self, offset: int) -> bytes:
        """The payload of the record whose frame starts at commit-log ``offset`` (raises
        :class:`~mqproxy.model.errors.StoreUnavailable` when none does)."""
        ...


def is_shared(payload: bytes) -> bool:
    return len(payload) > 1 and payload[0] == KIND_COMPACT and bool(payload[1] & SHARED)


def _base_fields(base: bytes) -> _Base:
    found = _BASES.get(base)
    if found is None:
        if not base or base[0] != KIND_COMPACT or base[1] & SHARED:
            raise ValueError("the base of a shared record is not a plain compact record")
        fields = decode_compact(base)
        properties = fields[11]
        if base[1] & LMQ_PROPS:  # the derived two come last; each record appends its own
            properties = dict(islice(properties.items(), len(properties) - 2))
        names = tuple(name for name, _ in fields[10])
        found = (fields[8][0], fields[9], names, properties, base[1], tuple(o for _, o in fields[10]))
        if len(_BASES) >= _CACHE_LIMIT:
            _BASES.clear()
        _BASES[bytes(base)] = found
    return found


def decode_shared(payload: bytes, offset: int, source: BaseSource | None) -> Fields:
    """The fields of the SHARED record at commit-log ``offset`` (raises ValueError, IndexError,
    struct.error, UnicodeDecodeError or OSError when it is malformed, and ValueError without a source)."""
    bits = payload[1]
    if bits & WIDE:
        _, _, queue_id, queue_offset, store_ts, delta, port = HEAD_WIDE.unpack_from(payload, 0)
        pos = HEAD_WIDE.size
    else:
        _, _, queue_id, queue_offset, ts_high, ts_low, delta, port = HEAD.unpack_from(payload, 0)
        store_ts = ts_high << 32 | ts_low
        pos = HEAD.size
    back, pos = read_varint(payload, pos)
    if source is None or not 0 < back <= offset:
        raise ValueError("a shared record is read with the log holding its base")
    host, topic, names, base_properties, base_bits, base_offsets = _base_fields(
        source.payload_at(offset - back)
    )
    if (base_bits ^ bits) & SHARED_KEY_BITS:
        raise ValueError("a shared record and its base disagree on their layout")
    flag = sys_flag = reconsume = 0
    if bits & EXT:
        flag, sys_flag, reconsume = EXT_FIELDS.unpack_from(payload, pos)
        pos += EXT_FIELDS.size
    if bits & BORN_ABS:
        (born_ts,) = _Q.unpack_from(payload, pos)
        pos += 8
    else:
        born_ts = store_ts + delta
    count, pos = read_varint(payload, pos)
    if count != len(names):
        raise ValueError("a shared record's LMQ count differs from its base's")
    offsets = []
    for base_offset in base_offsets:
        d, pos = read_varint(payload, pos)
        offsets.append(base_offset + unzigzag(d))
    properties = dict(base_properties)
    if bits & LMQ_PROPS:
        properties[PROPERTY_INNER_MULTI_DISPATCH] = ",".join(names)
        properties[PROPERTY_INNER_MULTI_QUEUE_OFFSET] = ",".join(str(o) for o in offsets)
    n, pos = read_varint(payload, pos)
    if pos + n != len(payload):
        raise ValueError("record length mismatch")
    body = payload[pos:] if type(payload) is bytes else bytes(payload[pos:])
    return (
        queue_id,
        queue_offset,
        flag,
        sys_flag,
        born_ts,
        store_ts,
        reconsume,
        zlib.crc32(body) & 0x7FFFFFFF,
        (host, port),
        topic,
        tuple(zip(names, offsets, strict=True)),
        properties,
        body,
    )


def own_sizes(payload: bytes) -> dict[str, int]:
    """Bytes of a SHARED record's own sections besides its header: the base reference and the LMQ
    offsets (for ``bench/disk_bytes.py``)."""
    pos = HEAD_WIDE.size if payload[1] & WIDE else HEAD.size
    _, after = read_varint(payload, pos)
    out = {"base reference": after - pos}
    pos = after + (EXT_FIELDS.size if payload[1] & EXT else 0) + (8 if payload[1] & BORN_ABS else 0)
    count, pos = read_varint(payload, pos)
    start = pos
    for _ in range(count):
        _, pos = read_varint(payload, pos)
    out["LMQ list"] = pos - start
    return out


def property_sizes(payload: bytes) -> dict[str, int]:
    """Bytes each stored property of a kind 3 record without SHARED takes (key code or key, value and
    their lengths), by key (for ``bench/disk_bytes.py``; derived ones are not stored and not listed)."""
    pos = HEAD_WIDE.size if payload[1] & WIDE else HEAD.size
    offset_size = 8 if payload[1] & WIDE else 4
    pos += (EXT_FIELDS.size if payload[1] & EXT else 0) + (8 if payload[1] & BORN_ABS else 0)
    pos += 4 if payload[1] & IPV4 else 1 + payload[pos]
    pos += 1 + payload[pos]
    count, pos = read_varint(payload, pos)
    for _ in range(count):
        pos += 1 + payload[pos] + offset_size
    size, pos = read_varint(payload, pos)
    end = pos + size
    out: dict[str, int] = {}
    while pos < end:
        start = pos
        code = payload[pos]
        pos += 1
        if code:
            key = PROPERTY_CODES[code]
        else:
            n, pos = read_varint(payload, pos)
            key = payload[pos : pos + n].decode()
            pos += n
        n, pos = read_varint(payload, pos)
        pos += n
        out[key] = pos - start
    return out
