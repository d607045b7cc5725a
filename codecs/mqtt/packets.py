"""Typed, immutable MQTT control packets for protocol levels 3 (3.1), 4 (3.1.1) and 5 (5.0).

One class per packet type; the same classes serve every level. Reason codes are MQTT 5 `ReasonCode`s at
every level: the codec translates CONNACK and SUBACK codes for 3.1.1 and drops, on a 3.1.1 encode, what 3.1.1
cannot carry (properties, reason codes of PUBACK..PUBCOMP, UNSUBACK and DISCONNECT).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from mqproxy.codecs.mqtt.properties import NO_PROPERTIES, Properties
from mqproxy.codecs.mqtt.reason_codes import ReasonCode

PROTOCOL_LEVELS = frozenset({3, 4, 5})
"""Protocol levels the codec speaks: 3 = MQTT 3.1 ("MQIsdp"), 4 = 3.1.1, 5 = 5.0."""

MQTT_5 = 5


class PacketType(IntEnum):
    """The fixed header's packet type (upper four bits of byte 1)."""

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
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class QoS(IntEnum):
    """Quality of service of a message or a subscription."""

    AT_MOST_ONCE = 0
    AT_LEAST_ONCE = 1
    EXACTLY_ONCE = 2


class RetainHandling(IntEnum):
    """MQTT 5 subscription option: when to send retained messages."""

    SEND_ON_SUBSCRIBE = 0
    SEND_IF_NEW_SUBSCRIPTION = 1
    DO_NOT_SEND = 2


@dataclass(frozen=True, slots=True)
class Will:
    """The will message of a CONNECT."""

    topic: str
    payload: bytes
    qos: QoS = QoS.AT_MOST_ONCE
    retain: bool = False
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT. `protocol_level` decides the wire format of this and every later packet."""

    client_id: str
    protocol_level: int = 4
    clean_start: bool = True
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connack:
    """CONNACK. A refusal is a `reason_code` >= 0x80 (3.1.1: translated to a return code 1..5)."""

    session_present: bool = False
    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Publish:
    """PUBLISH. `packet_id` is None at QoS 0 and 1..65535 otherwise.

    `topic` may be empty only in MQTT 5 with a Topic Alias property.
    """

    topic: str
    payload: bytes = b""
    qos: QoS = QoS.AT_MOST_ONCE
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PublishAck:
    """The fields every step of a QoS 1/2 flow carries; the packet is one of the four subclasses (a
    PUBACK never equals a PUBREC with the same fields)."""

    packet_id: int
    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PubAck(PublishAck):
    """PUBACK (QoS 1 acknowledgement)."""


@dataclass(frozen=True, slots=True)
class PubRec(PublishAck):
    """PUBREC (QoS 2, step 1)."""


@dataclass(frozen=True, slots=True)
class PubRel(PublishAck):
    """PUBREL (QoS 2, step 2)."""


@dataclass(frozen=True, slots=True)
class PubComp(PublishAck):
    """PUBCOMP (QoS 2, step 3)."""


@dataclass(frozen=True, slots=True)
class SubscribeTopic:
    """One topic filter of a SUBSCRIBE with its options (all but `qos` are MQTT 5 only)."""

    topic_filter: str
    qos: QoS = QoS.AT_MOST_ONCE
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: RetainHandling = RetainHandling.SEND_ON_SUBSCRIBE


@dataclass(frozen=True, slots=True)
class Subscribe:
    """SUBSCRIBE: at least one topic filter."""

    packet_id: int
    topics: tuple[SubscribeTopic, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class SubAck:
    """SUBACK: one reason code per requested filter (GRANTED_QOS_n or a failure)."""

    packet_id: int
    reason_codes: tuple[ReasonCode, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """UNSUBSCRIBE: at least one topic filter."""

    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class UnsubAck:
    """UNSUBACK: one reason code per filter in MQTT 5, none in 3.1.1."""

    packet_id: int
    reason_codes: tuple[ReasonCode, ...] = ()
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PingReq:
    """PINGREQ."""


@dataclass(frozen=True, slots=True)
class PingResp:
    """PINGRESP."""


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT (reason code and properties are MQTT 5 only)."""

    reason_code: ReasonCode = ReasonCode.NORMAL_DISCONNECTION
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Auth:
    """AUTH (MQTT 5 only): enhanced authentication exchange."""

    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


Packet = (
    Connect
    | Connack
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
"""Any MQTT control packet."""

PACKET_TYPES: dict[type[Packet], PacketType] = {
    Connect: PacketType.CONNECT,
    Connack: PacketType.CONNACK,
    Publish: PacketType.PUBLISH,
    PubAck: PacketType.PUBACK,
    PubRec: PacketType.PUBREC,
    PubRel: PacketType.PUBREL,
    PubComp: PacketType.PUBCOMP,
    Subscribe: PacketType.SUBSCRIBE,
    SubAck: PacketType.SUBACK,
    Unsubscribe: PacketType.UNSUBSCRIBE,
    UnsubAck: PacketType.UNSUBACK,
    PingReq: PacketType.PINGREQ,
    PingResp: PacketType.PINGRESP,
    Disconnect: PacketType.DISCONNECT,
    Auth: PacketType.AUTH,
}
"""The packet type of each packet class."""
