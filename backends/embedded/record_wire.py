"""A stored compact record (kind 3, :mod:`~mqproxy.backends.embedded.record_compact`) straight to the V1
record a remoting pull body carries, without decoding it into a message first.

:func:`compact_to_v1` gives, byte for byte, what ``encode_record(_stored(decode_message(payload)),
legacy=True)`` gives (:mod:`mqproxy.codecs.message_record`) for the records a drain reads: a kind 3 payload
(not SHARED) with an IPv4 born host, no LMQ, a topic of at most 127 bytes, properties that are plain
``key\\x01value\\x02`` text of at most 32,767 bytes. Anything else answers None and the caller takes the
general path, which also raises what it raises; over-long properties (an MQTT topic near 32 KB and its LMQ
properties) are cut down there, by the remoting answer's encoder, which logs what it left out
(``remoting.properties_dropped``).
Property values are copied as stored (UTF-8): no string is built per property; a property with an empty
value is left out, as the encoder does.
"""

from __future__ import annotations

import socket
import struct
import zlib
from typing import Final

from mqproxy.backends.embedded.record_compact import KIND_COMPACT, PROPERTY_CODES
from mqproxy.backends.embedded.record_layout import SHARED
from mqproxy.backends.embedded.record_layout import _read_varint as _varint
from mqproxy.codecs.message_record import MAGIC_V1, MAX_PROPERTIES_BYTES, MAX_V1_TOPIC_BYTES

__all__ = ["compact_to_v1", "ipv4_bytes"]

_EXT, _BORN_ABS, _IPV4, _WIDE = 1, 2, 4, 16
_HEAD: Final = struct.Struct(">BBHIHIhH")
_HEAD_WIDE: Final = struct.Struct(">BBiqqhH")
_EXT_FIELDS: Final = struct.Struct(">iii")
_Q: Final = struct.Struct(">q")
#: TOTALSIZE .. BODYLEN of a V1 record with IPv4 hosts (see ``message_record._fixed_struct``).
_FIXED: Final = struct.Struct(">iIiiiqqiq4siq4siiqi")
#: sysFlag bits BORNHOST_V6 and STOREHOST_V6: never set with 4-byte hosts.
_HOSTS_V6: Final = 0x10 | 0x20
#: ``key\x01`` for each key code (index 0 unused: the key is stored).
_KEY_PREFIX: Final = tuple(key.encode() + b"\x01" for key in PROPERTY_CODES)


def ipv4_bytes(host: str) -> bytes | None:
    """The 4 bytes of a dotted-quad ``host`` that reads back as exactly ``host``, else None."""
    try:
        packed = socket.inet_aton(host)
    except (OSError, UnicodeEncodeError, ValueError):
        return None
    return packed if socket.inet_ntoa(packed) == host else None


def compact_to_v1(
    payload: bytes,
    commitlog_offset: int,
    store_host: bytes,
    store_port: int,
    queue_offset: int | None = None,
    topic: bytes = b"",
) -> bytes | None:
    """The V1 record of the kind 3 ``payload`` stored at ``commitlog_offset`` (the offset that names it),
    with ``store_host`` (4 address bytes) and ``store_port``; ``queue_offset`` replaces the stored one
    when the record's topic is ``topic`` (an entry a rewrite moved). None when the record is not one this
    fast path covers (see the module text) or is malformed: the caller decodes it instead."""
    if len(payload) < 2 or payload[0] != KIND_COMPACT or payload[1] & SHARED or len(store_host) != 4:
        return None  # a SHARED record's fields are its base's: the general path reads them
    try:
        return _transcode(payload, commitlog_offset, store_host, store_port, queue_offset, topic)
    except (ValueError, IndexError, struct.error):
        return None


def _transcode(
    payload: bytes,
    commitlog_offset: int,
    store_host: bytes,
    store_port: int,
    queue_offset: int | None,
    wanted_topic: bytes,
) -> bytes | None:
    bits = payload[1]
    if not bits & _IPV4:
        return None
    if bits & _WIDE:
        _, _, queue_id, stored_offset, store_ts, delta, port = _HEAD_WIDE.unpack_from(payload, 0)
        pos = _HEAD_WIDE.size
    else:
        _, _, queue_id, stored_offset, ts_high, ts_low, delta, port = _HEAD.unpack_from(payload, 0)
        store_ts = ts_high << 32 | ts_low
        pos = _HEAD.size
    flag = sys_flag = reconsume = 0
    if bits & _EXT:
        flag, sys_flag, reconsume = _EXT_FIELDS.unpack_from(payload, pos)
        pos += _EXT_FIELDS.size
    if bits & _BORN_ABS:
        (born_ts,) = _Q.unpack_from(payload, pos)
        pos += 8
    else:
        born_ts = store_ts + delta
    born_ip = payload[pos : pos + 4]
    pos += 4
    n = payload[pos]
    topic = payload[pos + 1 : pos + 1 + n]
    pos += 1 + n
    if n > MAX_V1_TOPIC_BYTES or payload[pos] != 0:  # a long topic (V2) or LMQs: the general path
        return None
    pos += 1
    size, pos = _varint(payload, pos)
    end = pos + size
    if end > len(payload):
        return None
    parts: list[bytes] = []
    keys = _KEY_PREFIX
    while pos < end:
        code = payload[pos]
        if code:
            key = keys[code]
            pos += 1
        else:
            n, pos = _varint(payload, pos + 1)
            if n == 0:  # an empty key: the encoder refuses it
                return None
            key = payload[pos : pos + n] + b"\x01"
            pos += n
        n = payload[pos]
        if n < 0x80:
            pos += 1
        else:
            n, pos = _varint(payload, pos)
        if n:
            parts += (key, payload[pos : pos + n], b"\x02")
        pos += n
    if pos != end:
        return None
    props = b"".join(parts)
    pairs = len(parts) // 3
    if len(props) > MAX_PROPERTIES_BYTES or props.count(b"\x01") != pairs or props.count(b"\x02") != pairs:
        return None
    n = payload[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = _varint(payload, pos)
    if pos + n != len(payload):
        return None
    body = payload[pos:]
    total = _FIXED.size + n + 1 + len(topic) + 2 + len(props)
    head = _FIXED.pack(
        total,
        MAGIC_V1,
        zlib.crc32(body) & 0x7FFFFFFF,
        queue_id,
        flag,
        stored_offset if queue_offset is None or topic != wanted_topic else queue_offset,
        commitlog_offset,
        sys_flag & ~_HOSTS_V6,
        born_ts,
        born_ip,
        port,
        store_ts,
        store_host,
        store_port,
        reconsume,
        0,
        n,
    )
    return b"".join((head, body, bytes((len(topic),)), topic, len(props).to_bytes(2, "big"), props))
