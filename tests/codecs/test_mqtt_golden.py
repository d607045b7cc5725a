"""Golden bytes for every MQTT packet type at 3.1.1 (and 3.1) and 5.0, hand-written from the specification."""

from __future__ import annotations

import pytest

from mqproxy.codecs import mqtt as mq

R = mq.ReasonCode


def h(text: str) -> bytes:
    return bytes.fromhex(text)


GOLDEN_V311: list[tuple[str, mq.Packet, bytes]] = [
    ("connect-minimal", mq.Connect("cid"), h("100f 00044d515454 04 02 003c 0003636964")),
    (
        "connect-will-credentials",
        mq.Connect(
            "c",
            clean_start=False,
            keep_alive=10,
            username="u",
            password=b"p",
            will=mq.Will("w/t", b"bye", mq.QoS.AT_LEAST_ONCE, retain=True),
        ),
        h("101d 00044d515454 04 ec 000a 000163 0003772f74 0003627965 000175 000170"),
    ),
    ("connack-session-present", mq.Connack(session_present=True), h("2002 0100")),
    ("connack-refused", mq.Connack(reason_code=R.NOT_AUTHORIZED), h("2002 0005")),
    ("connack-bad-version", mq.Connack(reason_code=R.UNSUPPORTED_PROTOCOL_VERSION), h("2002 0001")),
    ("publish-qos0", mq.Publish("a/b", b"hi"), h("3007 0003612f62 6869")),
    (
        "publish-qos1-dup-retain",
        mq.Publish("a/b", b"hi", mq.QoS.AT_LEAST_ONCE, retain=True, dup=True, packet_id=0x1234),
        h("3b09 0003612f62 1234 6869"),
    ),
    ("publish-qos2-empty", mq.Publish("t", b"", mq.QoS.EXACTLY_ONCE, packet_id=65535), h("3405 000174 ffff")),
    ("puback", mq.PubAck(1), h("4002 0001")),
    ("pubrec", mq.PubRec(2), h("5002 0002")),
    ("pubrel", mq.PubRel(3), h("6202 0003")),
    ("pubcomp", mq.PubComp(4), h("7002 0004")),
    (
        "subscribe",
        mq.Subscribe(
            10,
            (mq.SubscribeTopic("a/+", mq.QoS.AT_LEAST_ONCE), mq.SubscribeTopic("b/#", mq.QoS.EXACTLY_ONCE)),
        ),
        h("820e 000a 0003612f2b 01 0003622f23 02"),
    ),
    ("suback", mq.SubAck(10, (R.GRANTED_QOS_1, R.GRANTED_QOS_2, R.UNSPECIFIED_ERROR)), h("9005 000a 010280")),
    ("unsubscribe", mq.Unsubscribe(11, ("a/+",)), h("a207 000b 0003612f2b")),
    ("unsuback", mq.UnsubAck(11), h("b002 000b")),
    ("pingreq", mq.PingReq(), h("c000")),
    ("pingresp", mq.PingResp(), h("d000")),
    ("disconnect", mq.Disconnect(), h("e000")),
]

GOLDEN_V31: list[tuple[str, mq.Packet, bytes]] = [
    ("connect-mqisdp", mq.Connect("cid", protocol_level=3), h("1011 00064d5149736470 03 02 003c 0003636964")),
]

CONNECT_V5_FULL = mq.Connect(
    "id",
    protocol_level=5,
    clean_start=True,
    keep_alive=30,
    username="user",
    password=b"\x01\x02\x03",
    will=mq.Will(
        "t",
        b"",
        mq.QoS.EXACTLY_ONCE,
        properties=mq.Properties(payload_format_indicator=1, will_delay_interval=5),
    ),
    properties=mq.Properties(session_expiry_interval=120, receive_maximum=20, user_properties=(("k", "v"),)),
)

PUBLISH_V5_FULL = mq.Publish(
    "a/b",
    b"hi",
    mq.QoS.AT_LEAST_ONCE,
    packet_id=5,
    properties=mq.Properties(
        payload_format_indicator=1,
        message_expiry_interval=60,
        content_type="text",
        response_topic="r/t",
        correlation_data=b"\xab\xcd",
        subscription_identifiers=(1, 128),
        topic_alias=1,
        user_properties=(("a", "b"),),
    ),
)

GOLDEN_V5: list[tuple[str, mq.Packet, bytes]] = [
    ("connect-minimal", mq.Connect("cid", protocol_level=5), h("1010 00044d515454 05 02 003c 00 0003636964")),
    (
        "connect-full",
        CONNECT_V5_FULL,
        h(
            "1036 00044d515454 05 d6 001e"
            " 0f 1100000078 210014 2600016b000176"
            " 00026964"
            " 07 0101 1800000005"
            " 000174 0000 000475736572 0003010203"
        ),
    ),
    ("connack-success", mq.Connack(), h("2003 0000 00")),
    (
        "connack-properties",
        mq.Connack(
            session_present=True,
            properties=mq.Properties(
                assigned_client_identifier="abc", receive_maximum=10, topic_alias_maximum=5
            ),
        ),
        h("200f 0100 0c 120003616263 21000a 220005"),
    ),
    ("connack-refused", mq.Connack(reason_code=R.NOT_AUTHORIZED), h("2003 0087 00")),
    ("publish-qos0", mq.Publish("a/b", b"hi"), h("3008 0003612f62 00 6869")),
    (
        "publish-qos1-properties",
        PUBLISH_V5_FULL,
        h(
            "3232 0003612f62 0005 28"
            " 0101 020000003c 03000474657874 080003722f74 090002abcd 0b01 0b8001 230001 26000161000162"
            " 6869"
        ),
    ),
    (
        "publish-empty-user-property",
        mq.Publish("a/b", b"hi", properties=mq.Properties(user_properties=(("", ""),))),
        h("300d 0003612f62 05 2600000000 6869"),
    ),
    (
        "publish-topic-alias-only",
        mq.Publish("", b"x", properties=mq.Properties(topic_alias=2)),
        h("3007 0000 03230002 78"),
    ),
    ("puback-success", mq.PubAck(1), h("4002 0001")),
    ("puback-no-subscribers", mq.PubAck(1, R.NO_MATCHING_SUBSCRIBERS), h("4003 0001 10")),
    (
        "puback-reason-string",
        mq.PubAck(1, R.NOT_AUTHORIZED, mq.Properties(reason_string="no")),
        h("4009 0001 87 05 1f00026e6f"),
    ),
    ("pubrec-failure", mq.PubRec(2, R.UNSPECIFIED_ERROR), h("5003 0002 80")),
    ("pubrel-not-found", mq.PubRel(3, R.PACKET_IDENTIFIER_NOT_FOUND), h("6203 0003 92")),
    ("pubcomp", mq.PubComp(4), h("7002 0004")),
    (
        "subscribe-options",
        mq.Subscribe(
            1,
            (
                mq.SubscribeTopic(
                    "a/+",
                    mq.QoS.AT_LEAST_ONCE,
                    no_local=True,
                    retain_as_published=True,
                    retain_handling=mq.RetainHandling.DO_NOT_SEND,
                ),
                mq.SubscribeTopic("$share/g/x"),
            ),
            mq.Properties(subscription_identifiers=(5,)),
        ),
        h("8218 0001 02 0b05 0003612f2b 2d 000a247368617265 2f672f78 00"),
    ),
    (
        "suback",
        mq.SubAck(
            1, (R.GRANTED_QOS_1, R.GRANTED_QOS_0, R.NOT_AUTHORIZED, R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED)
        ),
        h("9007 0001 00 010087a2"),
    ),
    ("unsubscribe", mq.Unsubscribe(2, ("a/+",)), h("a208 0002 00 0003612f2b")),
    ("unsuback", mq.UnsubAck(2, (R.NO_SUBSCRIPTION_EXISTED,)), h("b004 0002 00 11")),
    ("pingreq", mq.PingReq(), h("c000")),
    ("pingresp", mq.PingResp(), h("d000")),
    ("disconnect-normal", mq.Disconnect(), h("e000")),
    ("disconnect-with-will", mq.Disconnect(R.DISCONNECT_WITH_WILL_MESSAGE), h("e001 04")),
    (
        "disconnect-properties",
        mq.Disconnect(R.SESSION_TAKEN_OVER, mq.Properties(session_expiry_interval=0, reason_string="bye")),
        h("e00d 8e 0b 1100000000 1f0003627965"),
    ),
    ("auth-success", mq.Auth(), h("f000")),
    (
        "auth-continue",
        mq.Auth(
            R.CONTINUE_AUTHENTICATION,
            mq.Properties(authentication_method="SCRA", authentication_data=b"\x01\x02"),
        ),
        h("f00e 18 0c 15000453435241 1600020102"),
    ),
]

ALL_GOLDEN = (
    [pytest.param(4, packet, raw, id=f"v311-{name}") for name, packet, raw in GOLDEN_V311]
    + [pytest.param(3, packet, raw, id=f"v31-{name}") for name, packet, raw in GOLDEN_V31]
    + [pytest.param(5, packet, raw, id=f"v5-{name}") for name, packet, raw in GOLDEN_V5]
)


def _decode_all(level: int, *chunks: bytes) -> list[mq.Packet]:
    decoder = mq.MqttDecoder(mq.MAX_PACKET_SIZE, protocol_level=level)
    packets: list[mq.Packet] = []
    for chunk in chunks:
        packets += decoder.receive_data(chunk)
    return packets


@pytest.mark.parametrize(("level", "packet", "raw"), ALL_GOLDEN)
def test_encode_golden(level: int, packet: mq.Packet, raw: bytes) -> None:
    assert mq.encode(packet, level) == raw


@pytest.mark.parametrize(("level", "packet", "raw"), ALL_GOLDEN)
def test_decode_golden(level: int, packet: mq.Packet, raw: bytes) -> None:
    assert _decode_all(level, raw) == [packet]


@pytest.mark.parametrize(("level", "packet", "raw"), ALL_GOLDEN)
def test_decode_split_at_every_offset(level: int, packet: mq.Packet, raw: bytes) -> None:
    for offset in range(len(raw) + 1):
        assert _decode_all(level, raw[:offset], raw[offset:]) == [packet], offset


@pytest.mark.parametrize(("level", "packet", "raw"), ALL_GOLDEN)
def test_decode_byte_by_byte_between_two_copies(level: int, packet: mq.Packet, raw: bytes) -> None:
    stream = raw + raw
    decoder = mq.MqttDecoder(mq.MAX_PACKET_SIZE, protocol_level=level)
    seen: list[mq.Packet] = []
    for index in range(len(stream)):
        seen += decoder.receive_data(stream[index : index + 1])
        assert len(seen) == (index + 1) // len(raw)
    assert seen == [packet, packet]


@pytest.mark.parametrize(
    ("level", "golden"),
    [pytest.param(4, GOLDEN_V311, id="v311"), pytest.param(5, GOLDEN_V5, id="v5")],
)
def test_server_side_session_in_one_chunk(level: int, golden: list[tuple[str, mq.Packet, bytes]]) -> None:
    """A server-side decoder learns the level from CONNECT and then decodes every other packet."""
    connect = next(raw for name, _, raw in golden if name.startswith("connect-minimal"))
    rest = [(packet, raw) for name, packet, raw in golden if not name.startswith("connect")]
    decoder = mq.MqttDecoder(mq.MAX_PACKET_SIZE)
    assert decoder.protocol_level is None
    packets = decoder.receive_data(connect + b"".join(raw for _, raw in rest))
    assert decoder.protocol_level == level
    assert packets[1:] == [packet for packet, _ in rest]
    assert isinstance(packets[0], mq.Connect)
    assert packets[0].protocol_level == level


NON_CANONICAL_V5 = [
    pytest.param(h("4003 0001 00"), mq.PubAck(1), id="puback-explicit-success"),
    pytest.param(h("4004 0001 00 00"), mq.PubAck(1), id="puback-empty-properties"),
    pytest.param(h("6204 0003 00 00"), mq.PubRel(3), id="pubrel-empty-properties"),
    pytest.param(h("e001 00"), mq.Disconnect(), id="disconnect-explicit-normal"),
    pytest.param(h("e002 00 00"), mq.Disconnect(), id="disconnect-empty-properties"),
    pytest.param(h("f002 00 00"), mq.Auth(), id="auth-empty-properties"),
]


@pytest.mark.parametrize(("raw", "packet"), NON_CANONICAL_V5)
def test_decode_non_canonical_v5(raw: bytes, packet: mq.Packet) -> None:
    assert _decode_all(5, raw) == [packet]


def test_v311_translates_v5_reason_codes() -> None:
    assert mq.encode(mq.Connack(reason_code=R.BANNED), 4) == h("2002 0005")
    assert mq.encode(mq.Connack(reason_code=R.SERVER_BUSY), 4) == h("2002 0003")
    assert mq.encode(mq.Connack(reason_code=R.CLIENT_IDENTIFIER_NOT_VALID), 4) == h("2002 0002")
    assert mq.encode(mq.SubAck(1, (R.NOT_AUTHORIZED, R.GRANTED_QOS_0)), 4) == h("9004 0001 8000")


def test_v311_drops_what_it_cannot_carry() -> None:
    props = mq.Properties(reason_string="why", user_properties=(("k", "v"),))
    assert mq.encode(mq.PubAck(7, R.NO_MATCHING_SUBSCRIBERS, props), 4) == h("4002 0007")
    assert mq.encode(mq.UnsubAck(7, (R.NO_SUBSCRIPTION_EXISTED,), props), 4) == h("b002 0007")
    assert mq.encode(mq.Disconnect(R.SERVER_SHUTTING_DOWN, props), 4) == h("e000")
    assert mq.encode(mq.Publish("a", b"", properties=mq.Properties(message_expiry_interval=3)), 4) == h(
        "3003 000161"
    )
    options = mq.SubscribeTopic(
        "a", mq.QoS.AT_LEAST_ONCE, no_local=True, retain_handling=mq.RetainHandling.DO_NOT_SEND
    )
    assert mq.encode(mq.Subscribe(1, (options,), mq.Properties(subscription_identifiers=(3,))), 4) == h(
        "8206 0001 000161 01"
    )
