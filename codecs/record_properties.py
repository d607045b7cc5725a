"""
mqproxy.codecs.record_properties
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

The properties string of a RocketMQ message record (``key\\x01value\\x02`` per pair) and the record codec's
error type; fitting a stored message's properties into the record's 2-byte PROPERTIESLEN on the way out.
Re-exported by :mod:`mqproxy.codecs.message_record`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from mqproxy.codecs.remoting import RemotingCodecError
from mqproxy.model.properties import MAX_PROPERTIES_BYTES, PROPERTY_TRANSACTION_ID
from mqproxy.model.types import StoredMessage

__all__ = [
    "CLIENT_KEYS",
    "MAX_PROPERTIES_BYTES",
    "NAME_VALUE_SEPARATOR",
    "PROPERTY_SEPARATOR",
    "DroppedProperties",
    "OnDropped",
    "RecordError",
    "decode_properties",
    "encode_properties",
    "fit_properties",
]

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


class RecordError(RemotingCodecError):
    """A record, properties string or batch body that cannot be encoded or decoded.

    Reasons: ``truncated_record``, ``bad_record_size``, ``bad_magic``, ``bad_record_field``,
    ``bad_host``, ``bad_property``, ``bad_properties``, ``properties_too_long``, ``truncated_batch``,
    ``unsupported_compression``, ``bad_compressed_body``, ``decompressed_too_large``.
    """


# --- properties --------------------------------------------------------------------------------------


def encode_properties(props: Mapping[str, str]) -> str:
    """``k\\x01v\\x02`` for every pair, as Java writes it (trailing ``\\x02`` included).

    Pairs with an empty value are left out (every RocketMQ decoder drops them). A key or value holding
    a separator character, or an empty key, raises :class:`RecordError` ``bad_property``: it would
    smuggle extra properties into the record.
    """
    items = [f"{k}\x01{v}\x02" for k, v in props.items() if v]
    text = "".join(items)
    pairs = len(items)
    if text.count(NAME_VALUE_SEPARATOR) != pairs or text.count(PROPERTY_SEPARATOR) != pairs:
        raise RecordError("bad_property", "property key or value contains \\x01 or \\x02")
    if "\x02\x01" in text or text.startswith("\x01"):
        raise RecordError("bad_property", "empty property key")
    return text


_NO_SEPARATORS = str.maketrans({NAME_VALUE_SEPARATOR: "\ufffd", PROPERTY_SEPARATOR: "\ufffd"})


def _outgoing_properties(props: Mapping[str, str]) -> str:
    """:func:`encode_properties` for a record going out to a client. A stored message may hold a separator
    character in a property where its own protocol allows one (an MQTT topic or client id, a gRPC user
    property); it is sent as U+FFFD and a pair with an empty key is left out, so the record keeps its
    pairs apart and the pull or pop that carries it still succeeds."""
    try:
        return encode_properties(props)
    except RecordError:
        return encode_properties(
            {k.translate(_NO_SEPARATORS): v.translate(_NO_SEPARATORS) for k, v in props.items() if k}
        )


#: Keys a RocketMQ client or broker acts on (``MessageConst``): when a stored message's properties do not fit
#: a record, these are the last to be dropped.
CLIENT_KEYS = frozenset(
    {
        "UNIQ_KEY",
        "KEYS",
        "TAGS",
        "WAIT",
        "DELAY",
        "RETRY_TOPIC",
        "REAL_TOPIC",
        "REAL_QID",
        "TRAN_MSG",
        "PGROUP",
        "MIN_OFFSET",
        "MAX_OFFSET",
        "CLUSTER",
        "MSG_REGION",
        "TRACE_ON",
        "RECONSUME_TIME",
        "MAX_RECONSUME_TIMES",
        "CONSUME_START_TIME",
        "POP_CK",
        "ORIGIN_MESSAGE_ID",
        PROPERTY_TRANSACTION_ID,
        "TRANSACTION_CHECK_TIMES",
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
        "SHARDING_KEY",
        "__SHARDINGKEY",
        "INSTANCE_ID",
        "CORRELATION_ID",
        "REPLY_TO_CLIENT",
        "TTL",
        "MSG_TYPE",
        "TIMER_DELIVER_MS",
        "TIMER_DELAY_SEC",
        "TIMER_DELAY_MS",
        "DELIVERTIME",
        "INNER_MULTI_DISPATCH",
        "INNER_MULTI_QUEUE_OFFSET",
    }
)


@dataclass(frozen=True, slots=True)
class DroppedProperties:
    """Properties left out of one outgoing record because the whole did not fit its 2-byte length."""

    #: The keys left out, in the order they were dropped.
    keys: tuple[str, ...]
    #: UTF-8 size of the full properties string, and of what went out.
    bytes_before: int
    bytes_after: int


#: Called once per record whose properties were cut down (see :func:`fit_properties`).
OnDropped = Callable[[StoredMessage, DroppedProperties], None]


def fit_properties(
    props: Mapping[str, str], limit: int = MAX_PROPERTIES_BYTES
) -> tuple[bytes, DroppedProperties | None]:
    """The outgoing properties string of ``props`` (UTF-8, see :func:`_outgoing_properties`) cut down to at
    most ``limit`` bytes, and what was dropped (None when everything fits).

    A record's PROPERTIESLEN is a signed 2-byte field, so a RocketMQ broker refuses a send whose properties
    exceed 32,767 bytes (``PROPERTIES_SIZE_EXCEEDED`` -> MESSAGE_ILLEGAL) and never stores one. mqproxy stores
    messages whose properties passed that check at send but outgrow it on the way out (an MQTT topic near
    32 KB in ``MQTT_TOPIC`` plus the LMQ dispatch properties the store adds; separators sent as U+FFFD; a
    pop's ``POP_CK``), so on the way out whole pairs are dropped, largest first, keys outside
    :data:`CLIENT_KEYS` before those in it, until the rest fits; the rest keeps its order and no value is
    shortened (a cut value would be a wrong one). Body, topic and every other record field are untouched.
    """
    text = _outgoing_properties(props).encode("utf-8")
    if len(text) <= limit:
        return text, None
    pairs = [pair + b"\x02" for pair in text.split(b"\x02")[:-1]]
    keys = [pair[: pair.index(b"\x01")].decode("utf-8") for pair in pairs]
    order = sorted(range(len(pairs)), key=lambda i: (keys[i] in CLIENT_KEYS, -len(pairs[i]), i))
    size = len(text)
    dropped: list[int] = []
    for i in order:
        if size <= limit:
            break
        dropped.append(i)
        size -= len(pairs[i])
    gone = set(dropped)
    kept = b"".join(pair for i, pair in enumerate(pairs) if i not in gone)
    return kept, DroppedProperties(tuple(keys[i] for i in dropped), len(text), len(kept))


def decode_properties(text: str) -> dict[str, str]:
    """The pairs of a properties string; lenient like Java: the trailing ``\\x02`` is optional and
    segments without a non-empty key and value are skipped."""
    props: dict[str, str] = {}
    if not text:
        return props
    for segment in text.split(PROPERTY_SEPARATOR):
        cut = segment.find(NAME_VALUE_SEPARATOR)
        if 0 < cut < len(segment) - 1:
            props[segment[:cut]] = segment[cut + 1 :]
    return props
