"""The compact message record of the embedded store's commit log (kind 3, since issue 18).

:func:`encode_message` writes it; :func:`~mqproxy.backends.embedded.records.decode_message` reads it and
the older kind 1 records. All integers big-endian::

    >B   kind (3)            >B  bits (below)
    >H   queue_id            >I  queue_offset      >HI store_timestamp_ms (48 bits)
         (WIDE: >i queue_id, >q queue_offset, >q store_timestamp_ms)
    >h   born_timestamp_ms - store_timestamp_ms (0 with BORN_ABS)   >H born port
    [EXT: >i flag, >i sys_flag, >i reconsume_times]   [BORN_ABS: >q born_timestamp_ms]
    born host: IPV4: 4 address bytes; else >B length, host (UTF-8)
    >B   topic length, topic (ASCII)
    varint LMQ count, then per LMQ: >B name length, name (without ``%LMQ%`` with LMQ_SHORT),
         >I LMQ queue offset (>q with WIDE)
    varint properties length, then per property: >B key code (:data:`PROPERTY_CODES`; 0: varint key
         length, key), varint value length, value (UTF-8)
    varint body length, body (the record ends there)

Varints are unsigned LEB128. Bits: EXT 1 (flag, sys_flag or reconsume_times is not 0), BORN_ABS 2 (the
born time does not fit the delta), IPV4 4 (a dotted quad that reads back as given), LMQ_PROPS 8
(``INNER_MULTI_DISPATCH`` and ``INNER_MULTI_QUEUE_OFFSET`` are not stored: they were the last two
properties and equal to the LMQ list joined by commas, and are appended again when read), WIDE 16 (an
offset does not fit 32 bits, the queue id 16 bits or the store time 48 bits), LMQ_SHORT 32 (every LMQ
name starts with ``%LMQ%``), SHARED 64 (below). The body CRC is not stored (the frame CRC covers the body):
it is computed when read. What is read back equals what was given, property order included.

A SHARED record (since issue 18's round 4) holds only what is its own; its born host, topic, LMQ names and
properties (and the IPV4, LMQ_SHORT, LMQ_PROPS bits) are those of its *base*, a record without SHARED
of at most ``record_layout.MAX_BASE_BYTES`` written earlier in the same append (so in the same segment,
before it: a torn write cuts the record with or after its base, and retention deletes them together)::

    header as above (SHARED set; WIDE only for its own fields)
    varint back: this frame's offset - the base frame's offset    [EXT]   [BORN_ABS]
    varint LMQ count (the base's), then per LMQ: varint zigzag(LMQ queue offset - the base's)
    varint body length, body

:mod:`~mqproxy.backends.embedded.record_shared` reads it, given the log to fetch the base from.
"""

from __future__ import annotations

import socket
import zlib
from collections.abc import Mapping, Sequence
from itertools import islice

from mqproxy.backends.embedded.record_layout import (
    _BORN_ABS,
    _BYTE,
    _EXT,
    _EXT_FIELDS,
    _HEAD,
    _HEAD_WIDE,
    _I,
    _IPV4,
    _LMQ_PROPS,
    _LMQ_SHORT,
    _MAX48,
    _Q,
    _U32_MAX,
    _WIDE,
    FRAME_HEADER_BYTES,
    KIND_COMPACT,
    SHARED,
    SharedBases,
    _read_varint,
    _varint,
    encode_shared,
)
from mqproxy.model.topics import LMQ_PREFIX
from mqproxy.model.types import PROPERTY_INNER_MULTI_DISPATCH, PROPERTY_INNER_MULTI_QUEUE_OFFSET

#: Key codes of the compact record's properties: code i stands for ``PROPERTY_CODES[i]`` (0: the key is
#: stored). Part of the on-disk format: append only, never reorder.
PROPERTY_CODES: tuple[str, ...] = (
    "",
    "MQTT_TOPIC",
    "MQTT_QOS",
    "MQTT_CLIENT_ID",
    "MQTT_RETAIN",
    "MQTT5_PROPS",
    "UNIQ_KEY",
    "KEYS",
    "TAGS",
    "WAIT",
    "DELAY",
    "TRAN_MSG",
    "PGROUP",
    "REAL_TOPIC",
    "REAL_QID",
    "RETRY_TOPIC",
    "ORIGIN_MESSAGE_ID",
    PROPERTY_INNER_MULTI_DISPATCH,
    PROPERTY_INNER_MULTI_QUEUE_OFFSET,
    "MIN_OFFSET",
    "MAX_OFFSET",
    "RECONSUME_TIME",
    "TRACE_ON",
    "MSG_REGION",
    "TIMER_DELIVER_MS",
    "TIMER_DELAY_SEC",
    "TIMER_DELAY_MS",
    "TRAN_PREPARED_QUEUE_OFFSET",
    "POP_CK",
    "TRANSACTION_CHECK_TIMES",
)
_CODE_OF = {key: bytes((code,)) for code, key in enumerate(PROPERTY_CODES) if code}
_LMQ_PREFIX_LEN = len(LMQ_PREFIX)
_IPV4_CACHE: dict[str, bytes | None] = {}


_NTOA_CACHE: dict[bytes, str] = {}


def _ntoa(packed: bytes) -> str:
    host = socket.inet_ntoa(packed)
    if len(_NTOA_CACHE) >= 4096:
        _NTOA_CACHE.clear()
    _NTOA_CACHE[bytes(packed)] = host
    return host


def _ipv4(host: str) -> bytes | None:
    """The 4 bytes of a dotted-quad address that reads back as exactly ``host``, else None."""
    packed = _IPV4_CACHE.get(host, b"")
    if packed != b"":
        return packed
    try:
        packed = socket.inet_aton(host)
        if socket.inet_ntoa(packed) != host:
            packed = None
    except (OSError, UnicodeEncodeError, ValueError):
        packed = None
    if len(_IPV4_CACHE) >= 4096:
        _IPV4_CACHE.clear()
    _IPV4_CACHE[host] = packed
    return packed


#: Properties whose encoded (key, value) item is cached: values that repeat across messages.
_CACHED_KEYS = frozenset(
    ("MQTT_TOPIC", "MQTT_QOS", "MQTT_CLIENT_ID", "MQTT_RETAIN", "TAGS", "WAIT", "PGROUP")
)
_CACHE_LIMIT = 4096
_ITEM_CACHE: dict[tuple[str, str], bytes] = {}
_LMQ_CACHE: dict[str, tuple[bytes, bool]] = {}


def _item(key: str, value: str) -> bytes:
    """One encoded property: key code (or 0 and the key), value length, value."""
    code = _CODE_OF.get(key)
    value_b = value.encode()
    if code is None:
        key_b = key.encode()
        return b"".join((b"\x00", _varint(len(key_b)), key_b, _varint(len(value_b)), value_b))
    return b"".join((code, _varint(len(value_b)), value_b))


def _lmq_name(name: str) -> tuple[bytes, bool]:
    """(length-prefixed name bytes, whether ``%LMQ%`` was left out)."""
    cached = _LMQ_CACHE.get(name)
    if cached is None:
        short = name.startswith(LMQ_PREFIX)
        name_b = name[_LMQ_PREFIX_LEN:].encode() if short else name.encode()
        cached = (_BYTE[len(name_b)] + name_b, short)
        if len(_LMQ_CACHE) >= _CACHE_LIMIT:
            _LMQ_CACHE.clear()
        _LMQ_CACHE[name] = cached
    return cached


def encode_message(
    *,
    topic: str,
    queue_id: int,
    queue_offset: int,
    flag: int,
    sys_flag: int,
    born_timestamp_ms: int,
    store_timestamp_ms: int,
    reconsume_times: int,
    born_host: tuple[str, int],
    lmqs: Sequence[tuple[str, int]],
    properties: Mapping[str, str],
    body: bytes,
    lmq_properties: bool | None = None,
    shared: SharedBases | None = None,
) -> bytes:
    """The compact (kind 3) record of a message: :func:`~mqproxy.backends.embedded.records.decode_message`
    gives back every field as given.

    ``lmq_properties=True`` says ``properties`` lack the two LMQ properties, which the stored message has
    after them (as :func:`~mqproxy.backends.embedded.sending.stored_properties` adds them); ``None``: find
    out whether the last two of ``properties`` are those derived ones.

    With ``shared`` (the records of one append, written in this order with one frame each) a record whose
    born host, topic, LMQ names and properties equal an earlier one's of the append refers to that record
    (SHARED) instead of repeating them.
    """
    bits = 0
    host, port = born_host
    delta = born_timestamp_ms - store_timestamp_ms
    parts: list[bytes] = [b""]
    if flag or sys_flag or reconsume_times:
        bits = _EXT
        parts.append(_EXT_FIELDS.pack(flag, sys_flag, reconsume_times))
    if not -0x8000 <= delta <= 0x7FFF:
        bits |= _BORN_ABS
        parts.append(_Q.pack(born_timestamp_ms))
        delta = 0
    sharing = False
    if shared is not None and (lmq_properties is not None or not lmqs):  # (else: rare, not shared)
        sharing = True
        found = shared.find(host, topic, tuple(properties.items()), lmqs, bool(lmqs and lmq_properties))
        if found is not None:
            return encode_shared(
                shared,
                found,
                bits,
                parts,
                queue_id,
                queue_offset,
                store_timestamp_ms,
                delta,
                port,
                lmqs,
                body,
            )
    packed = _IPV4_CACHE.get(host, b"")
    if packed == b"":
        packed = _ipv4(host)
    if packed is not None:
        bits |= _IPV4
        parts.append(packed)
    else:
        host_b = host.encode()
        parts += (_BYTE[len(host_b)], host_b)
    topic_b = topic.encode()
    parts += (_BYTE[len(topic_b)], topic_b)
    wide = not (
        0 <= queue_offset <= _U32_MAX and 0 <= queue_id <= 0xFFFF and 0 <= store_timestamp_ms <= _MAX48
    )
    count = len(properties)
    if lmqs:
        if not wide:
            for _, offset in lmqs:
                if not 0 <= offset <= _U32_MAX:
                    wide = True
                    break
        pack_offset = _Q.pack if wide else _I.pack
        parts.append(_varint(len(lmqs)))
        short = True
        for name, offset in lmqs:
            name_b, named_short = _LMQ_CACHE.get(name) or _lmq_name(name)
            short = short and named_short
            parts += (name_b, pack_offset(offset))
        if not short:  # rare: some name lacks the prefix; write every name whole
            at = len(parts) - 2 * len(lmqs)
            for i, (name, _) in enumerate(lmqs):
                name_b = name.encode()
                parts[at + 2 * i] = _BYTE[len(name_b)] + name_b
        else:
            bits |= _LMQ_SHORT
        if lmq_properties is None:
            lmq_properties = _derived_last(properties, lmqs)
            if lmq_properties:
                count -= 2
        if lmq_properties:
            bits |= _LMQ_PROPS
    else:
        parts.append(b"\x00")
    if wide:
        bits |= _WIDE
    props: list[bytes] = []
    cache = _ITEM_CACHE
    for item in islice(properties.items(), count) if count != len(properties) else properties.items():
        encoded = cache.get(item)
        if encoded is None:
            encoded = _item(*item)
            if item[0] in _CACHED_KEYS and len(encoded) <= 128:
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[item] = encoded
        props.append(encoded)
    props_b = b"".join(props)
    parts += (_varint(len(props_b)), props_b, _varint(len(body)), body)
    if wide:
        parts[0] = _HEAD_WIDE.pack(
            KIND_COMPACT, bits, queue_id, queue_offset, store_timestamp_ms, delta, port
        )
    else:
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
    record = b"".join(parts)
    if shared is not None:
        if sharing:
            shared.added(bits, len(record))
        shared.position += len(record) + FRAME_HEADER_BYTES
    return record


def _derived_last(properties: Mapping[str, str], lmqs: Sequence[tuple[str, int]]) -> bool:
    """Whether the last two ``properties`` are the LMQ properties of ``lmqs``, in stored order."""
    if len(properties) < 2 or not isinstance(properties, dict):
        return False
    last = reversed(properties)
    return (
        next(last) == PROPERTY_INNER_MULTI_QUEUE_OFFSET
        and next(last) == PROPERTY_INNER_MULTI_DISPATCH
        and properties[PROPERTY_INNER_MULTI_DISPATCH] == ",".join(name for name, _ in lmqs)
        and properties[PROPERTY_INNER_MULTI_QUEUE_OFFSET] == ",".join(str(offset) for _, offset in lmqs)
    )


#: The fields of :class:`~mqproxy.backends.embedded.records.MessageRecord`, in its order.
Fields = tuple[
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    tuple[str, int],
    str,
    tuple[tuple[str, int], ...],
    dict[str, str],
    bytes,
]


def decode_compact(payload: bytes) -> Fields:
    """The fields of a kind 3 record without SHARED (raises ValueError, IndexError, struct.error,
    UnicodeDecodeError or OSError when it is malformed)."""
    bits = payload[1]
    if bits & SHARED:
        raise ValueError("a shared record is read with its base (record_shared.decode_shared)")
    if bits & _WIDE:
        _, _, queue_id, queue_offset, store_ts, delta, port = _HEAD_WIDE.unpack_from(payload, 0)
        pos = _HEAD_WIDE.size
        unpack_offset, offset_size = _Q.unpack_from, 8
    else:
        _, _, queue_id, queue_offset, ts_high, ts_low, delta, port = _HEAD.unpack_from(payload, 0)
        store_ts = ts_high << 32 | ts_low
        pos = _HEAD.size
        unpack_offset, offset_size = _I.unpack_from, 4
    flag = sys_flag = reconsume = 0
    if bits & _EXT:
        flag, sys_flag, reconsume = _EXT_FIELDS.unpack_from(payload, pos)
        pos += _EXT_FIELDS.size
    if bits & _BORN_ABS:
        (born_ts,) = _Q.unpack_from(payload, pos)
        pos += 8
    else:
        born_ts = store_ts + delta
    if bits & _IPV4:
        if pos + 4 > len(payload):
            raise ValueError("record ends in the born host")
        packed = payload[pos : pos + 4]
        host = _NTOA_CACHE.get(packed) or _ntoa(packed)
        pos += 4
    else:
        n = payload[pos]
        host = payload[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
    n = payload[pos]
    topic = payload[pos + 1 : pos + 1 + n].decode()
    pos += 1 + n
    count, pos = _read_varint(payload, pos)
    lmqs = []
    prefix = LMQ_PREFIX if bits & _LMQ_SHORT else ""
    for _ in range(count):
        n = payload[pos]
        name = prefix + payload[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
        lmqs.append((name, unpack_offset(payload, pos)[0]))
        pos += offset_size
    size, pos = _read_varint(payload, pos)
    end = pos + size
    if end > len(payload):
        raise ValueError("properties run past the record")
    properties: dict[str, str] = {}
    keys = PROPERTY_CODES
    while pos < end:
        code = payload[pos]
        if code:
            key = keys[code]
            pos += 1
        else:
            n, pos = _read_varint(payload, pos + 1)
            key = payload[pos : pos + n].decode()
            pos += n
        n = payload[pos]
        if n < 0x80:
            pos += 1
        else:
            n, pos = _read_varint(payload, pos)
        properties[key] = payload[pos : pos + n].decode()
        pos += n
    if pos != end:
        raise ValueError("properties length mismatch")
    if bits & _LMQ_PROPS:
        properties[PROPERTY_INNER_MULTI_DISPATCH] = ",".join(name for name, _ in lmqs)
        properties[PROPERTY_INNER_MULTI_QUEUE_OFFSET] = ",".join(str(offset) for _, offset in lmqs)
    n = payload[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = _read_varint(payload, pos)
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
        tuple(lmqs),
        properties,
        body,
    )
