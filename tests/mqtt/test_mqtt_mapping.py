from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mqproxy.codecs.mqtt import NO_PROPERTIES, Properties
from mqproxy.model.topics import validate_lmq
from mqproxy.mqtt import mapping
from mqproxy.mqtt.mapping import (
    FALLBACK_PARENT_TOPIC,
    PROPERTY_MQTT_TOPIC,
    RETAINED_LMQ,
    MqttAttributes,
    decode_properties,
    encode_properties,
    lmq_name,
    parent_topic,
)


def test_parent_topic_is_first_level_or_fallback() -> None:
    assert parent_topic("a/b/c") == "a"
    assert parent_topic("sensors") == "sensors"
    assert parent_topic("/a") == FALLBACK_PARENT_TOPIC
    assert parent_topic("$SYS/x") == FALLBACK_PARENT_TOPIC
    assert parent_topic("dot.ted/x") == FALLBACK_PARENT_TOPIC
    assert parent_topic("%RETRY%g/x") == FALLBACK_PARENT_TOPIC
    assert parent_topic("SCHEDULE_TOPIC_XXXX/x") == FALLBACK_PARENT_TOPIC
    assert parent_topic("x" * 65) == FALLBACK_PARENT_TOPIC


def test_lmq_name_golden() -> None:
    assert lmq_name("a/b/c") == "%LMQ%a%b%c"
    assert lmq_name("a/+") == "%LMQ%a%|2B"
    assert lmq_name("a/#") == "%LMQ%a%|23"
    assert lmq_name("$SYS/é") == "%LMQ%|24SYS%|C3|A9"
    assert lmq_name("a|b%c") == "%LMQ%a|7Cb|25c"


def test_long_names_are_cut_and_hashed() -> None:
    long_a = lmq_name("x" * 300 + "a")
    long_b = lmq_name("x" * 300 + "b")
    assert len(long_a) == 127
    assert long_a != long_b
    assert "|H" in long_a
    validate_lmq(long_a)


@given(st.text(min_size=1, max_size=200).filter(lambda s: "\x00" not in s))
def test_every_topic_maps_to_a_legal_distinct_lmq(topic: str) -> None:
    name = lmq_name(topic)
    validate_lmq(name)
    assert name != RETAINED_LMQ
    assert parent_topic(topic)


@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=40))
def test_escaping_is_injective(a: str, b: str) -> None:
    if a != b and len(lmq_name(a)) < 127 and len(lmq_name(b)) < 127:
        assert lmq_name(a) != lmq_name(b)


def test_properties_round_trip() -> None:
    props = Properties(
        user_properties=(("k", "v"), ("k", "w"), ("TAGS", "x")),
        content_type="text/plain",
        payload_format_indicator=1,
        response_topic="r/t",
        correlation_data=b"\x00\x01",
        message_expiry_interval=30,
    )
    stored = encode_properties("a/b", 2, "client", True, props)
    assert stored[PROPERTY_MQTT_TOPIC] == "a/b"
    assert stored["k"] == "v"  # plain copy for RocketMQ consumers (first value)
    assert "TAGS" not in stored  # never shadows a system property
    attrs = decode_properties(stored)
    assert attrs is not None
    assert (attrs.topic, attrs.qos, attrs.client_id, attrs.retain) == ("a/b", 2, "client", True)
    assert attrs.properties == props


def test_foreign_messages() -> None:
    assert decode_properties({"TAGS": "x"}) is None
    attrs = decode_properties({PROPERTY_MQTT_TOPIC: "a/b", "MQTT5_PROPS": "{not json"})
    assert attrs is not None
    assert attrs.qos == 1
    assert attrs.properties == NO_PROPERTIES
    attrs = decode_properties({PROPERTY_MQTT_TOPIC: "a/b", "MQTT_QOS": "9"})
    assert attrs is not None
    assert attrs.qos == 2


def test_decoded_attributes_are_shared_for_equal_properties_and_bounded() -> None:
    stored = encode_properties("a/b", 1, "c1", False, NO_PROPERTIES)
    first = decode_properties(dict(stored))
    assert first is not None
    assert decode_properties(dict(stored)) is first  # remembered: no second decode
    retained = decode_properties({**stored, "MQTT_RETAIN": "1"})
    assert retained is not None
    assert retained.retain
    assert retained is not first
    other = decode_properties({**stored, "MQTT_CLIENT_ID": "c2"})
    assert other is not None
    assert other.client_id == "c2"
    no_qos = {k: v for k, v in stored.items() if k != "MQTT_QOS"}
    assert decode_properties(no_qos, default_qos=0) == MqttAttributes("a/b", 0, "c1", False, NO_PROPERTIES)
    assert decode_properties(no_qos, default_qos=2) == MqttAttributes("a/b", 2, "c1", False, NO_PROPERTIES)
    for i in range(mapping._DECODED_MAX + 10):  # a flood of distinct topics does not grow it past its cap
        decode_properties({**stored, "MQTT_TOPIC": f"t/{i}"})
    assert len(mapping._DECODED) <= mapping._DECODED_MAX
    v5 = encode_properties("a/b", 1, "c1", False, Properties(content_type="text/plain"))
    decoded = decode_properties(v5)
    assert decoded is not None
    assert decoded.properties.content_type == "text/plain"
    assert decode_properties(v5) is not decoded  # MQTT 5 properties are decoded each time
