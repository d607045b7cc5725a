"""Cross-check with paho-mqtt: packets paho builds decode as intended; packets we build parse in paho.

paho's packet builders (`Client._send_*`) and reader (`Client._packet_read`) are driven directly, with the
outgoing queue captured and a fake socket object feeding bytes in: no network.
"""

from __future__ import annotations

from typing import Any

import pytest

from mqproxy.codecs import mqtt as mq
from mqproxy.codecs.mqtt.encoding import Reader
from mqproxy.codecs.mqtt.properties import (
    PROPERTY_SPECS,
    PropertyContext,
    PropertyType,
    decode_properties,
    encode_properties,
)

mqtt = pytest.importorskip("paho.mqtt.client")
paho_properties = pytest.importorskip("paho.mqtt.properties")
paho_packettypes = pytest.importorskip("paho.mqtt.packettypes")
paho_reasoncodes = pytest.importorskip("paho.mqtt.reasoncodes")
paho_subscribeoptions = pytest.importorskip("paho.mqtt.subscribeoptions")

PacketTypes = paho_packettypes.PacketTypes


class _FakeSocket:
    """Just enough of a socket for paho's reader: `recv` from a buffer."""

    def __init__(self, data: bytes) -> None:
        self._data = bytearray(data)

    def recv(self, count: int) -> bytes:
        if not self._data:
            raise BlockingIOError
        out = bytes(self._data[:count])
        del self._data[:count]
        return out

    def close(self) -> None:
        pass


def _client(protocol: int) -> tuple[Any, list[bytes]]:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-cid", protocol=protocol)
    sent: list[bytes] = []

    def capture(command: int, packet: bytes, mid: int, qos: int, info: object = None) -> int:
        sent.append(bytes(packet))
        return 0

    client._packet_queue = capture
    client._sock = _FakeSocket(b"")  # paho refuses to build a PUBLISH without a socket
    return client, sent


def _paho_props(packet_type: int, **values: Any) -> Any:
    props = paho_properties.Properties(packet_type)
    for name, value in values.items():
        setattr(props, name, value)
    return props


def _decode_server_side(sent: list[bytes]) -> list[mq.Packet]:
    decoder = mq.MqttDecoder(mq.MAX_PACKET_SIZE)
    return decoder.receive_data(b"".join(sent))


def test_paho_v311_client_packets_decode() -> None:
    client, sent = _client(mqtt.MQTTv311)
    client.username_pw_set("user", "secret")
    client.will_set("will/topic", b"gone", qos=1, retain=True)
    client._send_connect(30)
    client._send_publish(0, b"a/b", b"qos0", 0, False, False)
    client._send_publish(7, b"a/b", b"qos1", 1, True, False)
    client._send_publish(8, b"a/b", b"qos2", 2, False, True)
    client._send_subscribe(False, [(b"a/+", 1), (b"b/#", 2)])
    client._send_unsubscribe(False, [b"a/+", b"b/#"])
    client._send_puback(9)
    client._send_pubrec(10)
    client._send_pubrel(11)
    client._send_pubcomp(12)
    client._send_pingreq()
    client._send_disconnect()
    packets = _decode_server_side(sent)
    subscribe_id = packets[4].packet_id  # type: ignore[union-attr]
    unsubscribe_id = packets[5].packet_id  # type: ignore[union-attr]
    assert packets == [
        mq.Connect(
            "paho-cid",
            4,
            True,
            30,
            "user",
            b"secret",
            mq.Will("will/topic", b"gone", mq.QoS.AT_LEAST_ONCE, True),
        ),
        mq.Publish("a/b", b"qos0"),
        mq.Publish("a/b", b"qos1", mq.QoS.AT_LEAST_ONCE, retain=True, packet_id=7),
        mq.Publish("a/b", b"qos2", mq.QoS.EXACTLY_ONCE, dup=True, packet_id=8),
        mq.Subscribe(
            subscribe_id,
            (mq.SubscribeTopic("a/+", mq.QoS.AT_LEAST_ONCE), mq.SubscribeTopic("b/#", mq.QoS.EXACTLY_ONCE)),
        ),
        mq.Unsubscribe(unsubscribe_id, ("a/+", "b/#")),
        mq.PubAck(9),
        mq.PubRec(10),
        mq.PubRel(11),
        mq.PubComp(12),
        mq.PingReq(),
        mq.Disconnect(),
    ]
    assert [mq.encode(packet, 4) for packet in packets] == sent


def test_paho_v5_client_packets_decode() -> None:
    client, sent = _client(mqtt.MQTTv5)
    client.username_pw_set("user", "secret")
    client.will_set(
        "will/topic",
        b"gone",
        qos=2,
        properties=_paho_props(PacketTypes.WILLMESSAGE, WillDelayInterval=5, ContentType="text/plain"),
    )
    client._connect_properties = _paho_props(
        PacketTypes.CONNECT, SessionExpiryInterval=3600, ReceiveMaximum=20, UserProperty=[("k", "v")]
    )
    client._send_connect(15)
    publish_props = _paho_props(
        PacketTypes.PUBLISH,
        MessageExpiryInterval=60,
        ResponseTopic="reply/to",
        CorrelationData=b"\x01\x02",
        TopicAlias=3,
        PayloadFormatIndicator=1,
        UserProperty=[("a", "1"), ("a", "2")],
    )
    client._send_publish(5, b"a/b", b"payload", 1, False, False, None, publish_props)
    options = paho_subscribeoptions.SubscribeOptions(
        qos=1, noLocal=True, retainAsPublished=True, retainHandling=2
    )
    client._send_subscribe(
        False, [(b"a/+", options)], _paho_props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=42)
    )
    client._send_unsubscribe(False, [b"a/+"], _paho_props(PacketTypes.UNSUBSCRIBE, UserProperty=[("u", "x")]))
    client._send_disconnect(
        paho_reasoncodes.ReasonCode(PacketTypes.DISCONNECT, "Disconnect with will message"),
        _paho_props(PacketTypes.DISCONNECT, SessionExpiryInterval=0),
    )
    packets = _decode_server_side(sent)
    assert packets[0] == mq.Connect(
        "paho-cid",
        5,
        True,
        15,
        "user",
        b"secret",
        mq.Will(
            "will/topic",
            b"gone",
            mq.QoS.EXACTLY_ONCE,
            False,
            mq.Properties(will_delay_interval=5, content_type="text/plain"),
        ),
        mq.Properties(session_expiry_interval=3600, receive_maximum=20, user_properties=(("k", "v"),)),
    )
    assert packets[1] == mq.Publish(
        "a/b",
        b"payload",
        mq.QoS.AT_LEAST_ONCE,
        packet_id=5,
        properties=mq.Properties(
            payload_format_indicator=1,
            message_expiry_interval=60,
            response_topic="reply/to",
            correlation_data=b"\x01\x02",
            topic_alias=3,
            user_properties=(("a", "1"), ("a", "2")),
        ),
    )
    subscribe = packets[2]
    assert isinstance(subscribe, mq.Subscribe)
    assert subscribe.topics == (
        mq.SubscribeTopic("a/+", mq.QoS.AT_LEAST_ONCE, True, True, mq.RetainHandling.DO_NOT_SEND),
    )
    assert subscribe.properties == mq.Properties(subscription_identifiers=(42,))
    unsubscribe = packets[3]
    assert isinstance(unsubscribe, mq.Unsubscribe)
    assert unsubscribe.topic_filters == ("a/+",)
    assert unsubscribe.properties == mq.Properties(user_properties=(("u", "x"),))
    assert packets[4] == mq.Disconnect(
        mq.ReasonCode.DISCONNECT_WITH_WILL_MESSAGE, mq.Properties(session_expiry_interval=0)
    )
    # Our encoding of the same packets parses back identically (property order may differ from paho's).
    assert (
        mq.MqttDecoder(mq.MAX_PACKET_SIZE).receive_data(b"".join(mq.encode(p, 5) for p in packets)) == packets
    )


def _feed_paho(
    protocol: int, level: int, packets: list[mq.Packet], expect_rc: int = 0
) -> tuple[list[tuple[Any, ...]], list[bytes]]:
    client, sent = _client(protocol)
    seen: list[tuple[Any, ...]] = []
    client.on_connect = lambda _c, _u, flags, reason, props: seen.append(
        ("connect", flags.session_present, reason.value, props)
    )
    client.on_message = lambda _c, _u, msg: seen.append(
        ("message", msg.topic, msg.payload, msg.qos, msg.retain, msg.mid, msg.properties)
    )
    client.on_subscribe = lambda _c, _u, mid, reasons, props: seen.append(
        ("subscribe", mid, [r.value for r in reasons], props)
    )
    client.on_unsubscribe = lambda _c, _u, mid, reasons, props: seen.append(
        ("unsubscribe", mid, [r.value for r in reasons], props)
    )
    client.on_disconnect = lambda _c, _u, flags, reason, props: seen.append(
        ("disconnect", reason.value, props)
    )
    client._sock = _FakeSocket(b"".join(mq.encode(packet, level) for packet in packets))
    for _ in packets:
        assert client._packet_read() == expect_rc
    return seen, sent


def test_our_v5_server_packets_parse_in_paho() -> None:
    seen, sent = _feed_paho(
        mqtt.MQTTv5,
        5,
        [
            mq.Connack(
                True,
                properties=mq.Properties(
                    assigned_client_identifier="gen-1",
                    receive_maximum=10,
                    topic_alias_maximum=4,
                    maximum_qos=1,
                ),
            ),
            mq.Publish(
                "a/b",
                b"hi",
                mq.QoS.AT_LEAST_ONCE,
                retain=True,
                packet_id=3,
                properties=mq.Properties(subscription_identifiers=(1, 200), user_properties=(("k", "v"),)),
            ),
            mq.SubAck(1, (mq.ReasonCode.GRANTED_QOS_1, mq.ReasonCode.NOT_AUTHORIZED)),
            mq.UnsubAck(2, (mq.ReasonCode.NO_SUBSCRIPTION_EXISTED,)),
            mq.PingResp(),
            mq.Disconnect(mq.ReasonCode.SERVER_SHUTTING_DOWN, mq.Properties(reason_string="bye")),
        ],
    )
    kinds = [event[0] for event in seen]
    assert kinds == ["connect", "message", "subscribe", "unsubscribe", "disconnect"]
    connect, message, subscribe, unsubscribe, disconnect = seen
    assert connect[1:3] == (True, 0)
    assert connect[3].AssignedClientIdentifier == "gen-1"
    assert connect[3].ReceiveMaximum == 10
    assert connect[3].TopicAliasMaximum == 4
    assert connect[3].MaximumQoS == 1
    assert message[1:6] == ("a/b", b"hi", 1, True, 3)
    assert message[6].SubscriptionIdentifier == [1, 200]
    assert message[6].UserProperty == [("k", "v")]
    assert subscribe[1:3] == (1, [0x01, 0x87])
    assert unsubscribe[1:3] == (2, [0x11])
    assert disconnect[1] == 0x8B
    assert disconnect[2].ReasonString == "bye"
    # paho acknowledged the QoS 1 message; that PUBACK decodes as ours.
    assert mq.MqttDecoder(mq.MAX_PACKET_SIZE, protocol_level=5).receive_data(b"".join(sent)) == [mq.PubAck(3)]


def test_our_v311_server_packets_parse_in_paho() -> None:
    seen, sent = _feed_paho(
        mqtt.MQTTv311,
        4,
        [
            mq.Connack(False, mq.ReasonCode.SUCCESS),
            mq.Publish("x/y", b"\x00\xff", mq.QoS.EXACTLY_ONCE, packet_id=9),
            mq.SubAck(5, (mq.ReasonCode.GRANTED_QOS_2, mq.ReasonCode.UNSPECIFIED_ERROR)),
            mq.UnsubAck(6),
            mq.PingResp(),
        ],
    )
    assert [event[0] for event in seen] == ["connect", "subscribe", "unsubscribe"]
    assert seen[0][1:3] == (False, 0)
    assert seen[1][1:3] == (5, [0x02, 0x80])
    assert seen[2][1] == 6
    # QoS 2 inbound: paho answers PUBREC and delivers only after our PUBREL.
    assert mq.MqttDecoder(mq.MAX_PACKET_SIZE, protocol_level=4).receive_data(b"".join(sent)) == [mq.PubRec(9)]


def test_our_v311_refusal_parses_in_paho() -> None:
    seen, _ = _feed_paho(
        mqtt.MQTTv311,
        4,
        [mq.Connack(reason_code=mq.ReasonCode.BAD_USER_NAME_OR_PASSWORD)],
        expect_rc=mqtt.MQTT_ERR_CONN_REFUSED,
    )
    assert seen[0][0] == "connect"
    assert seen[0][2] == 0x86  # paho maps 3.1.1 return code 4 to the MQTT 5 reason code


_PAHO_TYPES = {
    "Byte": PropertyType.BYTE,
    "Two Byte Integer": PropertyType.TWO_BYTE_INT,
    "Four Byte Integer": PropertyType.FOUR_BYTE_INT,
    "Variable Byte Integer": PropertyType.VARINT,
    "Binary Data": PropertyType.BINARY,
    "UTF-8 Encoded String": PropertyType.UTF8,
    "UTF-8 String Pair": PropertyType.STRING_PAIR,
}


def _context(paho_packet_type: int) -> PropertyContext:
    return (
        PropertyContext.WILL
        if paho_packet_type == PacketTypes.WILLMESSAGE
        else PropertyContext(paho_packet_type)
    )


def test_property_table_matches_paho() -> None:
    """Identifiers, names, data types and allowed packets agree with paho's independent table."""
    table = paho_properties.Properties(PacketTypes.PUBLISH)
    assert set(table.properties) == set(PROPERTY_SPECS)
    for name, pid in table.names.items():
        spec = PROPERTY_SPECS[pid]
        paho_type, paho_packets = table.properties[pid]
        assert spec.id.name == name.upper().replace(" ", "_").replace("-", "_"), name
        assert spec.type is _PAHO_TYPES[table.types[paho_type]], name
        assert spec.contexts == {_context(packet) for packet in paho_packets}, name


_PAHO_SAMPLES: list[tuple[str, Any, mq.Properties]] = [
    ("PayloadFormatIndicator", 1, mq.Properties(payload_format_indicator=1)),
    ("MessageExpiryInterval", 3600, mq.Properties(message_expiry_interval=3600)),
    ("ContentType", "application/json", mq.Properties(content_type="application/json")),
    ("ResponseTopic", "reply/here", mq.Properties(response_topic="reply/here")),
    ("CorrelationData", b"\x00\x01", mq.Properties(correlation_data=b"\x00\x01")),
    ("SubscriptionIdentifier", 16_384, mq.Properties(subscription_identifiers=(16_384,))),
    ("SessionExpiryInterval", 0xFFFFFFFF, mq.Properties(session_expiry_interval=0xFFFFFFFF)),
    ("AssignedClientIdentifier", "auto-1", mq.Properties(assigned_client_identifier="auto-1")),
    ("ServerKeepAlive", 60, mq.Properties(server_keep_alive=60)),
    ("AuthenticationMethod", "SCRAM-SHA-1", mq.Properties(authentication_method="SCRAM-SHA-1")),
    ("RequestProblemInformation", 0, mq.Properties(request_problem_information=0)),
    ("WillDelayInterval", 30, mq.Properties(will_delay_interval=30)),
    ("RequestResponseInformation", 1, mq.Properties(request_response_information=1)),
    ("ResponseInformation", "resp/", mq.Properties(response_information="resp/")),
    ("ServerReference", "other:1883", mq.Properties(server_reference="other:1883")),
    ("ReasonString", "ünïcode", mq.Properties(reason_string="ünïcode")),
    ("ReceiveMaximum", 100, mq.Properties(receive_maximum=100)),
    ("TopicAliasMaximum", 10, mq.Properties(topic_alias_maximum=10)),
    ("TopicAlias", 9, mq.Properties(topic_alias=9)),
    ("MaximumQoS", 1, mq.Properties(maximum_qos=1)),
    ("RetainAvailable", 0, mq.Properties(retain_available=0)),
    ("UserProperty", ("key", "välue"), mq.Properties(user_properties=(("key", "välue"),))),
    ("MaximumPacketSize", 268_435_455, mq.Properties(maximum_packet_size=268_435_455)),
    ("WildcardSubscriptionAvailable", 1, mq.Properties(wildcard_subscription_available=1)),
    ("SubscriptionIdentifierAvailable", 0, mq.Properties(subscription_identifier_available=0)),
    ("SharedSubscriptionAvailable", 1, mq.Properties(shared_subscription_available=1)),
]


@pytest.mark.parametrize(("paho_name", "value", "ours"), _PAHO_SAMPLES, ids=[s[0] for s in _PAHO_SAMPLES])
def test_each_property_packs_like_paho(paho_name: str, value: Any, ours: mq.Properties) -> None:
    table = paho_properties.Properties(PacketTypes.PUBLISH)
    pid = table.getIdentFromName(paho_name)
    packet_type = table.properties[pid][1][0]
    theirs = paho_properties.Properties(packet_type)
    setattr(theirs, paho_name, value)
    context = _context(packet_type)
    packed = bytes(theirs.pack())
    assert decode_properties(Reader(packed), context) == ours
    assert encode_properties(ours, context) == packed
