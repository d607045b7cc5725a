"""
mqproxy.codecs.record_patch
~~~~~~~~~~~~~~~~~~~~~~~~~~~

Pull bodies passed through without decoding them: a RocketMQ broker's records rewritten in place with
the coordinates a client of this node must see (queue id, commit-log offset, store host), and a body kept
as bytes that decodes into messages only when someone asks (:class:`RecordBody`).

The fixed-position fields are those of the record layout in :mod:`mqproxy.codecs.message_record` (as
Apache RocketMQ's ``MessageDecoder`` reads them): QUEUEID at byte 12, PHYSICALOFFSET at 28, SYSFLAG at
36, and with IPv4 hosts STOREHOST at 64 (4-byte address, i32 port) and PREPARED_TRANSACTION_OFFSET at 76.
Records are walked by their TOTALSIZE.

Contract of :func:`relocate_records`: its result is byte for byte what
:func:`~mqproxy.codecs.message_record.encode_records` gives (with either ``legacy`` setting) for the
decoded records with the new queue id, commit-log offset and store host, except that each properties
string is kept as stored (a re-encoding leaves out pairs with an empty value, which every decoder skips
anyway). It returns None, and the caller decodes instead, for any record a re-encoding would write
differently: a V2 record (2-byte topic length), an IPv6 born or store host, a BODYCRC of 0 (a re-encoding
computes it), a new store host that is not an IPv4 address, a queue the caller cannot map, or a body
that does not parse.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from mqproxy.codecs.message_record import (
    MAGIC_V1,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    RecordError,
    decode_records,
)
from mqproxy.model.ids import MessageIdError, pack_ip
from mqproxy.model.types import StoredMessage

__all__ = ["RecordBody", "relocate_records"]

#: TOTALSIZE, MAGIC, BODYCRC, QUEUEID at the start of every record.
_HEAD = struct.Struct(">iIii")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_QUEUE_ID_AT = 12
_PHYSICAL_OFFSET_AT = 28
_SYSFLAG_AT = 36
#: With IPv4 hosts: STOREHOST (address + port), PREPARED_TRANSACTION_OFFSET, BODYLEN.
_STORE_HOST_AT = 64
_PREPARED_OFFSET_AT = 76
_BODY_LEN_AT = 84
_BODY_AT = 88
_HOSTS_V6 = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
#: Fixed part, a 1-byte topic length and a 2-byte properties length.
_MIN_V1_RECORD = _BODY_AT + 1 + 2

#: ``(topic, real queue id) -> queue id a client sees``, or None when the caller cannot say.
QueueMapper = Callable[[str, int], "int | None"]


@dataclass(frozen=True, slots=True)
class RecordBody:
    """A pull body of encoded records (see :class:`~mqproxy.model.types.PullResult`): ``data`` as it
    goes to a remoting client, :meth:`messages` decoded from it (on every call)."""

    data: bytes

    def messages(self) -> tuple[StoredMessage, ...]:
        return tuple(record.to_stored_message() for record in decode_records(self.data))


def relocate_records(
    data: bytes,
    *,
    queue_id: QueueMapper,
    commitlog_offset: Callable[[int], int],
    store_host: tuple[str, int],
) -> bytes | None:
    """``data`` (a broker's pull body) with each record's queue id mapped by ``queue_id``, its
    commit-log offset by ``commitlog_offset``, its store host set to ``store_host`` and its prepared
    transaction offset to 0; None when a re-encoding would differ (see the module contract)."""
    try:
        host = pack_ip(store_host[0]) + _I32.pack(store_host[1])
    except (MessageIdError, struct.error):
        return None
    if len(host) != 8:
        return None
    out = bytearray(data)
    end = len(out)
    pos = 0
    topics: dict[bytes, str] = {}
    try:
        while pos < end:
            if end - pos < _MIN_V1_RECORD:
                return None
            total, magic, crc, real_queue = _HEAD.unpack_from(out, pos)
            if magic != MAGIC_V1 or crc == 0 or total < _MIN_V1_RECORD or total > end - pos:
                return None
            if _I32.unpack_from(out, pos + _SYSFLAG_AT)[0] & _HOSTS_V6:
                return None
            (body_len,) = _I32.unpack_from(out, pos + _BODY_LEN_AT)
            at = pos + _BODY_AT + body_len
            if body_len < 0 or at + 3 > pos + total:
                return None
            topic_end = at + 1 + out[at]
            stop = pos + total
            if topic_end + 2 > stop or topic_end + 2 + _I16.unpack_from(out, topic_end)[0] != stop:
                return None
            str(memoryview(out)[topic_end + 2 : stop], "utf-8")  # properties a decoder can read
            raw_topic = bytes(out[at + 1 : topic_end])
            topic = topics.get(raw_topic)
            if topic is None:
                topic = topics[raw_topic] = raw_topic.decode("utf-8")
            virtual = queue_id(topic, real_queue)
            if virtual is None:
                return None
            _I32.pack_into(out, pos + _QUEUE_ID_AT, virtual)
            (physical,) = _I64.unpack_from(out, pos + _PHYSICAL_OFFSET_AT)
            _I64.pack_into(out, pos + _PHYSICAL_OFFSET_AT, commitlog_offset(physical))
            out[pos + _STORE_HOST_AT : pos + _STORE_HOST_AT + 8] = host
            _I64.pack_into(out, pos + _PREPARED_OFFSET_AT, 0)
            pos = stop
    except (struct.error, UnicodeDecodeError, RecordError, ValueError):
        return None
    return bytes(out)
