"""
mqproxy.codecs.message_record
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

The stored-message record format of RocketMQ (``MessageDecoder`` / commit-log layout), as carried in
pull/pop bodies, CHECK_TRANSACTION_STATE and CONSUME_MESSAGE_DIRECTLY; the properties string; the
SEND_BATCH_MESSAGE body; body decompression.

Record layout (big-endian): TOTALSIZE i32, MAGIC i32, BODYCRC i32, QUEUEID i32, FLAG i32,
QUEUEOFFSET i64, PHYSICALOFFSET i64, SYSFLAG i32, BORNTIMESTAMP i64, BORNHOST (4|16 bytes + i32 port),
STORETIMESTAMP i64, STOREHOST (4|16 + i32), RECONSUMETIMES i32, PREPARED_TRANSACTION_OFFSET i64,
BODYLEN i32 + body, TOPICLEN (i8 for V1 | i16 for V2) + topic, PROPERTIESLEN i16 + properties (the
properties string itself: :mod:`mqproxy.codecs.record_properties`).
"""

from __future__ import annotations

import functools
import ipaddress
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from mqproxy.codecs.record_properties import (
    MAX_PROPERTIES_BYTES,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    DroppedProperties,
    OnDropped,
    RecordError,
    decode_properties,
    encode_properties,
    fit_properties,
)
from mqproxy.model.ids import MessageIdError, pack_ip
from mqproxy.model.types import StoredMessage

__all__ = [
    "MAGIC_V1",
    "MAGIC_V2",
    "MAX_PROPERTIES_BYTES",
    "NAME_VALUE_SEPARATOR",
    "PROPERTY_SEPARATOR",
    "BatchEntry",
    "DecodedRecord",
    "DroppedProperties",
    "OnDropped",
    "RecordError",
    "body_crc",
    "decode_batch_body",
    "decode_properties",
    "decode_records",
    "decompress_body",
    "encode_batch_body",
    "encode_properties",
    "encode_record",
    "encode_records",
    "fit_properties",
]

#: Record magic with a 1-byte topic length (Java ``MESSAGE_MAGIC_CODE`` = -626843481).
MAGIC_V1 = 0xDAA320A7
#: Record magic with a 2-byte topic length (Java ``MESSAGE_MAGIC_CODE_V2`` = -626843477); C++ and
#: ali-ons cannot decode it.
MAGIC_V2 = 0xDAA320AB
#: Commit-log end-of-file filler; never valid in a pull body.
BLANK_MAGIC = 0xCBD43194

# MessageSysFlag bits
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_COMMIT = 0x8
SYSFLAG_TRANSACTION_ROLLBACK = 0xC
SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20
SYSFLAG_NEED_UNWRAP = 0x40
SYSFLAG_INNER_BATCH = 0x80
SYSFLAG_COMPRESSION_MASK = 0x700
COMPRESSION_LZ4 = 0x100
COMPRESSION_ZSTD = 0x200
COMPRESSION_ZLIB = 0x300

#: Longest topic a V1 record can carry; longer topics are always written with V2.
MAX_V1_TOPIC_BYTES = 127
#: Decompression output cap (a hostile zlib stream can expand ~1000x).
DEFAULT_MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_SYSFLAG_OFFSET = 36
#: Batch entry head: TOTALSIZE, MAGIC, BODYCRC, FLAG, BODYLEN.
_BATCH_HEAD = struct.Struct(">iiiii")


def _fixed_struct(born_ip_len: int, store_ip_len: int) -> struct.Struct:
    return struct.Struct(f">iIiiiqqiq{born_ip_len}siq{store_ip_len}siiqi")


#: The fixed part (TOTALSIZE .. BODYLEN) for each (born IP length, store IP length).
_FIXED = {(b, s): _fixed_struct(b, s) for b in (4, 16) for s in (4, 16)}
_MIN_RECORD = _FIXED[4, 4].size + 1 + 2


# --- records -----------------------------------------------------------------------------------------


def body_crc(body: bytes) -> int:
    """The BODYCRC field: CRC-32 of the stored body, masked to a non-negative i32."""
    return zlib.crc32(body) & 0x7FFFFFFF


@functools.lru_cache(maxsize=4096)
def _ipv4_only(ip: str) -> bytes:
    """A 4-byte address for clients that cannot read IPv6 hosts (IPv4-mapped -> IPv4, else 0.0.0.0)."""
    packed = pack_ip(ip)
    if len(packed) == 4:
        return packed
    if packed[:12] == b"\x00" * 10 + b"\xff\xff":
        return packed[12:]
    return b"\x00\x00\x00\x00"


def _host_ip(ip: str, legacy: bool) -> bytes:
    try:
        return _ipv4_only(ip) if legacy else pack_ip(ip)
    except MessageIdError as exc:
        raise RecordError("bad_host", str(exc)) from None


def _record_parts(
    msg: StoredMessage, magic: int, legacy: bool, on_dropped: OnDropped | None
) -> tuple[bytes, bytes, bytes]:
    topic = msg.topic.encode("utf-8")
    if magic == MAGIC_V1 and len(topic) > MAX_V1_TOPIC_BYTES:
        magic = MAGIC_V2
    props, dropped = fit_properties(msg.properties)
    if dropped is not None:
        if on_dropped is None:
            raise RecordError(
                "properties_too_long", f"{dropped.bytes_before} bytes of properties > {MAX_PROPERTIES_BYTES}"
            )
        on_dropped(msg, dropped)
    born_ip = _host_ip(msg.born_host[0], legacy)
    store_ip = _host_ip(msg.store_host[0], legacy)
    sys_flag = msg.sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    if len(born_ip) == 16:
        sys_flag |= SYSFLAG_BORNHOST_V6
    if len(store_ip) == 16:
        sys_flag |= SYSFLAG_STOREHOST_V6
    fixed = _FIXED[len(born_ip), len(store_ip)]
    body = msg.body
    if magic == MAGIC_V1:
        tail = b"".join((_U8.pack(len(topic)), topic, _I16.pack(len(props)), props))
    else:
        tail = b"".join((_I16.pack(len(topic)), topic, _I16.pack(len(props)), props))
    total = fixed.size + len(body) + len(tail)
    crc = msg.body_crc & 0x7FFFFFFF if msg.body_crc else body_crc(body)
    try:
        head = fixed.pack(
            total,
            magic,
            crc,
            msg.queue_id,
            msg.flag,
            msg.queue_offset,
            msg.commitlog_offset,
            sys_flag,
            msg.born_timestamp_ms,
            born_ip,
            msg.born_host[1],
            msg.store_timestamp_ms,
            store_ip,
            msg.store_host[1],
            msg.reconsume_times,
            0,
            len(body),
        )
    except struct.error as exc:
        raise RecordError("bad_record_field", str(exc)) from None
    return head, body, tail


def encode_record(
    msg: StoredMessage, *, magic: int = MAGIC_V1, legacy: bool = True, on_dropped: OnDropped | None = None
) -> bytes:
    """The full record for ``msg`` as it travels in pull bodies.

    ``magic`` is the preferred version; a topic longer than 127 bytes always gets V2 (as the Java broker
    does). Hosts: with ``legacy=True`` (the default) both are written as IPv4 (IPv4-mapped addresses
    unwrapped, other IPv6 addresses become 0.0.0.0), which every client decodes; C++ and ali-ons ignore
    the IPv6 sysFlag bits and would misread the record otherwise. With ``legacy=False`` (modern Java
    clients: their decoder reads both forms) IPv6 hosts are written as 16 bytes. The BORNHOST_V6 and
    STOREHOST_V6 sysFlag bits always match what is written. BODYCRC is ``msg.body_crc`` when non-zero,
    else computed. PREPARED_TRANSACTION_OFFSET is 0. A separator character inside a property key or
    value goes out as U+FFFD (see :func:`_outgoing_properties`). Properties over 32,767 bytes raise
    :class:`RecordError` ``properties_too_long`` unless ``on_dropped`` is given: then they are cut down by
    :func:`fit_properties` and ``on_dropped`` hears of each record cut (answers to clients pass one, so that
    no stored message fails the answer that carries it).
    """
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise ValueError(f"unknown record magic {magic:#x}")
    return b"".join(_record_parts(msg, magic, legacy, on_dropped))


def encode_records(
    msgs: Iterable[StoredMessage],
    *,
    magic: int = MAGIC_V1,
    legacy: bool = True,
    on_dropped: OnDropped | None = None,
) -> bytes:
    """The concatenated records of ``msgs`` (a pull/pop response body); see :func:`encode_record`."""
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise ValueError(f"unknown record magic {magic:#x}")
    parts: list[bytes] = []
    for msg in msgs:
        parts.extend(_record_parts(msg, magic, legacy, on_dropped))
    return b"".join(parts)


@functools.lru_cache(maxsize=4096)
def _ip_text(packed: bytes) -> str:
    return str(ipaddress.ip_address(packed))


@dataclass(slots=True)
class DecodedRecord:
    """One record read back from a pull body (every field of the wire layout)."""

    store_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    commitlog_offset: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: tuple[str, int]
    store_timestamp_ms: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]

    def to_stored_message(self) -> StoredMessage:
        return StoredMessage(
            topic=self.topic,
            queue_id=self.queue_id,
            queue_offset=self.queue_offset,
            commitlog_offset=self.commitlog_offset,
            store_size=self.store_size,
            body=self.body,
            flag=self.flag,
            properties=self.properties,
            sys_flag=self.sys_flag,
            born_timestamp_ms=self.born_timestamp_ms,
            born_host=self.born_host,
            store_timestamp_ms=self.store_timestamp_ms,
            store_host=self.store_host,
            reconsume_times=self.reconsume_times,
            body_crc=self.body_crc,
        )


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RecordError("bad_record_field", f"{what} is not valid UTF-8") from None


def decode_records(data: bytes | bytearray | memoryview) -> list[DecodedRecord]:
    """Every record of a pull body. Any truncation, bad size or bad magic raises :class:`RecordError`."""
    view = memoryview(data)
    end = len(view)
    records: list[DecodedRecord] = []
    pos = 0
    while pos < end:
        if end - pos < _MIN_RECORD:
            raise RecordError("truncated_record", f"{end - pos} bytes left at {pos}")
        (total,) = _I32.unpack_from(view, pos)
        (magic,) = _U32.unpack_from(view, pos + 4)
        if magic not in (MAGIC_V1, MAGIC_V2):
            raise RecordError("bad_magic", f"magic {magic:#010x} at {pos}")
        (sys_flag,) = _I32.unpack_from(view, pos + _SYSFLAG_OFFSET)
        fixed = _FIXED[
            16 if sys_flag & SYSFLAG_BORNHOST_V6 else 4,
            16 if sys_flag & SYSFLAG_STOREHOST_V6 else 4,
        ]
        if total < fixed.size + 3:
            raise RecordError("bad_record_size", f"record size {total} at {pos}")
        if total > end - pos:
            raise RecordError("truncated_record", f"record of {total} bytes, {end - pos} left at {pos}")
        stop = pos + total
        (
            _total,
            _magic,
            crc,
            queue_id,
            flag,
            queue_offset,
            commitlog_offset,
            _sys_flag,
            born_ts,
            born_ip,
            born_port,
            store_ts,
            store_ip,
            store_port,
            reconsume_times,
            prepared_offset,
            body_len,
        ) = fixed.unpack_from(view, pos)
        cur = pos + fixed.size
        if body_len < 0 or body_len > stop - cur:
            raise RecordError("bad_record_size", f"body length {body_len} past the record end")
        body = bytes(view[cur : cur + body_len])
        cur += body_len
        topic_len_size = 1 if magic == MAGIC_V1 else 2
        if stop - cur < topic_len_size + 2:
            raise RecordError("bad_record_size", "no room for topic and properties lengths")
        if magic == MAGIC_V1:
            topic_len = view[cur]
        else:
            (topic_len,) = _I16.unpack_from(view, cur)
        cur += topic_len_size
        if topic_len < 0 or topic_len > stop - cur - 2:
            raise RecordError("bad_record_size", f"topic length {topic_len} past the record end")
        topic = _text(bytes(view[cur : cur + topic_len]), "topic")
        cur += topic_len
        (props_len,) = _I16.unpack_from(view, cur)
        cur += 2
        if props_len < 0 or cur + props_len != stop:
            raise RecordError("bad_record_size", f"properties length {props_len} does not end the record")
        properties = decode_properties(_text(bytes(view[cur:stop]), "properties"))
        records.append(
            DecodedRecord(
                store_size=total,
                magic=magic,
                body_crc=crc,
                queue_id=queue_id,
                flag=flag,
                queue_offset=queue_offset,
                commitlog_offset=commitlog_offset,
                sys_flag=sys_flag,
                born_timestamp_ms=born_ts,
                born_host=(_ip_text(born_ip), born_port),
                store_timestamp_ms=store_ts,
                store_host=(_ip_text(store_ip), store_port),
                reconsume_times=reconsume_times,
                prepared_transaction_offset=prepared_offset,
                body=body,
                topic=topic,
                properties=properties,
            )
        )
        pos = stop
    return records


# --- SEND_BATCH_MESSAGE body -------------------------------------------------------------------------


@dataclass(slots=True)
class BatchEntry:
    """One inner message of a SEND_BATCH_MESSAGE body."""

    body: bytes
    flag: int
    properties: dict[str, str]


def decode_batch_body(body: bytes | bytearray | memoryview) -> list[BatchEntry]:
    """The inner messages of a batch body: each ``TOTALSIZE i32, MAGIC i32, BODYCRC i32, FLAG i32,
    BODYLEN i32 + body, PROPLEN i16 + properties``. TOTALSIZE, MAGIC and BODYCRC are not checked (the Java
    broker ignores them); any length running past the end raises :class:`RecordError`
    ``truncated_batch``."""
    view = memoryview(body)
    end = len(view)
    entries: list[BatchEntry] = []
    pos = 0
    while pos < end:
        if end - pos < _BATCH_HEAD.size:
            raise RecordError("truncated_batch", f"{end - pos} bytes left at {pos}")
        _total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(view, pos)
        pos += _BATCH_HEAD.size
        if body_len < 0 or body_len > end - pos - 2:
            raise RecordError("truncated_batch", f"body length {body_len} past the end")
        inner = bytes(view[pos : pos + body_len])
        pos += body_len
        (props_len,) = _I16.unpack_from(view, pos)
        pos += 2
        if props_len < 0 or props_len > end - pos:
            raise RecordError("truncated_batch", f"properties length {props_len} past the end")
        try:
            text = bytes(view[pos : pos + props_len]).decode("utf-8")
        except UnicodeDecodeError:
            raise RecordError("bad_properties", "batch entry properties are not valid UTF-8") from None
        pos += props_len
        entries.append(BatchEntry(inner, flag, decode_properties(text)))
    return entries


def encode_batch_body(entries: Iterable[BatchEntry]) -> bytes:
    """The batch body for ``entries``, as the Java client builds it (MAGIC and BODYCRC are 0)."""
    parts: list[bytes] = []
    for entry in entries:
        props = encode_properties(entry.properties).encode("utf-8")
        if len(props) > MAX_PROPERTIES_BYTES:
            raise RecordError("properties_too_long", f"{len(props)} bytes of properties")
        total = _BATCH_HEAD.size + len(entry.body) + 2 + len(props)
        try:
            head = _BATCH_HEAD.pack(total, 0, 0, entry.flag, len(entry.body))
        except struct.error as exc:
            raise RecordError("bad_record_field", str(exc)) from None
        parts += (head, entry.body, _I16.pack(len(props)), props)
    return b"".join(parts)


# --- compression -------------------------------------------------------------------------------------


def decompress_body(body: bytes, sys_flag: int, *, max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> bytes:
    """``body`` inflated when ``sys_flag`` has COMPRESSED, else ``body`` unchanged.

    Only zlib (type 3, or type 0 = legacy zlib) is supported; LZ4 (1) and ZSTD (2) need packages outside
    the standard library and raise :class:`RecordError` ``unsupported_compression``. Output larger than
    ``max_bytes`` raises ``decompressed_too_large``; a corrupt stream ``bad_compressed_body``.
    """
    if not sys_flag & SYSFLAG_COMPRESSED:
        return body
    kind = sys_flag & SYSFLAG_COMPRESSION_MASK
    if kind not in (0, COMPRESSION_ZLIB):
        name = {COMPRESSION_LZ4: "lz4", COMPRESSION_ZSTD: "zstd"}.get(kind, f"type {kind >> 8}")
        raise RecordError("unsupported_compression", f"{name} bodies cannot be decompressed")
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(body, max_bytes)
    except zlib.error as exc:
        raise RecordError("bad_compressed_body", str(exc)) from None
    if inflater.unconsumed_tail:
        raise RecordError("decompressed_too_large", f"body inflates past {max_bytes} bytes")
    if not inflater.eof:
        raise RecordError("bad_compressed_body", "truncated zlib stream")
    return out
