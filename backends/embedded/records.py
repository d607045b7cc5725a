"""The embedded store's message record: the payload inside one commit-log frame.

This is the store's own format, not the remoting wire record (codecs re-encode for pull bodies).
All integers big-endian::

    >B   kind (1 = message)
    >i   queue_id            >q  queue_offset
    >i   flag                >i  sys_flag
    >q   born_timestamp_ms   >q  store_timestamp_ms
    >i   reconsume_times     >I  body_crc (crc32 & 0x7FFFFFFF, as RocketMQ reports it)
    >B   born host length, host (UTF-8), >H born port
    >H   topic length, topic (ASCII)
    >H   LMQ count, then per LMQ: >B name length, name, >q LMQ queue offset
    >I   properties length, properties (orjson object of str -> str)
    >I   body length, body

The LMQ list is explicit (not read back from properties) so recovery re-dispatches exactly the
queue offsets assigned at append time.

A record retention moved to the head of the log (kind 2, :func:`encode_moved`) wraps the original
payload: ``>B 2``, ``>q`` commit-log offset the record was first written at (its identity: message ids
and the "newest record" of compaction keep using it), ``>q`` offset it was moved from (the same, or an
earlier copy), ``>H`` entry count, then per index entry that pointed at it ``>H`` queue-name key length,
key, ``>q`` queue offset; then the original payload. :func:`decode_message` reads through the wrapper,
so a moved message reads exactly as before.

Since issue 18 new messages are written as the compact kind 3 record of
:mod:`~mqproxy.backends.embedded.record_compact`; kind 1 records are still read. A SHARED compact record
(one that takes most fields from an earlier record of its append) is read with its commit-log offset and
a :class:`~mqproxy.backends.embedded.record_shared.BaseSource`; retention copies it whole
(:func:`expand_shared`), never wrapped as it is.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from mqproxy.backends.embedded.record_compact import decode_compact, encode_message
from mqproxy.backends.embedded.record_layout import IPV4, KIND_COMPACT, LMQ_SHORT, SHARED, SharedBases
from mqproxy.backends.embedded.record_shared import BaseSource, decode_shared, own_sizes, property_sizes
from mqproxy.model.errors import StoreUnavailable

KIND_MESSAGE = 1
KIND_MOVED = 2
__all__ = [
    "KIND_COMPACT",
    "KIND_MESSAGE",
    "KIND_MOVED",
    "BaseSource",
    "MessageRecord",
    "MovedRecord",
    "SharedBases",
    "body_crc",
    "decode_message",
    "decode_moved",
    "decode_stored",
    "encode_message",
    "encode_moved",
    "expand_shared",
    "layout",
]
_FIXED = struct.Struct(">BiqiiqqiI")
_H = struct.Struct(">H")
_I = struct.Struct(">I")
_Q = struct.Struct(">q")


@dataclass(slots=True, frozen=True)
class MessageRecord:
    queue_id: int
    queue_offset: int
    flag: int
    sys_flag: int
    born_timestamp_ms: int
    store_timestamp_ms: int
    reconsume_times: int
    body_crc: int
    born_host: tuple[str, int]
    topic: str
    lmqs: tuple[tuple[str, int], ...]
    properties: Mapping[str, str]
    body: bytes


def body_crc(body: bytes) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


@dataclass(slots=True, frozen=True)
class MovedRecord:
    """A record retention moved: where it came from, the index entries (queue key, queue offset) that
    pointed at it then, and the original payload."""

    original: int
    moved_from: int
    targets: tuple[tuple[bytes, int], ...]
    payload: bytes


def encode_moved(moved_from: int, targets: Sequence[tuple[bytes, int]], payload: bytes) -> bytes:
    """Wrap the record read at ``moved_from`` (itself possibly a copy) for its new place at the log's
    head."""
    inner = decode_moved(payload)
    original = payload if inner is None else inner.payload
    first = moved_from if inner is None else inner.original
    parts = [bytes((KIND_MOVED,)), _Q.pack(first), _Q.pack(moved_from), _H.pack(len(targets))]
    for key, offset in targets:
        parts += (_H.pack(len(key)), key, _Q.pack(offset))
    parts.append(original)
    return b"".join(parts)


def decode_moved(payload: bytes) -> MovedRecord | None:
    """The wrapper of a moved record, or None for a plain message record."""
    if not payload or payload[0] != KIND_MOVED:
        return None
    try:
        (original,) = _Q.unpack_from(payload, 1)
        (moved_from,) = _Q.unpack_from(payload, 9)
        (count,) = _H.unpack_from(payload, 17)
        pos = 19
        targets = []
        for _ in range(count):
            (n,) = _H.unpack_from(payload, pos)
            key = bytes(payload[pos + 2 : pos + 2 + n])
            (offset,) = _Q.unpack_from(payload, pos + 2 + n)
            targets.append((key, offset))
            pos += 2 + n + 8
    except struct.error as exc:
        raise StoreUnavailable(f"malformed moved record: {exc}") from None
    return MovedRecord(original, moved_from, tuple(targets), bytes(payload[pos:]))


def decode_stored(payload: bytes, offset: int, source: BaseSource | None = None) -> tuple[MessageRecord, int]:
    """The message in the record at commit-log ``offset`` and the offset that names it: where it was first
    written (a copy retention moved keeps its original identity)."""
    moved = decode_moved(payload)
    if moved is None:
        return decode_message(payload, offset, source), offset
    return decode_message(moved.payload), moved.original


def decode_message(payload: bytes, offset: int = -1, source: BaseSource | None = None) -> MessageRecord:
    """Decode a payload whose frame CRC already matched (reading through a moved record's wrapper);
    raise StoreUnavailable if it is malformed. A SHARED record needs its commit-log ``offset`` and the
    ``source`` of its base."""
    moved = decode_moved(payload)
    if moved is not None:
        payload = moved.payload
    if payload and payload[0] == KIND_COMPACT:
        try:
            if payload[1] & SHARED:
                fields = decode_shared(payload, offset if moved is None else -1, source)
            else:
                fields = decode_compact(payload)
        except (ValueError, IndexError, struct.error, UnicodeDecodeError, OSError) as exc:
            raise StoreUnavailable(f"malformed commit-log record: {exc}") from None
        return MessageRecord(*fields)
    try:
        (kind, queue_id, queue_offset, flag, sys_flag, born_ts, store_ts, reconsume, crc) = (
            _FIXED.unpack_from(payload, 0)
        )
        if kind != KIND_MESSAGE:
            raise ValueError(f"unknown record kind {kind}")
        pos = _FIXED.size
        n = payload[pos]
        host = payload[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
        (port,) = _H.unpack_from(payload, pos)
        (n,) = _H.unpack_from(payload, pos + 2)
        pos += 4
        topic = payload[pos : pos + n].decode()
        pos += n
        (count,) = _H.unpack_from(payload, pos)
        pos += 2
        lmqs = []
        for _ in range(count):
            n = payload[pos]
            name = payload[pos + 1 : pos + 1 + n].decode()
            pos += 1 + n
            lmqs.append((name, _Q.unpack_from(payload, pos)[0]))
            pos += 8
        (n,) = _I.unpack_from(payload, pos)
        properties = orjson.loads(payload[pos + 4 : pos + 4 + n])
        pos += 4 + n
        (n,) = _I.unpack_from(payload, pos)
        body = payload[pos + 4 : pos + 4 + n]
        if pos + 4 + n != len(payload) or len(body) != n:
            raise ValueError("record length mismatch")
    except (ValueError, IndexError, struct.error, UnicodeDecodeError, orjson.JSONDecodeError) as exc:
        raise StoreUnavailable(f"malformed commit-log record: {exc}") from None
    return MessageRecord(
        queue_id=queue_id,
        queue_offset=queue_offset,
        flag=flag,
        sys_flag=sys_flag,
        born_timestamp_ms=born_ts,
        store_timestamp_ms=store_ts,
        reconsume_times=reconsume,
        body_crc=crc,
        born_host=(host, port),
        topic=topic,
        lmqs=tuple(lmqs),
        properties=properties,
        body=bytes(body),
    )


def expand_shared(payload: bytes, offset: int, source: BaseSource) -> bytes:
    """The record at ``offset`` written whole (without SHARED): what retention copies, since its base may
    not outlive it. Other records come back as they are."""
    if not payload or payload[0] != KIND_COMPACT or not payload[1] & SHARED:
        return payload
    r = decode_message(payload, offset, source)
    return encode_message(
        topic=r.topic,
        queue_id=r.queue_id,
        queue_offset=r.queue_offset,
        flag=r.flag,
        sys_flag=r.sys_flag,
        born_timestamp_ms=r.born_timestamp_ms,
        store_timestamp_ms=r.store_timestamp_ms,
        reconsume_times=r.reconsume_times,
        born_host=r.born_host,
        lmqs=r.lmqs,
        properties=r.properties,
        body=r.body,
    )


def layout(payload: bytes, offset: int = -1, source: BaseSource | None = None) -> dict[str, int]:
    """Bytes of each section of a stored record (for ``bench/disk_bytes.py``): record header (fixed fields
    and length prefixes), born host, topic, LMQ list, each stored property by key, body; a moved record's
    wrapper counts as ``moved wrapper``, a SHARED record's reference to its base as ``base reference``."""
    out: dict[str, int] = {}
    moved = decode_moved(payload)
    if moved is not None:
        out["moved wrapper"] = len(payload) - len(moved.payload)
        payload = moved.payload
    record = decode_message(payload, offset, source)
    compact = payload[0] == KIND_COMPACT
    if compact and payload[1] & SHARED:
        out.update(own_sizes(payload))
        out["body"] = len(record.body)
        out["record header (fixed fields, lengths)"] = len(payload) - sum(out.values())
        return out
    sections = property_sizes(payload) if compact else _v1_property_sizes(record.properties)
    for key, size in sections.items():
        out[f"property {key}"] = size
    host = 4 if compact and payload[1] & IPV4 else len(record.born_host[0].encode())
    topic = len(record.topic.encode())
    if compact:
        lmqs = sum(1 + len(name.encode()) + 4 for name, _ in record.lmqs)
        if payload[1] & LMQ_SHORT:  # names without %LMQ%
            lmqs -= 5 * len(record.lmqs)
    else:
        lmqs = sum(1 + len(name.encode()) + 8 for name, _ in record.lmqs)
    out["born host"] = host
    out["topic"] = topic
    out["LMQ list"] = lmqs
    out["body"] = len(record.body)
    out["record header (fixed fields, lengths)"] = len(payload) - sum(out.values())
    return out


def _v1_property_sizes(properties: Mapping[str, str]) -> dict[str, int]:
    """Bytes of each property in a kind 1 record's JSON object ('"k":"v"' and a comma or brace)."""
    return {key: len(orjson.dumps({key: value})) - 1 for key, value in properties.items()}
