"""`encode(packet, protocol_level)`: one typed packet to its bytes.

The encoder refuses (MqttCodecError, same reason code as the decoder would use) any packet the decoder would
refuse, so whatever it emits decodes back to an equal packet. At levels 3 and 4 it translates CONNACK and
SUBACK reason codes to 3.1.1 return codes and drops what 3.1.1 cannot carry (properties, the reason codes of
PUBACK..PUBCOMP, UNSUBACK and DISCONNECT, the MQTT 5 subscription options); AUTH has no 3.1.1 form and is
refused. It does not know the peer's Maximum Packet Size: the caller compares `len()` of the result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mqproxy.codecs.mqtt import packets, reason_codes
from mqproxy.codecs.mqtt.encoding import encode_binary, encode_u16, encode_utf8, encode_varint
from mqproxy.codecs.mqtt.errors import MqttCodecError, malformed, protocol_error
from mqproxy.codecs.mqtt.properties import NO_PROPERTIES, PropertyContext, encode_properties
from mqproxy.codecs.mqtt.reason_codes import ReasonCode, connack_return_code
from mqproxy.codecs.mqtt.topics import parse_topic_filter, validate_topic_name

_PROTOCOL_NAME = {3: b"\x00\x06MQIsdp", 4: b"\x00\x04MQTT", 5: b"\x00\x04MQTT"}


def encode(packet: packets.Packet, protocol_level: int) -> bytes:
    """The wire bytes of `packet` at `protocol_level` (3, 4 or 5; a CONNECT uses its own level)."""
    if protocol_level not in packets.PROTOCOL_LEVELS:
        raise MqttCodecError(ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, f"protocol level {protocol_level}")
    encoder = _ENCODERS.get(type(packet))
    if encoder is None:
        raise TypeError(f"not an MQTT packet: {packet!r}")
    first, body = encoder(packet, protocol_level == packets.MQTT_5)
    return bytes((first,)) + encode_varint(len(body)) + body


def _packet_id(packet_id: int | None) -> bytes:
    if packet_id is None or not 1 <= packet_id <= 0xFFFF:
        raise protocol_error(f"packet identifier {packet_id} outside 1..65535")
    return packet_id.to_bytes(2, "big")


def _check_reason(reason: ReasonCode, allowed: frozenset[ReasonCode], kind: str) -> None:
    if reason not in allowed:
        raise protocol_error(f"reason code 0x{int(reason):02X} is not valid in {kind}")


def _encode_connect(packet: packets.Connect, v5: bool) -> tuple[int, bytes]:
    level = packet.protocol_level
    if level not in packets.PROTOCOL_LEVELS:
        raise MqttCodecError(ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, f"protocol level {level}")
    v5 = level == packets.MQTT_5
    will = packet.will
    flags = 0x02 if packet.clean_start else 0
    if will is not None:
        flags |= 0x04 | (int(will.qos) << 3) | (0x20 if will.retain else 0)
    if packet.username is not None:
        flags |= 0x80
    if packet.password is not None:
        if not v5 and packet.username is None:
            raise malformed("password without user name")
        flags |= 0x40
    body = bytearray(_PROTOCOL_NAME[level])
    body.append(level)
    body.append(flags)
    body += encode_u16(packet.keep_alive)
    if v5:
        body += encode_properties(packet.properties, PropertyContext.CONNECT)
    body += encode_utf8(packet.client_id)
    if will is not None:
        if v5:
            body += encode_properties(will.properties, PropertyContext.WILL)
        validate_topic_name(will.topic)
        body += encode_utf8(will.topic)
        body += encode_binary(will.payload)
    if packet.username is not None:
        body += encode_utf8(packet.username)
    if packet.password is not None:
        body += encode_binary(packet.password)
    return 0x10, bytes(body)


def _encode_connack(packet: packets.Connack, v5: bool) -> tuple[int, bytes]:
    reason = packet.reason_code
    if packet.session_present and reason.is_error:
        raise protocol_error("CONNACK refusal with session present")
    flags = b"\x01" if packet.session_present else b"\x00"
    if v5:
        _check_reason(reason, reason_codes.CONNACK_REASON_CODES, "CONNACK")
        return 0x20, flags + bytes((reason,)) + encode_properties(packet.properties, PropertyContext.CONNACK)
    return 0x20, flags + bytes((connack_return_code(reason),))


def _encode_publish(packet: packets.Publish, v5: bool) -> tuple[int, bytes]:
    qos = packet.qos
    if not 0 <= qos <= 2:
        raise malformed(f"PUBLISH with QoS {qos}")
    first = 0x30 | (qos << 1) | (0x01 if packet.retain else 0)
    if packet.dup:
        if not qos:
            raise malformed("PUBLISH with DUP set at QoS 0")
        first |= 0x08
    topic = packet.topic
    if topic:
        validate_topic_name(topic)
    elif not v5 or packet.properties.topic_alias is None:
        raise protocol_error("PUBLISH with an empty topic and no topic alias")
    body = encode_utf8(topic)
    if qos:
        body += _packet_id(packet.packet_id)
    elif packet.packet_id is not None:
        raise protocol_error("packet identifier on a QoS 0 PUBLISH")
    if v5:
        body += encode_properties(packet.properties, PropertyContext.PUBLISH)
    return first, body + packet.payload


def _ack_encoder(
    first: int, allowed: frozenset[ReasonCode], context: PropertyContext
) -> Callable[[Any, bool], tuple[int, bytes]]:
    def encode_ack(packet: packets.PublishAck, v5: bool) -> tuple[int, bytes]:
        body = _packet_id(packet.packet_id)
        if not v5:
            return first, body
        _check_reason(packet.reason_code, allowed, context.name)
        if packet.properties != NO_PROPERTIES:
            return first, body + bytes((packet.reason_code,)) + encode_properties(packet.properties, context)
        if packet.reason_code != ReasonCode.SUCCESS:
            return first, body + bytes((packet.reason_code,))
        return first, body

    return encode_ack


def _encode_subscribe(packet: packets.Subscribe, v5: bool) -> tuple[int, bytes]:
    if not packet.topics:
        raise protocol_error("SUBSCRIBE with no topic filter")
    body = bytearray(_packet_id(packet.packet_id))
    if v5:
        body += encode_properties(packet.properties, PropertyContext.SUBSCRIBE)
    for topic in packet.topics:
        parsed = parse_topic_filter(topic.topic_filter)
        if not 0 <= topic.qos <= 2 or not 0 <= topic.retain_handling <= 2:
            raise malformed(f"SUBSCRIBE options out of range: {topic!r}")
        options = int(topic.qos)
        if v5:
            if topic.no_local and parsed.share_group is not None:
                raise protocol_error("no local on a shared subscription")
            options |= (
                (0x04 if topic.no_local else 0)
                | (0x08 if topic.retain_as_published else 0)
                | (int(topic.retain_handling) << 4)
            )
        body += encode_utf8(topic.topic_filter)
        body.append(options)
    return 0x82, bytes(body)


def _encode_suback(packet: packets.SubAck, v5: bool) -> tuple[int, bytes]:
    if not packet.reason_codes:
        raise protocol_error("SUBACK with no return code")
    body = bytearray(_packet_id(packet.packet_id))
    if v5:
        body += encode_properties(packet.properties, PropertyContext.SUBACK)
    for reason in packet.reason_codes:
        _check_reason(reason, reason_codes.SUBACK_REASON_CODES, "SUBACK")
        body.append(reason if v5 or not reason.is_error else 0x80)
    return 0x90, bytes(body)


def _encode_unsubscribe(packet: packets.Unsubscribe, v5: bool) -> tuple[int, bytes]:
    if not packet.topic_filters:
        raise protocol_error("UNSUBSCRIBE with no topic filter")
    body = bytearray(_packet_id(packet.packet_id))
    if v5:
        body += encode_properties(packet.properties, PropertyContext.UNSUBSCRIBE)
    for topic_filter in packet.topic_filters:
        parse_topic_filter(topic_filter)
        body += encode_utf8(topic_filter)
    return 0xA2, bytes(body)


def _encode_unsuback(packet: packets.UnsubAck, v5: bool) -> tuple[int, bytes]:
    body = bytearray(_packet_id(packet.packet_id))
    if not v5:
        return 0xB0, bytes(body)
    if not packet.reason_codes:
        raise protocol_error("UNSUBACK with no reason code")
    body += encode_properties(packet.properties, PropertyContext.UNSUBACK)
    for reason in packet.reason_codes:
        _check_reason(reason, reason_codes.UNSUBACK_REASON_CODES, "UNSUBACK")
        body.append(reason)
    return 0xB0, bytes(body)


def _encode_pingreq(packet: packets.PingReq, v5: bool) -> tuple[int, bytes]:
    return 0xC0, b""


def _encode_pingresp(packet: packets.PingResp, v5: bool) -> tuple[int, bytes]:
    return 0xD0, b""


def _encode_reason_and_properties(
    reason: ReasonCode, properties: Any, allowed: frozenset[ReasonCode], context: PropertyContext
) -> bytes:
    _check_reason(reason, allowed, context.name)
    if properties != NO_PROPERTIES:
        return bytes((reason,)) + encode_properties(properties, context)
    if reason != ReasonCode.SUCCESS:
        return bytes((reason,))
    return b""


def _encode_disconnect(packet: packets.Disconnect, v5: bool) -> tuple[int, bytes]:
    if not v5:
        return 0xE0, b""
    return 0xE0, _encode_reason_and_properties(
        packet.reason_code,
        packet.properties,
        reason_codes.DISCONNECT_REASON_CODES,
        PropertyContext.DISCONNECT,
    )


def _encode_auth(packet: packets.Auth, v5: bool) -> tuple[int, bytes]:
    if not v5:
        raise malformed("AUTH does not exist before MQTT 5")
    return 0xF0, _encode_reason_and_properties(
        packet.reason_code, packet.properties, reason_codes.AUTH_REASON_CODES, PropertyContext.AUTH
    )


_ENCODERS: dict[type, Callable[[Any, bool], tuple[int, bytes]]] = {
    packets.Connect: _encode_connect,
    packets.Connack: _encode_connack,
    packets.Publish: _encode_publish,
    packets.PubAck: _ack_encoder(0x40, reason_codes.PUBACK_REASON_CODES, PropertyContext.PUBACK),
    packets.PubRec: _ack_encoder(0x50, reason_codes.PUBACK_REASON_CODES, PropertyContext.PUBREC),
    packets.PubRel: _ack_encoder(0x62, reason_codes.PUBREL_REASON_CODES, PropertyContext.PUBREL),
    packets.PubComp: _ack_encoder(0x70, reason_codes.PUBREL_REASON_CODES, PropertyContext.PUBCOMP),
    packets.Subscribe: _encode_subscribe,
    packets.SubAck: _encode_suback,
    packets.Unsubscribe: _encode_unsubscribe,
    packets.UnsubAck: _encode_unsuback,
    packets.PingReq: _encode_pingreq,
    packets.PingResp: _encode_pingresp,
    packets.Disconnect: _encode_disconnect,
    packets.Auth: _encode_auth,
}
