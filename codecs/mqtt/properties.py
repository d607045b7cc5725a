"""MQTT 5.0 properties (section 2.2.2): each identifier, its data type, where it may appear; `Properties`.

On decode, an identifier that is unknown or not allowed in the packet, or a value of the wrong type, is a
Malformed Packet (0x81); a repeated property other than User Property (and Subscription Identifier in a
PUBLISH), or an out-of-range value, is a Protocol Error (0x82); a Response Topic that is not a valid topic
name is 0x90 Topic Name Invalid. Encoding refuses the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any, Final

from mqproxy.codecs.mqtt.encoding import (
    Reader,
    encode_binary,
    encode_u16,
    encode_u32,
    encode_utf8,
    encode_varint,
)
from mqproxy.codecs.mqtt.errors import malformed, protocol_error
from mqproxy.codecs.mqtt.topics import validate_topic_name


class PropertyType(Enum):
    """The data type of a property value."""

    BYTE = "byte"
    TWO_BYTE_INT = "two_byte_int"
    FOUR_BYTE_INT = "four_byte_int"
    VARINT = "varint"
    UTF8 = "utf8"
    STRING_PAIR = "string_pair"
    BINARY = "binary"


class PropertyContext(IntEnum):
    """Where a property list appears: a packet type, or the Will Properties of a CONNECT."""

    WILL = 0
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    DISCONNECT = 14
    AUTH = 15


class PropertyId(IntEnum):
    """MQTT 5.0 property identifiers."""

    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


@dataclass(frozen=True, slots=True)
class PropertySpec:
    """One property: identifier, `Properties` attribute, data type, allowed contexts, allowed values."""

    id: PropertyId
    attribute: str
    type: PropertyType
    contexts: frozenset[PropertyContext]
    minimum: int = 0
    maximum: int | None = None


_C = PropertyContext
_T = PropertyType
_ALL_WITH_USER_PROPERTIES = frozenset(_C)
_ACKS_WITH_REASON_STRING = frozenset(
    {_C.CONNACK, _C.PUBACK, _C.PUBREC, _C.PUBREL, _C.PUBCOMP, _C.SUBACK, _C.UNSUBACK, _C.DISCONNECT, _C.AUTH}
)


def _spec(
    pid: PropertyId,
    ptype: PropertyType,
    contexts: frozenset[PropertyContext] | set[PropertyContext],
    minimum: int = 0,
    maximum: int | None = None,
) -> PropertySpec:
    return PropertySpec(pid, pid.name.lower(), ptype, frozenset(contexts), minimum, maximum)


_P = PropertyId
PROPERTY_SPECS: Final[dict[int, PropertySpec]] = {
    s.id: s
    for s in (
        _spec(_P.PAYLOAD_FORMAT_INDICATOR, _T.BYTE, {_C.PUBLISH, _C.WILL}, maximum=1),
        _spec(_P.MESSAGE_EXPIRY_INTERVAL, _T.FOUR_BYTE_INT, {_C.PUBLISH, _C.WILL}),
        _spec(_P.CONTENT_TYPE, _T.UTF8, {_C.PUBLISH, _C.WILL}),
        _spec(_P.RESPONSE_TOPIC, _T.UTF8, {_C.PUBLISH, _C.WILL}),
        _spec(_P.CORRELATION_DATA, _T.BINARY, {_C.PUBLISH, _C.WILL}),
        _spec(_P.SUBSCRIPTION_IDENTIFIER, _T.VARINT, {_C.PUBLISH, _C.SUBSCRIBE}, minimum=1),
        _spec(_P.SESSION_EXPIRY_INTERVAL, _T.FOUR_BYTE_INT, {_C.CONNECT, _C.CONNACK, _C.DISCONNECT}),
        _spec(_P.ASSIGNED_CLIENT_IDENTIFIER, _T.UTF8, {_C.CONNACK}),
        _spec(_P.SERVER_KEEP_ALIVE, _T.TWO_BYTE_INT, {_C.CONNACK}),
        _spec(_P.AUTHENTICATION_METHOD, _T.UTF8, {_C.CONNECT, _C.CONNACK, _C.AUTH}),
        _spec(_P.AUTHENTICATION_DATA, _T.BINARY, {_C.CONNECT, _C.CONNACK, _C.AUTH}),
        _spec(_P.REQUEST_PROBLEM_INFORMATION, _T.BYTE, {_C.CONNECT}, maximum=1),
        _spec(_P.WILL_DELAY_INTERVAL, _T.FOUR_BYTE_INT, {_C.WILL}),
        _spec(_P.REQUEST_RESPONSE_INFORMATION, _T.BYTE, {_C.CONNECT}, maximum=1),
        _spec(_P.RESPONSE_INFORMATION, _T.UTF8, {_C.CONNACK}),
        _spec(_P.SERVER_REFERENCE, _T.UTF8, {_C.CONNACK, _C.DISCONNECT}),
        _spec(_P.REASON_STRING, _T.UTF8, _ACKS_WITH_REASON_STRING),
        _spec(_P.RECEIVE_MAXIMUM, _T.TWO_BYTE_INT, {_C.CONNECT, _C.CONNACK}, minimum=1),
        _spec(_P.TOPIC_ALIAS_MAXIMUM, _T.TWO_BYTE_INT, {_C.CONNECT, _C.CONNACK}),
        _spec(_P.TOPIC_ALIAS, _T.TWO_BYTE_INT, {_C.PUBLISH}, minimum=1),
        _spec(_P.MAXIMUM_QOS, _T.BYTE, {_C.CONNACK}, maximum=1),
        _spec(_P.RETAIN_AVAILABLE, _T.BYTE, {_C.CONNACK}, maximum=1),
        _spec(_P.USER_PROPERTY, _T.STRING_PAIR, _ALL_WITH_USER_PROPERTIES),
        _spec(_P.MAXIMUM_PACKET_SIZE, _T.FOUR_BYTE_INT, {_C.CONNECT, _C.CONNACK}, minimum=1),
        _spec(_P.WILDCARD_SUBSCRIPTION_AVAILABLE, _T.BYTE, {_C.CONNACK}, maximum=1),
        _spec(_P.SUBSCRIPTION_IDENTIFIER_AVAILABLE, _T.BYTE, {_C.CONNACK}, maximum=1),
        _spec(_P.SHARED_SUBSCRIPTION_AVAILABLE, _T.BYTE, {_C.CONNACK}, maximum=1),
    )
}
"""Every MQTT 5.0 property, by identifier."""

_TYPE_MAXIMUM = {
    _T.BYTE: 0xFF,
    _T.TWO_BYTE_INT: 0xFFFF,
    _T.FOUR_BYTE_INT: 0xFFFF_FFFF,
    _T.VARINT: 268_435_455,
}


@dataclass(frozen=True, slots=True)
class Properties:
    """The properties of one packet (or of a will); None or empty means absent.

    User properties keep their order and may repeat. `subscription_identifiers` holds at most one value
    except in a PUBLISH sent to a subscriber, where it lists the id of every matching subscription.
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None


NO_PROPERTIES: Final = Properties()
"""The empty property list (shared; `Properties` is immutable)."""

# Attribute names in `Properties` for the two repeatable properties.
_REPEATED_ATTRIBUTE = {
    PropertyId.SUBSCRIPTION_IDENTIFIER: "subscription_identifiers",
    PropertyId.USER_PROPERTY: "user_properties",
}
_ATTRIBUTE_SPEC: dict[str, PropertySpec] = {
    _REPEATED_ATTRIBUTE.get(s.id, s.attribute): s for s in PROPERTY_SPECS.values()
}


def _check_range(spec: PropertySpec, value: int) -> None:
    maximum = _TYPE_MAXIMUM[spec.type] if spec.maximum is None else spec.maximum
    if not spec.minimum <= value <= maximum:
        raise protocol_error(f"property {spec.id.name} has value {value} outside {spec.minimum}..{maximum}")


def decode_properties(reader: Reader, context: PropertyContext) -> Properties:
    """Read a property length and the property list after it, validated for `context`."""
    length = reader.varint()
    if length == 0:
        return NO_PROPERTIES
    sub = reader.sub(length)
    values: dict[str, Any] = {}
    user_properties: list[tuple[str, str]] = []
    subscription_ids: list[int] = []
    while sub.remaining:
        pid = sub.varint()
        spec = PROPERTY_SPECS.get(pid)
        if spec is None:
            raise malformed(f"unknown property identifier 0x{pid:02X}")
        if context not in spec.contexts:
            raise malformed(f"property {spec.id.name} is not allowed in {context.name}")
        ptype = spec.type
        value: Any
        if ptype is _T.BYTE:
            value = sub.u8()
        elif ptype is _T.TWO_BYTE_INT:
            value = sub.u16()
        elif ptype is _T.FOUR_BYTE_INT:
            value = sub.u32()
        elif ptype is _T.VARINT:
            value = sub.varint()
        elif ptype is _T.UTF8:
            value = sub.utf8()
            if pid == PropertyId.RESPONSE_TOPIC:
                validate_topic_name(value)
        elif ptype is _T.BINARY:
            value = sub.binary()
        else:
            user_properties.append((sub.utf8(), sub.utf8()))
            continue
        if ptype is not _T.UTF8 and ptype is not _T.BINARY:
            _check_range(spec, value)
        if pid == PropertyId.SUBSCRIPTION_IDENTIFIER:
            if subscription_ids and context is not PropertyContext.PUBLISH:
                raise protocol_error(f"SUBSCRIPTION_IDENTIFIER repeated in {context.name}")
            subscription_ids.append(value)
            continue
        if spec.attribute in values:
            raise protocol_error(f"property {spec.id.name} repeated")
        values[spec.attribute] = value
    if user_properties:
        values["user_properties"] = tuple(user_properties)
    if subscription_ids:
        values["subscription_identifiers"] = tuple(subscription_ids)
    properties = Properties(**values)
    _check_authentication(properties)
    return properties


def _check_authentication(properties: Properties) -> None:
    if properties.authentication_data is not None and properties.authentication_method is None:
        raise protocol_error("authentication data without an authentication method")


def encode_properties(properties: Properties, context: PropertyContext) -> bytes:
    """The property length and list for `properties`, in identifier order; refuses what decode refuses."""
    if properties is NO_PROPERTIES:
        return b"\x00"
    _check_authentication(properties)
    out = bytearray()
    for attribute, spec in _ATTRIBUTE_SPEC.items():
        value = getattr(properties, attribute)
        if value is None or value == ():
            continue
        if context not in spec.contexts:
            raise malformed(f"property {spec.id.name} is not allowed in {context.name}")
        items = value if attribute in ("subscription_identifiers", "user_properties") else (value,)
        if (
            attribute == "subscription_identifiers"
            and len(items) > 1
            and context is not PropertyContext.PUBLISH
        ):
            raise protocol_error(f"SUBSCRIPTION_IDENTIFIER repeated in {context.name}")
        for item in items:
            out += encode_varint(spec.id)
            out += _encode_value(spec, item)
    return encode_varint(len(out)) + bytes(out)


def _encode_value(spec: PropertySpec, value: Any) -> bytes:
    ptype = spec.type
    if ptype is _T.UTF8:
        if spec.id == PropertyId.RESPONSE_TOPIC:
            validate_topic_name(value)
        return encode_utf8(value)
    if ptype is _T.BINARY:
        return encode_binary(value)
    if ptype is _T.STRING_PAIR:
        key, val = value
        return encode_utf8(key) + encode_utf8(val)
    _check_range(spec, value)
    if ptype is _T.BYTE:
        return bytes((value,))
    if ptype is _T.TWO_BYTE_INT:
        return encode_u16(value)
    if ptype is _T.FOUR_BYTE_INT:
        return encode_u32(value)
    return encode_varint(value)
