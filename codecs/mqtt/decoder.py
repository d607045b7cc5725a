"""`MqttDecoder`: bytes in, typed packets out (sans-IO, one per connection).

Contracts:
- The fixed header is checked as soon as its bytes arrive -- packet type, reserved flag bits, QoS 3, packet
  order, a remaining length longer than 4 bytes or a packet larger than `max_packet_size` -- so a bad packet
  is refused before its body is buffered.
- With `protocol_level=None` the decoder is the server side of a connection: the first packet must be
  CONNECT (else 0x82), whose protocol level (3, 4 or 5) then fixes the wire format; a second CONNECT is a
  Protocol Error (0x82) here, not in the session. With a `protocol_level` the decoder enforces no order.
- Once it has raised, the decoder raises the same error on every later call; packets completed earlier in
  the failing call are dropped (the connection is closing anyway).
- What needs connection state beyond this (topic aliases, receive maximum, packet ids in use, which side may
  send which packet) is left to the session.
"""

from __future__ import annotations

from collections.abc import Callable

from mqproxy.codecs.mqtt import packets, reason_codes
from mqproxy.codecs.mqtt.encoding import Reader
from mqproxy.codecs.mqtt.errors import MqttCodecError, malformed, protocol_error
from mqproxy.codecs.mqtt.properties import NO_PROPERTIES, Properties, PropertyContext, decode_properties
from mqproxy.codecs.mqtt.reason_codes import ConnackReturnCode, ReasonCode, reason_from_connack_return_code
from mqproxy.codecs.mqtt.topics import parse_topic_filter, validate_topic_name

MAX_PACKET_SIZE = 1 + 4 + 268_435_455
"""The largest packet MQTT can express: fixed header byte, 4-byte remaining length, 256 MiB of body."""

_QOS = (packets.QoS.AT_MOST_ONCE, packets.QoS.AT_LEAST_ONCE, packets.QoS.EXACTLY_ONCE)
#: By value, as ``_QOS`` (an enum call costs about a microsecond).
_RETAIN_HANDLING = tuple(sorted(packets.RetainHandling))
_PROTOCOL_NAMES = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}
_FLAGS_0010 = frozenset(
    {packets.PacketType.PUBREL, packets.PacketType.SUBSCRIBE, packets.PacketType.UNSUBSCRIBE}
)
_V311_SUBACK = {
    0x00: ReasonCode.GRANTED_QOS_0,
    0x01: ReasonCode.GRANTED_QOS_1,
    0x02: ReasonCode.GRANTED_QOS_2,
    0x80: ReasonCode.UNSPECIFIED_ERROR,
}


class MqttDecoder:
    """Turns a byte stream into `Packet`s; see the module docstring for the contract."""

    def __init__(self, max_packet_size: int, protocol_level: int | None = None) -> None:
        if not 2 <= max_packet_size <= MAX_PACKET_SIZE:
            raise ValueError(f"max_packet_size must be in 2..{MAX_PACKET_SIZE}, not {max_packet_size}")
        if protocol_level is not None and protocol_level not in packets.PROTOCOL_LEVELS:
            raise ValueError(f"protocol_level must be one of {sorted(packets.PROTOCOL_LEVELS)}")
        self._max_packet_size = max_packet_size
        self._level = protocol_level
        self._server_side = protocol_level is None
        self._connected = False
        self._ready = protocol_level is not None  # PUBLISH may arrive (level known, CONNECT seen if needed)
        self._buffer = bytearray()
        self._error: MqttCodecError | None = None

    @property
    def protocol_level(self) -> int | None:
        """The level in use: given, or read from the CONNECT (set as soon as a valid level byte is read)."""
        return self._level

    def receive_data(self, data: bytes) -> list[packets.Packet]:
        """Buffer `data` and return every packet it completes, in order. Raises MqttCodecError."""
        if self._error is not None:
            raise self._error
        buffer = self._buffer
        buffer += data
        decoded: list[packets.Packet] = []
        pos = 0
        end = len(buffer)
        try:
            while pos < end:
                first = buffer[pos]
                # Fast path: a PUBLISH with valid flags once PUBLISH is allowed; anything else is checked.
                if first & 0xF0 != 0x30 or first & 0x06 == 0x06 or first & 0x0E == 0x08 or not self._ready:
                    self._check_first_byte(first)
                length = 0
                index = pos + 1
                for shift in (0, 7, 14, 21):
                    if index >= end:
                        return decoded
                    byte = buffer[index]
                    index += 1
                    length |= (byte & 0x7F) << shift
                    if not byte & 0x80:
                        if byte == 0 and shift:
                            raise malformed("remaining length is not minimally encoded")
                        break
                else:
                    raise malformed("remaining length longer than 4 bytes")
                total = index - pos + length
                if total > self._max_packet_size:
                    raise MqttCodecError(
                        ReasonCode.PACKET_TOO_LARGE,
                        f"packet of {total} bytes exceeds the maximum packet size {self._max_packet_size}",
                    )
                if pos + total > end:
                    return decoded
                pos += total
                if first & 0xF0 == 0x30:
                    decoded.append(_decode_publish(first, buffer, index, pos, self._level == packets.MQTT_5))
                else:
                    decoded.append(self._decode(first, bytes(buffer[index:pos])))
            return decoded
        except MqttCodecError as exc:
            self._error = exc
            raise
        finally:
            if self._error is not None:
                buffer.clear()
            elif pos:
                del buffer[:pos]

    def _check_first_byte(self, first: int) -> None:
        kind = first >> 4
        flags = first & 0x0F
        if kind == packets.PacketType.PUBLISH:
            if flags & 0x06 == 0x06:
                raise malformed("PUBLISH with QoS 3")
            if flags & 0x08 and not flags & 0x06:
                raise malformed("PUBLISH with DUP set at QoS 0")
        elif kind == 0 or (
            kind == packets.PacketType.AUTH and self._level is not None and self._level != packets.MQTT_5
        ):
            raise malformed(f"reserved packet type {kind}")
        elif flags != (0x02 if kind in _FLAGS_0010 else 0x00):
            raise malformed(f"reserved flag bits 0x{flags:X} wrong for {packets.PacketType(kind).name}")
        if self._server_side:
            if not self._connected and kind != packets.PacketType.CONNECT:
                raise protocol_error(f"{packets.PacketType(kind).name} before CONNECT")
            if self._connected and kind == packets.PacketType.CONNECT:
                raise protocol_error("second CONNECT")

    def _decode(self, first: int, body: bytes) -> packets.Packet:
        kind = first >> 4
        if kind == packets.PacketType.CONNECT:
            packet: packets.Packet = self._decode_connect(Reader(body))
            self._connected = True
            self._ready = True
            return packet
        level = self._level
        if level is None:
            raise protocol_error(f"{packets.PacketType(kind).name} before the protocol level is known")
        reader = Reader(body)
        packet = _DECODERS[kind](first & 0x0F, reader, level == packets.MQTT_5)
        if reader.remaining:
            raise malformed(f"{reader.remaining} bytes after the end of {packets.PacketType(kind).name}")
        return packet

    def _decode_connect(self, reader: Reader) -> packets.Connect:
        name = reader.utf8()
        level = reader.u8()
        if name not in ("MQTT", "MQIsdp"):
            raise protocol_error(f"unknown protocol name {name!r}")
        if _PROTOCOL_NAMES.get(level) != name:
            raise MqttCodecError(
                ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, f"unsupported protocol {name!r} level {level}"
            )
        if self._server_side:
            self._level = level
        v5 = level == packets.MQTT_5
        flags = reader.u8()
        if flags & 0x01:
            raise malformed("CONNECT reserved flag bit set")
        will_flag = bool(flags & 0x04)
        will_qos = (flags >> 3) & 0x03
        will_retain = bool(flags & 0x20)
        if will_qos == 3:
            raise malformed("will QoS 3")
        if not will_flag and (will_qos or will_retain):
            raise malformed("will QoS or retain set without the will flag")
        if not v5 and flags & 0x40 and not flags & 0x80:
            raise malformed("password flag without user name flag")
        keep_alive = reader.u16()
        properties = decode_properties(reader, PropertyContext.CONNECT) if v5 else NO_PROPERTIES
        client_id = reader.utf8()
        will = None
        if will_flag:
            will_properties = decode_properties(reader, PropertyContext.WILL) if v5 else NO_PROPERTIES
            will_topic = reader.utf8()
            validate_topic_name(will_topic)
            will = packets.Will(
                will_topic, reader.binary(), packets.QoS(will_qos), will_retain, will_properties
            )
        username = reader.utf8() if flags & 0x80 else None
        password = reader.binary() if flags & 0x40 else None
        if reader.remaining:
            raise malformed(f"{reader.remaining} bytes after the end of CONNECT")
        return packets.Connect(
            client_id, level, bool(flags & 0x02), keep_alive, username, password, will, properties
        )


def _packet_id(reader: Reader) -> int:
    packet_id = reader.u16()
    if packet_id == 0:
        raise protocol_error("packet identifier 0")
    return packet_id


def _reason(code: int, allowed: frozenset[ReasonCode], kind: str) -> ReasonCode:
    if code in allowed:
        return ReasonCode(code)
    raise protocol_error(f"reason code 0x{code:02X} is not valid in {kind}")


def _decode_connack(flags: int, reader: Reader, v5: bool) -> packets.Connack:
    ack_flags = reader.u8()
    if ack_flags & 0xFE:
        raise malformed("CONNACK reserved flag bits set")
    code = reader.u8()
    if v5:
        reason = _reason(code, reason_codes.CONNACK_REASON_CODES, "CONNACK")
        properties = decode_properties(reader, PropertyContext.CONNACK)
    else:
        try:
            reason = reason_from_connack_return_code(ConnackReturnCode(code))
        except ValueError:
            raise protocol_error(f"CONNACK return code 0x{code:02X}") from None
        properties = NO_PROPERTIES
    if ack_flags and reason.is_error:
        raise protocol_error("CONNACK refusal with session present")
    return packets.Connack(bool(ack_flags), reason, properties)


def _decode_publish(first: int, buffer: bytearray, start: int, end: int, v5: bool) -> packets.Publish:
    """PUBLISH straight from the receive buffer (the hot path: no body copy, no Reader unless v5)."""
    if end - start < 2:
        raise malformed("PUBLISH shorter than its topic length")
    topic_end = start + 2 + ((buffer[start] << 8) | buffer[start + 1])
    qos = (first >> 1) & 0x03
    pos = topic_end + 2 if qos else topic_end
    if pos > end:
        raise malformed("PUBLISH shorter than its topic and packet identifier")
    try:
        topic = buffer[start + 2 : topic_end].decode("utf-8")
    except UnicodeDecodeError:
        raise malformed("invalid UTF-8 topic name") from None
    packet_id = None
    if qos:
        packet_id = (buffer[topic_end] << 8) | buffer[topic_end + 1]
        if not packet_id:
            raise protocol_error("packet identifier 0")
    properties = NO_PROPERTIES
    if v5:
        if pos < end and buffer[pos] == 0:
            pos += 1
        else:
            reader = Reader(bytes(buffer[pos:end]))
            properties = decode_properties(reader, PropertyContext.PUBLISH)
            pos += reader.pos
    if not topic:
        if properties.topic_alias is None:
            raise protocol_error("PUBLISH with an empty topic and no topic alias")
    elif "+" in topic or "#" in topic or "\x00" in topic:
        if "\x00" in topic:
            raise malformed("topic name contains U+0000")
        validate_topic_name(topic)
    publish = _new_publish(_PUBLISH)
    _set_topic(publish, topic)
    _set_payload(publish, bytes(buffer[pos:end]))
    _set_qos(publish, _QOS[qos])
    _set_retain(publish, bool(first & 0x01))
    _set_dup(publish, bool(first & 0x08))
    _set_packet_id(publish, packet_id)
    _set_properties(publish, properties)
    return publish


# The hot path builds a PUBLISH with its slots' setters: the frozen dataclass's ``__init__`` sets each
# field through ``object.__setattr__`` and costs about twice as much. The result is the same object (same
# type, fields, equality and hash; no ``__post_init__``).
_PUBLISH = packets.Publish
_new_publish = object.__new__
_set_topic = _PUBLISH.topic.__set__  # type: ignore[attr-defined]
_set_payload = _PUBLISH.payload.__set__  # type: ignore[attr-defined]
_set_qos = _PUBLISH.qos.__set__  # type: ignore[attr-defined]
_set_retain = _PUBLISH.retain.__set__  # type: ignore[attr-defined]
_set_dup = _PUBLISH.dup.__set__  # type: ignore[attr-defined]
_set_packet_id = _PUBLISH.packet_id.__set__  # type: ignore[attr-defined]
_set_properties = _PUBLISH.properties.__set__  # type: ignore[attr-defined]


def _ack_decoder(
    cls: type[packets.PublishAck],
    allowed: frozenset[ReasonCode],
    context: PropertyContext,
) -> Callable[[int, Reader, bool], packets.Packet]:
    def decode(flags: int, reader: Reader, v5: bool) -> packets.Packet:
        packet_id = _packet_id(reader)
        reason = ReasonCode.SUCCESS
        properties: Properties = NO_PROPERTIES
        if v5 and reader.remaining:
            reason = _reason(reader.u8(), allowed, context.name)
            if reader.remaining:
                properties = decode_properties(reader, context)
        return cls(packet_id, reason, properties)

    return decode


def _decode_subscribe(flags: int, reader: Reader, v5: bool) -> packets.Subscribe:
    packet_id = _packet_id(reader)
    properties = decode_properties(reader, PropertyContext.SUBSCRIBE) if v5 else NO_PROPERTIES
    topics: list[packets.SubscribeTopic] = []
    while reader.remaining:
        topic_filter = reader.utf8()
        options = reader.u8()
        if options & (0xC0 if v5 else 0xFC):
            raise malformed("SUBSCRIBE options reserved bits set")
        qos = options & 0x03
        if qos == 3:
            raise malformed("SUBSCRIBE with QoS 3")
        retain_handling = (options >> 4) & 0x03
        if retain_handling == 3:
            raise protocol_error("SUBSCRIBE with retain handling 3")
        parsed = parse_topic_filter(topic_filter)
        no_local = bool(options & 0x04)
        if no_local and parsed.share_group is not None:
            raise protocol_error("no local on a shared subscription")
        topics.append(
            packets.SubscribeTopic(
                topic_filter,
                _QOS[qos],
                no_local,
                bool(options & 0x08),
                _RETAIN_HANDLING[retain_handling],
            )
        )
    if not topics:
        raise protocol_error("SUBSCRIBE with no topic filter")
    return packets.Subscribe(packet_id, tuple(topics), properties)


def _decode_suback(flags: int, reader: Reader, v5: bool) -> packets.SubAck:
    packet_id = _packet_id(reader)
    properties = decode_properties(reader, PropertyContext.SUBACK) if v5 else NO_PROPERTIES
    codes: list[ReasonCode] = []
    for code in reader.rest():
        if v5:
            codes.append(_reason(code, reason_codes.SUBACK_REASON_CODES, "SUBACK"))
        elif code in _V311_SUBACK:
            codes.append(_V311_SUBACK[code])
        else:
            raise protocol_error(f"SUBACK return code 0x{code:02X}")
    if not codes:
        raise protocol_error("SUBACK with no return code")
    return packets.SubAck(packet_id, tuple(codes), properties)


def _decode_unsubscribe(flags: int, reader: Reader, v5: bool) -> packets.Unsubscribe:
    packet_id = _packet_id(reader)
    properties = decode_properties(reader, PropertyContext.UNSUBSCRIBE) if v5 else NO_PROPERTIES
    filters: list[str] = []
    while reader.remaining:
        topic_filter = reader.utf8()
        parse_topic_filter(topic_filter)
        filters.append(topic_filter)
    if not filters:
        raise protocol_error("UNSUBSCRIBE with no topic filter")
    return packets.Unsubscribe(packet_id, tuple(filters), properties)


def _decode_unsuback(flags: int, reader: Reader, v5: bool) -> packets.UnsubAck:
    packet_id = _packet_id(reader)
    if not v5:
        return packets.UnsubAck(packet_id)
    properties = decode_properties(reader, PropertyContext.UNSUBACK)
    codes = tuple(_reason(code, reason_codes.UNSUBACK_REASON_CODES, "UNSUBACK") for code in reader.rest())
    if not codes:
        raise protocol_error("UNSUBACK with no reason code")
    return packets.UnsubAck(packet_id, codes, properties)


def _decode_pingreq(flags: int, reader: Reader, v5: bool) -> packets.PingReq:
    return packets.PingReq()


def _decode_pingresp(flags: int, reader: Reader, v5: bool) -> packets.PingResp:
    return packets.PingResp()


def _decode_disconnect(flags: int, reader: Reader, v5: bool) -> packets.Disconnect:
    if not v5 or not reader.remaining:
        return packets.Disconnect()
    reason = _reason(reader.u8(), reason_codes.DISCONNECT_REASON_CODES, "DISCONNECT")
    properties = decode_properties(reader, PropertyContext.DISCONNECT) if reader.remaining else NO_PROPERTIES
    return packets.Disconnect(reason, properties)


def _decode_auth(flags: int, reader: Reader, v5: bool) -> packets.Auth:
    if not reader.remaining:
        return packets.Auth()
    reason = _reason(reader.u8(), reason_codes.AUTH_REASON_CODES, "AUTH")
    properties = decode_properties(reader, PropertyContext.AUTH) if reader.remaining else NO_PROPERTIES
    return packets.Auth(reason, properties)


_DECODERS: dict[int, Callable[[int, Reader, bool], packets.Packet]] = {  # all but CONNECT and PUBLISH
    packets.PacketType.CONNACK: _decode_connack,
    packets.PacketType.PUBACK: _ack_decoder(
        packets.PubAck, reason_codes.PUBACK_REASON_CODES, PropertyContext.PUBACK
    ),
    packets.PacketType.PUBREC: _ack_decoder(
        packets.PubRec, reason_codes.PUBACK_REASON_CODES, PropertyContext.PUBREC
    ),
    packets.PacketType.PUBREL: _ack_decoder(
        packets.PubRel, reason_codes.PUBREL_REASON_CODES, PropertyContext.PUBREL
    ),
    packets.PacketType.PUBCOMP: _ack_decoder(
        packets.PubComp, reason_codes.PUBREL_REASON_CODES, PropertyContext.PUBCOMP
    ),
    packets.PacketType.SUBSCRIBE: _decode_subscribe,
    packets.PacketType.SUBACK: _decode_suback,
    packets.PacketType.UNSUBSCRIBE: _decode_unsubscribe,
    packets.PacketType.UNSUBACK: _decode_unsuback,
    packets.PacketType.PINGREQ: _decode_pingreq,
    packets.PacketType.PINGRESP: _decode_pingresp,
    packets.PacketType.DISCONNECT: _decode_disconnect,
    packets.PacketType.AUTH: _decode_auth,
}
