"""MQTT 5 property table: identifiers, data types, golden encodings; and the package stays sans-IO."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

import mqproxy.codecs.mqtt as mqtt_package
from mqproxy.codecs.mqtt import MqttCodecError, Properties, PropertyId, ReasonCode
from mqproxy.codecs.mqtt.encoding import Reader
from mqproxy.codecs.mqtt.properties import (
    NO_PROPERTIES,
    PROPERTY_SPECS,
    PropertyContext,
    decode_properties,
    encode_properties,
)

C = PropertyContext

# (attribute, value, context it is valid in, encoded identifier + value) -- from MQTT 5.0 section 2.2.2.2.
GOLDEN_PROPERTIES: list[tuple[str, Any, PropertyContext, str]] = [
    ("payload_format_indicator", 1, C.PUBLISH, "01 01"),
    ("message_expiry_interval", 0x01020304, C.PUBLISH, "02 01020304"),
    ("content_type", "a", C.WILL, "03 000161"),
    ("response_topic", "r", C.PUBLISH, "08 000172"),
    ("correlation_data", b"\x00\xff", C.PUBLISH, "09 000200ff"),
    ("subscription_identifiers", (268_435_455,), C.SUBSCRIBE, "0b ffffff7f"),
    ("session_expiry_interval", 0xFFFFFFFF, C.CONNECT, "11 ffffffff"),
    ("assigned_client_identifier", "id", C.CONNACK, "12 00026964"),
    ("server_keep_alive", 60, C.CONNACK, "13 003c"),
    ("authentication_method", "m", C.AUTH, "15 00016d"),
    ("request_problem_information", 0, C.CONNECT, "17 00"),
    ("will_delay_interval", 5, C.WILL, "18 00000005"),
    ("request_response_information", 1, C.CONNECT, "19 01"),
    ("response_information", "ri", C.CONNACK, "1a 00027269"),
    ("server_reference", "s", C.DISCONNECT, "1c 000173"),
    ("reason_string", "why", C.PUBACK, "1f 0003776879"),
    ("receive_maximum", 65535, C.CONNACK, "21 ffff"),
    ("topic_alias_maximum", 0, C.CONNECT, "22 0000"),
    ("topic_alias", 7, C.PUBLISH, "23 0007"),
    ("maximum_qos", 1, C.CONNACK, "24 01"),
    ("retain_available", 0, C.CONNACK, "25 00"),
    ("user_properties", (("k", "v"), ("k", "w")), C.UNSUBACK, "26 00016b000176 26 00016b000177"),
    ("maximum_packet_size", 1024, C.CONNECT, "27 00000400"),
    ("wildcard_subscription_available", 1, C.CONNACK, "28 01"),
    ("subscription_identifier_available", 0, C.CONNACK, "29 00"),
    ("shared_subscription_available", 1, C.CONNACK, "2a 01"),
]


def test_every_property_has_a_golden_case_and_a_field() -> None:
    fields = {field.name for field in dataclasses.fields(Properties)}
    covered = {attribute for attribute, *_ in GOLDEN_PROPERTIES} | {"authentication_data"}  # see below
    assert covered == fields
    assert set(PROPERTY_SPECS) == {int(pid) for pid in PropertyId}
    assert len(PROPERTY_SPECS) == 27


@pytest.mark.parametrize(("attribute", "value", "context", "raw_hex"), GOLDEN_PROPERTIES)
def test_property_golden(attribute: str, value: Any, context: PropertyContext, raw_hex: str) -> None:
    raw = bytes.fromhex(raw_hex)
    properties = Properties(**{attribute: value})
    encoded = encode_properties(properties, context)
    assert encoded == bytes((len(raw),)) + raw
    reader = Reader(encoded)
    assert decode_properties(reader, context) == properties
    assert reader.remaining == 0


def test_authentication_data_with_method() -> None:
    properties = Properties(authentication_method="m", authentication_data=b"d")
    encoded = encode_properties(properties, C.CONNECT)
    assert encoded == bytes.fromhex("08 15 00016d 16 000164")
    assert decode_properties(Reader(encoded), C.CONNECT) == properties
    with pytest.raises(MqttCodecError) as info:
        encode_properties(Properties(authentication_data=b"d"), C.CONNACK)
    assert info.value.reason_code == ReasonCode.PROTOCOL_ERROR


def test_empty_properties() -> None:
    assert encode_properties(NO_PROPERTIES, C.PUBLISH) == b"\x00"
    assert decode_properties(Reader(b"\x00"), C.PUBLISH) is NO_PROPERTIES


def test_subscription_identifiers_repeat_only_in_publish() -> None:
    raw = bytes.fromhex("04 0b01 0b02")
    assert decode_properties(Reader(raw), C.PUBLISH) == Properties(subscription_identifiers=(1, 2))
    with pytest.raises(MqttCodecError) as info:
        decode_properties(Reader(raw), C.SUBSCRIBE)
    assert info.value.reason_code == ReasonCode.PROTOCOL_ERROR


@pytest.mark.parametrize(
    ("raw_hex", "context", "reason_code"),
    [
        ("02 2301", C.PUBLISH, ReasonCode.MALFORMED_PACKET),  # truncated two-byte int
        ("03 230000", C.PUBLISH, ReasonCode.PROTOCOL_ERROR),  # topic alias 0
        ("02 0102", C.PUBLISH, ReasonCode.PROTOCOL_ERROR),  # payload format indicator 2
        ("02 2402", C.CONNACK, ReasonCode.PROTOCOL_ERROR),  # maximum QoS 2
        ("03 130001", C.CONNECT, ReasonCode.MALFORMED_PACKET),  # server keep alive in CONNECT
        ("02 0b00", C.SUBSCRIBE, ReasonCode.PROTOCOL_ERROR),  # subscription identifier 0
        ("04 1f0001ff", C.PUBACK, ReasonCode.MALFORMED_PACKET),  # reason string not UTF-8
        ("04 1f000100", C.PUBACK, ReasonCode.MALFORMED_PACKET),  # reason string with U+0000
        ("06 1f00006161", C.PUBACK, ReasonCode.MALFORMED_PACKET),  # length longer than the packet
        ("02 00 00", C.PUBLISH, ReasonCode.MALFORMED_PACKET),  # identifier 0 is unknown
        ("02 8001", C.PUBLISH, ReasonCode.MALFORMED_PACKET),  # identifier 128 is unknown
        ("08 1f0001611f000162", C.DISCONNECT, ReasonCode.PROTOCOL_ERROR),  # reason string twice
        ("06 080003612f23", C.PUBLISH, ReasonCode.TOPIC_NAME_INVALID),  # response topic "a/#"
        ("03 080000", C.WILL, ReasonCode.TOPIC_NAME_INVALID),  # empty response topic
        ("04 16000164", C.CONNECT, ReasonCode.PROTOCOL_ERROR),  # authentication data without method
    ],
)
def test_bad_properties(raw_hex: str, context: PropertyContext, reason_code: ReasonCode) -> None:
    with pytest.raises(MqttCodecError) as info:
        decode_properties(Reader(bytes.fromhex(raw_hex)), context)
    assert info.value.reason_code == reason_code


FORBIDDEN_IMPORTS = {"trio", "socket", "ssl", "time", "asyncio", "anyio", "select", "selectors"}


def test_package_is_sans_io() -> None:
    package_dir = Path(mqtt_package.__file__).parent
    sources = sorted(package_dir.glob("*.py"))
    assert len(sources) >= 8
    for source in sources:
        tree = ast.parse(source.read_text(), filename=str(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN_IMPORTS, f"{source.name} imports {name}"


def test_public_api_exports() -> None:
    for name in mqtt_package.__all__:
        assert hasattr(mqtt_package, name), name
