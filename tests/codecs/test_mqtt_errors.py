"""Every MQTT violation the decoder and encoder refuse, with the reason code it maps to, plus fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.codecs import mqtt as mq
from mqproxy.codecs.mqtt.reason_codes import CONNACK_REASON_CODES, DISCONNECT_REASON_CODES

R = mq.ReasonCode
MALFORMED = R.MALFORMED_PACKET
PROTOCOL = R.PROTOCOL_ERROR


def frame(first: int, body_hex: str) -> bytes:
    """One packet: the first byte, a (short) remaining length, then the body."""
    body = bytes.fromhex(body_hex)
    assert len(body) < 128  # test helper limit, not codec input validation
    return bytes((first, len(body))) + body


CONNECT_V311 = frame(0x10, "00044d515454 04 02 003c 0003636964")
CONNECT_V5 = frame(0x10, "00044d515454 05 02 003c 00 0003636964")


def connect_v5(flags: str = "02", props: str = "00", rest: str = "0003636964") -> bytes:
    return frame(0x10, f"00044d515454 05 {flags} 003c {props} {rest}")


def connect_v311(flags: str = "02", rest: str = "0003636964") -> bytes:
    return frame(0x10, f"00044d515454 04 {flags} 003c {rest}")


def decode_error(
    raw: bytes, level: int | None, max_packet_size: int = mq.MAX_PACKET_SIZE
) -> mq.MqttCodecError:
    decoder = mq.MqttDecoder(max_packet_size, protocol_level=level)
    with pytest.raises(mq.MqttCodecError) as info:
        decoder.receive_data(raw)
    return info.value


SERVER = None  # server-side decoder: learns the level from CONNECT

BAD_INPUTS = [
    # framing and fixed header
    ("remaining-length-5-bytes", 4, bytes.fromhex("30ffffffff01"), MALFORMED),
    ("remaining-length-not-minimal", 4, bytes.fromhex("c08000"), MALFORMED),
    ("reserved-packet-type-0", 4, bytes.fromhex("0000"), MALFORMED),
    ("auth-in-v311", 4, bytes.fromhex("f000"), MALFORMED),
    ("pingreq-flags", 4, bytes.fromhex("c100"), MALFORMED),
    ("puback-flags", 4, frame(0x41, "0001"), MALFORMED),
    ("pubrel-flags-0000", 4, frame(0x60, "0001"), MALFORMED),
    ("subscribe-flags-0000", 4, frame(0x80, "0001 000161 00"), MALFORMED),
    ("unsubscribe-flags-0000", 4, frame(0xA0, "0001 000161"), MALFORMED),
    ("connect-flags", SERVER, bytes((0x11,)) + CONNECT_V311[1:], MALFORMED),
    ("publish-qos-3", 4, frame(0x36, "000174 0001"), MALFORMED),
    ("publish-dup-at-qos-0", 4, frame(0x38, "000174"), MALFORMED),
    # packet order (server side)
    ("publish-before-connect", SERVER, frame(0x30, "000174"), PROTOCOL),
    ("pingreq-before-connect", SERVER, bytes.fromhex("c000"), PROTOCOL),
    ("subscribe-before-connect", SERVER, frame(0x82, "0001 000161 00"), PROTOCOL),
    ("second-connect-v311", SERVER, CONNECT_V311 + CONNECT_V311, PROTOCOL),
    ("second-connect-v5", SERVER, CONNECT_V5 + CONNECT_V5, PROTOCOL),
    # CONNECT
    ("connect-unknown-protocol-name", SERVER, frame(0x10, "00044d515458 04 02 003c 0000"), PROTOCOL),
    ("connect-level-6", SERVER, frame(0x10, "00044d515454 06 02 003c 0000"), R.UNSUPPORTED_PROTOCOL_VERSION),
    (
        "connect-mqisdp-level-4",
        SERVER,
        frame(0x10, "00064d5149736470 04 02 003c 0000"),
        R.UNSUPPORTED_PROTOCOL_VERSION,
    ),
    ("connect-reserved-flag", SERVER, connect_v311("03"), MALFORMED),
    ("connect-will-qos-3", SERVER, connect_v311("1e", "0001630001740000"), MALFORMED),
    ("connect-will-qos-without-will", SERVER, connect_v311("0a"), MALFORMED),
    ("connect-will-retain-without-will", SERVER, connect_v311("22"), MALFORMED),
    ("connect-v311-password-without-user", SERVER, connect_v311("42", "0001630001ff"), MALFORMED),
    ("connect-client-id-invalid-utf8", SERVER, connect_v311("02", "0002c328"), MALFORMED),
    ("connect-client-id-nul", SERVER, connect_v311("02", "00026100"), MALFORMED),
    (
        "connect-will-topic-wildcard",
        SERVER,
        connect_v311("06", "000163 0003612f23 0000"),
        R.TOPIC_NAME_INVALID,
    ),
    ("connect-will-topic-nul", SERVER, connect_v311("06", "000163 00026100 0000"), MALFORMED),
    ("connect-truncated", SERVER, connect_v311("02", "000563"), MALFORMED),
    ("connect-trailing-bytes", SERVER, connect_v311("02", "000163 00"), MALFORMED),
    ("connect-v5-unknown-property", SERVER, connect_v5(props="02 7f00"), MALFORMED),
    ("connect-v5-property-not-allowed", SERVER, connect_v5(props="03 230001"), MALFORMED),
    ("connect-v5-duplicate-property", SERVER, connect_v5(props="0a 1100000001 1100000002"), PROTOCOL),
    ("connect-v5-receive-maximum-0", SERVER, connect_v5(props="03 210000"), PROTOCOL),
    ("connect-v5-maximum-packet-size-0", SERVER, connect_v5(props="05 2700000000"), PROTOCOL),
    ("connect-v5-request-problem-info-2", SERVER, connect_v5(props="02 1702"), PROTOCOL),
    ("connect-v5-property-length-too-long", SERVER, connect_v5(props="09 110000"), MALFORMED),
    ("connect-v5-will-property-in-connect", SERVER, connect_v5(props="05 1800000001"), MALFORMED),
    ("connect-v5-payload-format-3", SERVER, connect_v5("06", "00", "000163 02 0103 000174 0000"), PROTOCOL),
    # PUBLISH
    ("publish-topic-invalid-utf8", 4, frame(0x30, "0002c328"), MALFORMED),
    ("publish-topic-surrogate", 4, frame(0x30, "0003eda080"), MALFORMED),
    ("publish-topic-overlong-utf8", 4, frame(0x30, "0002c0af"), MALFORMED),
    ("publish-topic-nul", 5, frame(0x30, "0003610062 00"), MALFORMED),
    ("publish-topic-plus", 4, frame(0x30, "0003612f2b"), R.TOPIC_NAME_INVALID),
    ("publish-topic-hash", 5, frame(0x30, "000123 00"), R.TOPIC_NAME_INVALID),
    ("publish-empty-topic-v311", 4, frame(0x30, "0000 6869"), PROTOCOL),
    ("publish-empty-topic-no-alias-v5", 5, frame(0x30, "0000 00 6869"), PROTOCOL),
    ("publish-packet-id-0", 4, frame(0x32, "000174 0000"), PROTOCOL),
    ("publish-packet-id-0-v5", 5, frame(0x34, "000174 0000 00"), PROTOCOL),
    ("publish-topic-length-past-end", 4, frame(0x30, "000a74"), MALFORMED),
    ("publish-no-packet-id", 4, frame(0x32, "000174"), MALFORMED),
    ("publish-short-packet-id", 4, frame(0x32, "00017400"), MALFORMED),
    ("publish-one-byte-body", 4, frame(0x30, "00"), MALFORMED),
    ("publish-v5-no-property-length", 5, frame(0x30, "000174"), MALFORMED),
    ("publish-v5-topic-alias-0", 5, frame(0x30, "000174 03230000"), PROTOCOL),
    ("publish-v5-subscription-id-0", 5, frame(0x30, "000174 020b00"), PROTOCOL),
    ("publish-v5-duplicate-payload-format", 5, frame(0x30, "000174 0401000100"), PROTOCOL),
    ("publish-v5-property-varint-not-minimal", 5, frame(0x30, "000174 030b8100"), MALFORMED),
    ("publish-v5-property-varint-5-bytes", 5, frame(0x30, "000174 060bffffffff01"), MALFORMED),
    ("publish-v5-connect-property", 5, frame(0x30, "000174 051100000001"), MALFORMED),
    ("publish-v5-content-type-invalid-utf8", 5, frame(0x30, "000174 05030002c328"), MALFORMED),
    ("publish-v5-user-property-truncated", 5, frame(0x30, "000174 0426000161"), MALFORMED),
    # acknowledgements
    ("puback-packet-id-0", 4, frame(0x40, "0000"), PROTOCOL),
    ("puback-short", 4, frame(0x40, "00"), MALFORMED),
    ("puback-v311-extra-byte", 4, frame(0x40, "000100"), MALFORMED),
    ("puback-v5-bad-reason", 5, frame(0x40, "0001 92"), PROTOCOL),
    ("pubrel-v5-bad-reason", 5, frame(0x62, "0001 10"), PROTOCOL),
    ("pubcomp-v5-bad-properties", 5, frame(0x70, "0001 00 02 2301"), MALFORMED),
    ("connack-reserved-flags", 4, frame(0x20, "0200"), MALFORMED),
    ("connack-v311-return-code-6", 4, frame(0x20, "0006"), PROTOCOL),
    ("connack-session-present-with-refusal", 4, frame(0x20, "0105"), PROTOCOL),
    ("connack-v5-bad-reason", 5, frame(0x20, "0010 00"), PROTOCOL),
    ("connack-short", 4, frame(0x20, "00"), MALFORMED),
    # SUBSCRIBE / UNSUBSCRIBE
    ("subscribe-no-filters", 4, frame(0x82, "0001"), PROTOCOL),
    ("subscribe-no-filters-v5", 5, frame(0x82, "0001 00"), PROTOCOL),
    ("subscribe-packet-id-0", 4, frame(0x82, "0000 000161 00"), PROTOCOL),
    ("subscribe-qos-3", 4, frame(0x82, "0001 000161 03"), MALFORMED),
    ("subscribe-v311-option-bits", 4, frame(0x82, "0001 000161 04"), MALFORMED),
    ("subscribe-v5-reserved-option-bits", 5, frame(0x82, "0001 00 000161 40"), MALFORMED),
    ("subscribe-v5-retain-handling-3", 5, frame(0x82, "0001 00 000161 30"), PROTOCOL),
    ("subscribe-v5-no-local-shared", 5, frame(0x82, "0001 00 000a247368617265 2f672f61 04"), PROTOCOL),
    ("subscribe-v5-two-subscription-ids", 5, frame(0x82, "0001 04 0b010b02 000161 00"), PROTOCOL),
    ("subscribe-filter-missing-options", 4, frame(0x82, "0001 000161"), MALFORMED),
    ("subscribe-filter-hash-not-last", 4, frame(0x82, "0001 0005612f232f62 00"), R.TOPIC_FILTER_INVALID),
    ("subscribe-filter-partial-plus", 4, frame(0x82, "0001 0002612b 00"), R.TOPIC_FILTER_INVALID),
    ("subscribe-filter-empty", 4, frame(0x82, "0001 0000 00"), R.TOPIC_FILTER_INVALID),
    (
        "subscribe-share-without-filter",
        5,
        frame(0x82, "0001 00 0008247368617265 2f67 00"),
        R.TOPIC_FILTER_INVALID,
    ),
    (
        "subscribe-share-empty-group",
        5,
        frame(0x82, "0001 00 0009247368617265 2f2f61 00"),
        R.TOPIC_FILTER_INVALID,
    ),
    (
        "subscribe-share-wildcard-group",
        5,
        frame(0x82, "0001 00 000b247368617265 2f672b2f61 00"),
        R.TOPIC_FILTER_INVALID,
    ),
    ("subscribe-filter-invalid-utf8", 4, frame(0x82, "0001 0001ff 00"), MALFORMED),
    ("unsubscribe-no-filters", 4, frame(0xA2, "0001"), PROTOCOL),
    ("unsubscribe-packet-id-0", 5, frame(0xA2, "0000 00 000161"), PROTOCOL),
    ("unsubscribe-bad-filter", 4, frame(0xA2, "0001 0002232f"), R.TOPIC_FILTER_INVALID),
    ("suback-v311-bad-code", 4, frame(0x90, "0001 03"), PROTOCOL),
    ("suback-no-codes", 4, frame(0x90, "0001"), PROTOCOL),
    ("suback-v5-bad-code", 5, frame(0x90, "0001 00 10"), PROTOCOL),
    ("unsuback-v311-extra", 4, frame(0xB0, "0001 00"), MALFORMED),
    ("unsuback-v5-no-codes", 5, frame(0xB0, "0001 00"), PROTOCOL),
    ("unsuback-v5-bad-code", 5, frame(0xB0, "0001 00 02"), PROTOCOL),
    # PINGREQ, DISCONNECT, AUTH
    ("pingreq-with-body", 4, frame(0xC0, "00"), MALFORMED),
    ("pingresp-with-body", 5, frame(0xD0, "00"), MALFORMED),
    ("disconnect-v311-with-body", 4, frame(0xE0, "00"), MALFORMED),
    ("disconnect-v5-bad-reason", 5, frame(0xE0, "01"), PROTOCOL),
    ("disconnect-v5-bad-property", 5, frame(0xE0, "00 02 0101"), MALFORMED),
    ("auth-v5-bad-reason", 5, frame(0xF0, "01"), PROTOCOL),
    ("auth-v5-truncated-properties", 5, frame(0xF0, "18 05 150003"), MALFORMED),
]


@pytest.mark.parametrize(
    ("level", "raw", "reason_code"),
    [pytest.param(level, raw, code, id=name) for name, level, raw, code in BAD_INPUTS],
)
def test_bad_input_maps_to_reason_code(level: int | None, raw: bytes, reason_code: mq.ReasonCode) -> None:
    error = decode_error(raw, level)
    assert error.reason_code == reason_code, error.reason
    assert error.reason


@pytest.mark.parametrize(
    ("level", "raw", "reason_code"),
    [pytest.param(level, raw, code, id=name) for name, level, raw, code in BAD_INPUTS],
)
def test_bad_input_split_at_every_offset(level: int | None, raw: bytes, reason_code: mq.ReasonCode) -> None:
    """Splitting never changes the verdict, and a partial prefix never hides it past the packet's end."""
    for offset in range(len(raw) + 1):
        decoder = mq.MqttDecoder(mq.MAX_PACKET_SIZE, protocol_level=level)
        assert _verdict(decoder, [raw[:offset], raw[offset:]]) == reason_code, offset


def test_oversized_packet_refused_before_payload() -> None:
    decoder = mq.MqttDecoder(100, protocol_level=4)
    decoder.receive_data(b"\x30")
    with pytest.raises(mq.MqttCodecError) as info:
        decoder.receive_data(b"\x63")  # 99 bytes of body + 2 of header = 101 > 100
    assert info.value.reason_code == R.PACKET_TOO_LARGE


def test_packet_at_maximum_size_accepted() -> None:
    body = b"\x00\x01t" + b"x" * 95
    raw = b"\x30" + bytes((len(body),)) + body
    assert len(raw) == 100
    assert mq.MqttDecoder(100, protocol_level=4).receive_data(raw) == [mq.Publish("t", b"x" * 95)]


def test_four_byte_length_refused_on_its_fourth_byte() -> None:
    decoder = mq.MqttDecoder(mq.MAX_PACKET_SIZE, protocol_level=4)
    assert decoder.receive_data(b"\x30\xff\xff\xff") == []
    with pytest.raises(mq.MqttCodecError) as info:
        decoder.receive_data(b"\xff")
    assert info.value.reason_code == MALFORMED


def test_first_byte_checked_before_length() -> None:
    with pytest.raises(mq.MqttCodecError) as info:
        mq.MqttDecoder(mq.MAX_PACKET_SIZE).receive_data(b"\x30")
    assert info.value.reason_code == PROTOCOL


def test_decoder_stays_failed() -> None:
    decoder = mq.MqttDecoder(mq.MAX_PACKET_SIZE)
    with pytest.raises(mq.MqttCodecError) as first:
        decoder.receive_data(b"\xc0\x00")
    with pytest.raises(mq.MqttCodecError) as again:
        decoder.receive_data(CONNECT_V311)
    assert again.value is first.value


def test_protocol_level_known_after_connect_error() -> None:
    """A CONNECT that fails after its level byte still tells the session which CONNACK format to use."""
    decoder = mq.MqttDecoder(mq.MAX_PACKET_SIZE)
    with pytest.raises(mq.MqttCodecError) as info:
        decoder.receive_data(connect_v5(props="03 210000"))
    assert info.value.reason_code == PROTOCOL
    assert decoder.protocol_level == 5
    unsupported = mq.MqttDecoder(mq.MAX_PACKET_SIZE)
    with pytest.raises(mq.MqttCodecError):
        unsupported.receive_data(frame(0x10, "00044d515454 06 02 003c 0000"))
    assert unsupported.protocol_level is None


def test_v5_password_without_user_name_allowed() -> None:
    packets = mq.MqttDecoder(mq.MAX_PACKET_SIZE).receive_data(connect_v5("42", "00", "000163 0002abcd"))
    assert packets == [mq.Connect("c", 5, True, 60, None, b"\xab\xcd")]


def test_decoder_rejects_bad_configuration() -> None:
    with pytest.raises(ValueError, match="max_packet_size"):
        mq.MqttDecoder(1)
    with pytest.raises(ValueError, match="protocol_level"):
        mq.MqttDecoder(1000, protocol_level=6)


BAD_PACKETS: list[tuple[str, mq.Packet, int, mq.ReasonCode]] = [
    ("publish-wildcard-topic", mq.Publish("a/#"), 4, R.TOPIC_NAME_INVALID),
    ("publish-empty-topic-v311", mq.Publish(""), 4, PROTOCOL),
    ("publish-empty-topic-no-alias", mq.Publish(""), 5, PROTOCOL),
    ("publish-packet-id-0", mq.Publish("t", qos=mq.QoS.AT_LEAST_ONCE, packet_id=0), 4, PROTOCOL),
    ("publish-qos1-no-packet-id", mq.Publish("t", qos=mq.QoS.AT_LEAST_ONCE), 4, PROTOCOL),
    ("publish-qos0-with-packet-id", mq.Publish("t", packet_id=1), 4, PROTOCOL),
    ("publish-dup-at-qos0", mq.Publish("t", dup=True), 4, MALFORMED),
    ("publish-topic-nul", mq.Publish("a\x00"), 4, MALFORMED),
    ("publish-topic-surrogate", mq.Publish("a\ud800"), 4, MALFORMED),
    ("publish-topic-too-long", mq.Publish("a" * 65536), 4, MALFORMED),
    ("publish-alias-0", mq.Publish("t", properties=mq.Properties(topic_alias=0)), 5, PROTOCOL),
    ("publish-connect-property", mq.Publish("t", properties=mq.Properties(receive_maximum=5)), 5, MALFORMED),
    ("connect-password-without-user-v311", mq.Connect("c", password=b"p"), 4, MALFORMED),
    ("connect-level-6", mq.Connect("c", protocol_level=6), 4, R.UNSUPPORTED_PROTOCOL_VERSION),
    ("connect-will-wildcard", mq.Connect("c", will=mq.Will("a/+", b"")), 4, R.TOPIC_NAME_INVALID),
    ("connect-keep-alive-too-big", mq.Connect("c", keep_alive=70000), 4, MALFORMED),
    (
        "connect-receive-maximum-0",
        mq.Connect("c", 5, properties=mq.Properties(receive_maximum=0)),
        5,
        PROTOCOL,
    ),
    (
        "connect-user-property-nul",
        mq.Connect("c", 5, properties=mq.Properties(user_properties=(("a\x00", ""),))),
        5,
        MALFORMED,
    ),
    ("connect-binary-too-long", mq.Connect("c", password=b"x" * 65536, username="u"), 4, MALFORMED),
    ("subscribe-empty", mq.Subscribe(1, ()), 4, PROTOCOL),
    ("subscribe-bad-filter", mq.Subscribe(1, (mq.SubscribeTopic("a#"),)), 4, R.TOPIC_FILTER_INVALID),
    (
        "subscribe-two-ids",
        mq.Subscribe(1, (mq.SubscribeTopic("a"),), mq.Properties(subscription_identifiers=(1, 2))),
        5,
        PROTOCOL,
    ),
    (
        "subscribe-no-local-shared",
        mq.Subscribe(1, (mq.SubscribeTopic("$share/g/a", no_local=True),)),
        5,
        PROTOCOL,
    ),
    ("suback-empty", mq.SubAck(1, ()), 4, PROTOCOL),
    ("suback-puback-code", mq.SubAck(1, (R.NO_MATCHING_SUBSCRIBERS,)), 5, PROTOCOL),
    ("puback-suback-code", mq.PubAck(1, R.GRANTED_QOS_1), 5, PROTOCOL),
    ("puback-packet-id-65536", mq.PubAck(65536), 4, PROTOCOL),
    ("auth-in-v311", mq.Auth(), 4, MALFORMED),
    ("any-level-6", mq.PubAck(1), 6, R.UNSUPPORTED_PROTOCOL_VERSION),
]


@pytest.mark.parametrize(
    ("packet", "level", "reason_code"),
    [pytest.param(packet, level, code, id=name) for name, packet, level, code in BAD_PACKETS],
)
def test_encoder_refuses(packet: mq.Packet, level: int, reason_code: mq.ReasonCode) -> None:
    with pytest.raises(mq.MqttCodecError) as info:
        mq.encode(packet, level)
    assert info.value.reason_code == reason_code, info.value.reason


def test_encoder_refuses_non_packets() -> None:
    with pytest.raises(TypeError):
        mq.encode("PINGREQ", 4)  # type: ignore[arg-type]


def _verdict(decoder: mq.MqttDecoder, chunks: list[bytes]) -> mq.ReasonCode | None:
    """Feed the chunks in order; the reason code of the MqttCodecError raised, or None if none was."""
    try:
        for chunk in chunks:
            decoder.receive_data(chunk)
    except mq.MqttCodecError as error:
        return error.reason_code
    return None


def _chunks(data: bytes, step: int) -> list[bytes]:
    return [data[index : index + step] for index in range(0, len(data), step)]


@settings(max_examples=250, deadline=None)
@given(
    data=st.binary(max_size=200),
    level=st.sampled_from([None, 3, 4, 5]),
    step=st.integers(min_value=1, max_value=64),
)
def test_fuzz_random_bytes_raise_only_codec_error(data: bytes, level: int | None, step: int) -> None:
    verdict = _verdict(mq.MqttDecoder(1024, protocol_level=level), _chunks(data, step))
    whole = _verdict(mq.MqttDecoder(1024, protocol_level=level), [data])
    assert verdict == whole  # any other exception fails the test; chunking never changes the verdict


@settings(max_examples=250, deadline=None)
@given(
    prefix=st.sampled_from([CONNECT_V311, CONNECT_V5]),
    data=st.binary(max_size=200),
    step=st.integers(min_value=1, max_value=64),
)
def test_fuzz_after_connect_raises_only_codec_error(prefix: bytes, data: bytes, step: int) -> None:
    verdict = _verdict(mq.MqttDecoder(1024), _chunks(prefix + data, step))
    assert verdict == _verdict(mq.MqttDecoder(1024), [prefix + data])


_MUTATION_BASE = [
    (
        5,
        bytes.fromhex(
            "3232 0003612f62 0005 28 0101 020000003c 03000474657874 080003722f74 090002abcd"
            " 0b01 0b8001 230001 26000161000162 6869"
        ),
    ),
    (
        5,
        bytes.fromhex(
            "1036 00044d515454 05 d6 001e 0f 1100000078 210014 2600016b000176 00026964"
            " 07 0101 1800000005 000174 0000 000475736572 0003010203"
        ),
    ),
    (5, bytes.fromhex("8218 0001 02 0b05 0003612f2b 2d 000a247368617265 2f672f78 00")),
    (4, bytes.fromhex("101d 00044d515454 04 ec 000a 000163 0003772f74 0003627965 000175 000170")),
    (5, bytes.fromhex("e00d 8e 0b 1100000000 1f0003627965")),
]


@settings(max_examples=300, deadline=None)
@given(
    base=st.sampled_from(_MUTATION_BASE),
    index=st.integers(min_value=0, max_value=200),
    value=st.integers(min_value=0, max_value=255),
)
def test_fuzz_mutated_golden_raises_only_codec_error(base: tuple[int, bytes], index: int, value: int) -> None:
    level, raw = base
    mutated = bytearray(raw)
    mutated[index % len(raw)] = value
    try:
        packets = mq.MqttDecoder(1024, protocol_level=level).receive_data(bytes(mutated))
    except mq.MqttCodecError:
        return
    for packet in packets:  # whatever decodes must re-encode and decode to itself
        assert mq.MqttDecoder(1024, protocol_level=level).receive_data(mq.encode(packet, level)) == [packet]


def test_every_reason_code_can_be_sent() -> None:
    """Errors in a CONNECT fit a CONNACK; every other decode error fits a DISCONNECT."""
    for name, level, raw, _ in BAD_INPUTS:
        error = decode_error(raw, level)
        allowed = CONNACK_REASON_CODES if name.startswith("connect-") else DISCONNECT_REASON_CODES
        assert error.reason_code in allowed, name
