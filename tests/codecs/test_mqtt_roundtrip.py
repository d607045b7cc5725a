"""Hypothesis round trips: every packet type, at 3.1.1 and 5.0, encodes and decodes back to itself."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqproxy.codecs import mqtt as mq
from mqproxy.codecs.mqtt.encoding import Reader, encode_varint
from mqproxy.codecs.mqtt.properties import PROPERTY_SPECS, PropertyContext, PropertyId, PropertyType
from mqproxy.codecs.mqtt.reason_codes import (
    AUTH_REASON_CODES,
    CONNACK_REASON_CODES,
    DISCONNECT_REASON_CODES,
    PUBACK_REASON_CODES,
    PUBREL_REASON_CODES,
    SUBACK_REASON_CODES,
    UNSUBACK_REASON_CODES,
)

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
plain_level = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#/"), max_size=6)
topic_names = st.lists(plain_level, min_size=1, max_size=4).map("/".join).filter(bool)
packet_ids = st.integers(min_value=1, max_value=0xFFFF)
qos = st.sampled_from(list(mq.QoS))
payloads = st.binary(max_size=40)


@st.composite
def topic_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.one_of(plain_level, st.just("+")), min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    topic_filter = "/".join(levels)
    if not topic_filter:
        topic_filter = "#"
    if draw(st.booleans()):
        group = draw(plain_level.filter(bool))
        topic_filter = f"$share/{group}/{topic_filter}"
    return topic_filter


_INT_MAXIMUM = {
    PropertyType.BYTE: 0xFF,
    PropertyType.TWO_BYTE_INT: 0xFFFF,
    PropertyType.FOUR_BYTE_INT: 0xFFFF_FFFF,
    PropertyType.VARINT: 268_435_455,
}
_VALUE_STRATEGIES: dict[PropertyType, st.SearchStrategy[Any]] = {
    PropertyType.UTF8: text,
    PropertyType.BINARY: st.binary(max_size=8),
}


@st.composite
def properties(draw: st.DrawFn, context: PropertyContext) -> mq.Properties:
    values: dict[str, Any] = {}
    for spec in PROPERTY_SPECS.values():
        if context not in spec.contexts or not draw(st.integers(0, 3)) == 0:
            continue
        if spec.id == PropertyId.USER_PROPERTY:
            values["user_properties"] = tuple(draw(st.lists(st.tuples(text, text), min_size=1, max_size=3)))
            continue
        if spec.id == PropertyId.RESPONSE_TOPIC:
            value = draw(topic_names)
        elif spec.type in (PropertyType.UTF8, PropertyType.BINARY):
            value = draw(_VALUE_STRATEGIES[spec.type])
        else:
            value = draw(
                st.integers(spec.minimum, _INT_MAXIMUM[spec.type] if spec.maximum is None else spec.maximum)
            )
        if spec.id == PropertyId.SUBSCRIPTION_IDENTIFIER:
            count = 3 if context is PropertyContext.PUBLISH else 1
            values["subscription_identifiers"] = (
                value,
                *draw(st.lists(st.integers(1, 268_435_455), max_size=count - 1)),
            )
            continue
        values[spec.attribute] = value
    if "authentication_data" in values:  # data needs a method
        values.setdefault("authentication_method", draw(text))
    return mq.Properties(**values)


def props(level: int, context: PropertyContext) -> st.SearchStrategy[mq.Properties]:
    return properties(context) if level == 5 else st.just(mq.NO_PROPERTIES)


def reasons(level: int, allowed: frozenset[mq.ReasonCode]) -> st.SearchStrategy[mq.ReasonCode]:
    return st.sampled_from(sorted(allowed)) if level == 5 else st.just(mq.ReasonCode.SUCCESS)


@st.composite
def connects(draw: st.DrawFn, level: int) -> mq.Connect:
    will = None
    if draw(st.booleans()):
        will = mq.Will(
            draw(topic_names),
            draw(payloads),
            draw(qos),
            draw(st.booleans()),
            draw(props(level, PropertyContext.WILL)),
        )
    username = draw(st.none() | text)
    password = draw(st.none() | st.binary(max_size=8))
    if level != 5 and username is None:
        password = None
    return mq.Connect(
        draw(text),
        level,
        draw(st.booleans()),
        draw(st.integers(0, 0xFFFF)),
        username,
        password,
        will,
        draw(props(level, PropertyContext.CONNECT)),
    )


@st.composite
def connacks(draw: st.DrawFn, level: int) -> mq.Connack:
    if level == 5:
        reason = draw(st.sampled_from(sorted(CONNACK_REASON_CODES)))
    else:
        reason = draw(
            st.sampled_from(
                [
                    mq.ReasonCode.SUCCESS,
                    mq.ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
                    mq.ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                    mq.ReasonCode.SERVER_UNAVAILABLE,
                    mq.ReasonCode.BAD_USER_NAME_OR_PASSWORD,
                    mq.ReasonCode.NOT_AUTHORIZED,
                ]
            )
        )
    session_present = draw(st.booleans()) and not reason.is_error
    return mq.Connack(session_present, reason, draw(props(level, PropertyContext.CONNACK)))


@st.composite
def publishes(draw: st.DrawFn, level: int) -> mq.Publish:
    q = draw(qos)
    properties_ = draw(props(level, PropertyContext.PUBLISH))
    topic = draw(topic_names)
    if properties_.topic_alias is not None and draw(st.booleans()):
        topic = ""
    return mq.Publish(
        topic,
        draw(payloads),
        q,
        draw(st.booleans()),
        bool(q) and draw(st.booleans()),
        draw(packet_ids) if q else None,
        properties_,
    )


@st.composite
def subscribe_topics(draw: st.DrawFn, level: int) -> mq.SubscribeTopic:
    topic_filter = draw(topic_filters())
    if level != 5:
        return mq.SubscribeTopic(topic_filter, draw(qos))
    no_local = draw(st.booleans()) and not topic_filter.startswith("$share/")
    return mq.SubscribeTopic(
        topic_filter, draw(qos), no_local, draw(st.booleans()), draw(st.sampled_from(list(mq.RetainHandling)))
    )


def packets(level: int) -> st.SearchStrategy[mq.Packet]:
    ctx = PropertyContext
    v311_suback = [
        mq.ReasonCode.GRANTED_QOS_0,
        mq.ReasonCode.GRANTED_QOS_1,
        mq.ReasonCode.GRANTED_QOS_2,
        mq.ReasonCode.UNSPECIFIED_ERROR,
    ]
    suback_codes = st.sampled_from(sorted(SUBACK_REASON_CODES) if level == 5 else v311_suback)
    options = [
        connects(level),
        connacks(level),
        publishes(level),
        st.builds(mq.PubAck, packet_ids, reasons(level, PUBACK_REASON_CODES), props(level, ctx.PUBACK)),
        st.builds(mq.PubRec, packet_ids, reasons(level, PUBACK_REASON_CODES), props(level, ctx.PUBREC)),
        st.builds(mq.PubRel, packet_ids, reasons(level, PUBREL_REASON_CODES), props(level, ctx.PUBREL)),
        st.builds(mq.PubComp, packet_ids, reasons(level, PUBREL_REASON_CODES), props(level, ctx.PUBCOMP)),
        st.builds(
            mq.Subscribe,
            packet_ids,
            st.lists(subscribe_topics(level), min_size=1, max_size=4).map(tuple),
            props(level, ctx.SUBSCRIBE),
        ),
        st.builds(
            mq.SubAck,
            packet_ids,
            st.lists(suback_codes, min_size=1, max_size=4).map(tuple),
            props(level, ctx.SUBACK),
        ),
        st.builds(
            mq.Unsubscribe,
            packet_ids,
            st.lists(topic_filters(), min_size=1, max_size=4).map(tuple),
            props(level, ctx.UNSUBSCRIBE),
        ),
        st.builds(
            mq.UnsubAck,
            packet_ids,
            st.lists(st.sampled_from(sorted(UNSUBACK_REASON_CODES)), min_size=1, max_size=4).map(tuple)
            if level == 5
            else st.just(()),
            props(level, ctx.UNSUBACK),
        ),
        st.just(mq.PingReq()),
        st.just(mq.PingResp()),
        st.builds(mq.Disconnect, reasons(level, DISCONNECT_REASON_CODES), props(level, ctx.DISCONNECT)),
    ]
    if level == 5:
        options.append(st.builds(mq.Auth, reasons(level, AUTH_REASON_CODES), props(level, ctx.AUTH)))
    return st.one_of(options)


def _roundtrip(level: int, sequence: list[mq.Packet], step: int) -> None:
    stream = b"".join(mq.encode(packet, level) for packet in sequence)
    decoder = mq.MqttDecoder(mq.MAX_PACKET_SIZE, protocol_level=level)
    decoded: list[mq.Packet] = []
    for index in range(0, len(stream), step):
        decoded += decoder.receive_data(stream[index : index + step])
    assert decoded == sequence
    assert [mq.encode(packet, level) for packet in decoded] == [
        mq.encode(packet, level) for packet in sequence
    ]


@settings(max_examples=100, deadline=None)
@given(sequence=st.lists(packets(4), min_size=1, max_size=4), step=st.integers(1, 50))
def test_roundtrip_v311(sequence: list[mq.Packet], step: int) -> None:
    _roundtrip(4, sequence, step)


@settings(max_examples=120, deadline=None)
@given(sequence=st.lists(packets(5), min_size=1, max_size=4), step=st.integers(1, 50))
def test_roundtrip_v5(sequence: list[mq.Packet], step: int) -> None:
    _roundtrip(5, sequence, step)


@settings(max_examples=30, deadline=None)
@given(
    connect=connects(5), rest=st.lists(packets(5).filter(lambda p: not isinstance(p, mq.Connect)), max_size=4)
)
def test_roundtrip_server_side_v5(connect: mq.Connect, rest: list[mq.Packet]) -> None:
    decoder = mq.MqttDecoder(mq.MAX_PACKET_SIZE)
    stream = mq.encode(connect, 5) + b"".join(mq.encode(packet, 5) for packet in rest)
    assert decoder.receive_data(stream) == [connect, *rest]


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 268_435_455])
def test_remaining_length_boundaries(size: int) -> None:
    """Every remaining-length boundary encodes minimally and a header alone waits for its body."""
    raw = encode_varint(size)
    assert len(raw) == 1 + (size >= 128) + (size >= 16_384) + (size >= 2_097_152)
    assert Reader(raw).varint() == size
    decoder = mq.MqttDecoder(mq.MAX_PACKET_SIZE, protocol_level=4)
    if size < 3:  # too short for a topic
        with pytest.raises(mq.MqttCodecError):
            decoder.receive_data(b"\x30" + raw + b"\x00\x01t"[:size])
    else:
        assert decoder.receive_data(b"\x30" + raw + b"\x00\x01t") == ([mq.Publish("t")] if size == 3 else [])
