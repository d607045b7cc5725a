"""MQTT 3.1.1 and 5.0 packet codec (sans-IO).

`MqttDecoder(max_packet_size, protocol_level=None).receive_data(bytes) -> list[Packet]` and
`encode(packet, protocol_level) -> bytes`; every violation raises `MqttCodecError` carrying the MQTT 5
reason code to send before closing. Topic validation and matching live in `topics`.
"""

from __future__ import annotations

from mqproxy.codecs.mqtt.decoder import MAX_PACKET_SIZE, MqttDecoder
from mqproxy.codecs.mqtt.encoder import encode
from mqproxy.codecs.mqtt.errors import MqttCodecError
from mqproxy.codecs.mqtt.packets import (
    MQTT_5,
    PACKET_TYPES,
    PROTOCOL_LEVELS,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    QoS,
    RetainHandling,
    SubAck,
    Subscribe,
    SubscribeTopic,
    UnsubAck,
    Unsubscribe,
    Will,
)
from mqproxy.codecs.mqtt.properties import NO_PROPERTIES, Properties, PropertyId
from mqproxy.codecs.mqtt.reason_codes import (
    ConnackReturnCode,
    ReasonCode,
    connack_return_code,
    reason_from_connack_return_code,
)
from mqproxy.codecs.mqtt.topics import TopicFilter, parse_topic_filter, topic_matches, validate_topic_name

__all__ = [
    "MAX_PACKET_SIZE",
    "MQTT_5",
    "NO_PROPERTIES",
    "PACKET_TYPES",
    "PROTOCOL_LEVELS",
    "Auth",
    "Connack",
    "ConnackReturnCode",
    "Connect",
    "Disconnect",
    "MqttCodecError",
    "MqttDecoder",
    "Packet",
    "PacketType",
    "PingReq",
    "PingResp",
    "Properties",
    "PropertyId",
    "PubAck",
    "PubComp",
    "PubRec",
    "PubRel",
    "Publish",
    "QoS",
    "ReasonCode",
    "RetainHandling",
    "SubAck",
    "Subscribe",
    "SubscribeTopic",
    "TopicFilter",
    "UnsubAck",
    "Unsubscribe",
    "Will",
    "connack_return_code",
    "encode",
    "parse_topic_filter",
    "reason_from_connack_return_code",
    "topic_matches",
    "validate_topic_name",
]
