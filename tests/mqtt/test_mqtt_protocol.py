"""The sans-IO MQTT core (:class:`MqttProtocol`), driven directly: bytes and packets in, decisions and bytes
out, no sockets, no clock."""

from __future__ import annotations

import pytest

from mqproxy.codecs import mqtt as mq
from mqproxy.mqtt.config import NEVER_EXPIRES, MqttConfig
from mqproxy.mqtt.outcomes import Close, Inbound
from mqproxy.mqtt.protocol import MqttProtocol
from mqproxy.mqtt.session import Session
from mqproxy.mqtt.session_record import SubscriptionSpec

Q0, Q1, Q2 = mq.QoS.AT_MOST_ONCE, mq.QoS.AT_LEAST_ONCE, mq.QoS.EXACTLY_ONCE


def allow(client_id: str, username: str | None, topic: str) -> bool:
    return True


def deny(client_id: str, username: str | None, topic: str) -> bool:
    return False


def decoded(data: bytes | None, level: int) -> list[mq.Packet]:
    """What a client of ``level`` reads from ``data``."""
    assert data is not None
    decoder = mq.MqttDecoder(1 << 24, protocol_level=level)
    return decoder.receive_data(data)


def connected(level: int = 4, config: MqttConfig | None = None, **connect: object) -> MqttProtocol:
    """A core that has read a CONNECT (as bytes) and answered it."""
    proto = MqttProtocol(config or MqttConfig())
    (packet,) = proto.receive_data(mq.encode(mq.Connect("c", level, **connect), level))  # type: ignore[arg-type]
    assert isinstance(packet, mq.Connect)
    terms = proto.accept_connect(packet)
    proto.admit(packet, terms, mq.ReasonCode.SUCCESS, allow)
    proto.connack(False, terms)
    return proto


# --- CONNECT, keep alive, closing -------------------------------------------------------------------
def test_connect_terms_connack_and_the_keep_alive_deadline() -> None:
    proto = MqttProtocol(MqttConfig(connect_timeout_s=7, max_keep_alive=30, receive_maximum=5))
    assert proto.read_timeout() == 7, "before CONNECT: the connect timeout"
    assert proto.timeout_close().error == "connect_timeout"
    assert proto.final_packet(proto.timeout_close()) is None, "a connect timeout closes silently"
    props = mq.Properties(session_expiry_interval=60, receive_maximum=2000, topic_alias_maximum=3)
    (packet,) = proto.receive_data(
        mq.encode(mq.Connect("", mq.MQTT_5, keep_alive=0, properties=props), mq.MQTT_5)
    )
    assert isinstance(packet, mq.Connect)
    terms = proto.accept_connect(packet)
    assert terms.assigned is not None
    assert terms.client_id == terms.assigned
    assert (terms.expiry, terms.send_quota, terms.server_keep_alive) == (60, 1024, 30)
    proto.admit(packet, terms, mq.ReasonCode.SUCCESS, allow)
    (connack,) = decoded(proto.encode(proto.connack(True, terms)), mq.MQTT_5)
    assert isinstance(connack, mq.Connack)
    assert connack.session_present
    assert connack.properties.assigned_client_identifier == terms.client_id
    assert connack.properties.server_keep_alive == 30
    assert connack.properties.receive_maximum == 5
    assert proto.read_timeout() == 45, "1.5 x the keep alive the server imposed"
    close = proto.timeout_close()
    assert (close.reason_code, close.error) == (mq.ReasonCode.KEEP_ALIVE_TIMEOUT, "keepalive_timeout")
    assert proto.alias_maximum == 3


def test_keep_alive_zero_has_no_deadline_and_311_sessions_never_expire() -> None:
    proto = connected(4, keep_alive=0, clean_start=False)
    assert proto.read_timeout() == float("inf")
    assert proto.final_packet(Close(mq.ReasonCode.SERVER_SHUTTING_DOWN, None)) is None, "3.1.1: silent close"
    proto = MqttProtocol(MqttConfig())
    terms = proto.accept_connect(mq.Connect("c", 4, clean_start=False))
    assert terms.expiry == NEVER_EXPIRES


def test_refused_connects_get_their_connack() -> None:
    proto = MqttProtocol(MqttConfig())
    with pytest.raises(Close) as refused:
        proto.accept_connect(mq.Connect("", 4, clean_start=False))
    assert refused.value.error == "client_id_rejected"
    assert decoded(proto.final_packet(refused.value), 4) == [
        mq.Connack(False, mq.ReasonCode.CLIENT_IDENTIFIER_NOT_VALID)
    ]
    proto = MqttProtocol(MqttConfig(maximum_qos=1))
    with pytest.raises(Close) as refused:
        proto.accept_connect(mq.Connect("c", mq.MQTT_5, will=mq.Will("w", b"", Q2)))
    assert refused.value.reason_code == mq.ReasonCode.QOS_NOT_SUPPORTED
    proto = MqttProtocol(MqttConfig())
    packet = mq.Connect("c", mq.MQTT_5, username="u", will=mq.Will("w/t", b"bye"))
    terms = proto.accept_connect(packet)
    with pytest.raises(Close) as refused:
        proto.admit(packet, terms, mq.ReasonCode.SUCCESS, deny)  # may not publish its Will
    assert (refused.value.reason_code, refused.value.error) == (mq.ReasonCode.NOT_AUTHORIZED, "auth_failed")


def test_a_refused_connect_carries_the_reason_string_in_mqtt5_and_the_return_code_in_311() -> None:
    why = "needs the embedded backend"
    unavailable = Close(mq.ReasonCode.SERVER_UNAVAILABLE, "mqtt_unavailable", why)
    proto = MqttProtocol(MqttConfig())
    proto.accept_connect(mq.Connect("c", mq.MQTT_5))
    assert decoded(proto.final_packet(unavailable), mq.MQTT_5) == [
        mq.Connack(False, mq.ReasonCode.SERVER_UNAVAILABLE, mq.Properties(reason_string=why))
    ]
    quiet = MqttProtocol(MqttConfig())
    no_problems = mq.Properties(request_problem_information=0)
    quiet.accept_connect(mq.Connect("c", mq.MQTT_5, properties=no_problems))
    assert decoded(quiet.final_packet(unavailable), mq.MQTT_5) == [
        mq.Connack(False, mq.ReasonCode.SERVER_UNAVAILABLE)
    ]
    v311 = MqttProtocol(MqttConfig())
    v311.accept_connect(mq.Connect("c", 4))
    assert v311.final_packet(unavailable) == bytes([0x20, 2, 0, 3]), "3.1.1: return code 3 (unavailable)"


def test_a_connect_the_codec_refuses_is_answered_at_its_level() -> None:
    proto = MqttProtocol(MqttConfig())
    bad_level = bytes([0x10, 10, 0, 4]) + b"MQTT" + bytes([9, 2, 0, 60])
    with pytest.raises(mq.MqttCodecError) as failed:
        proto.receive_data(bad_level)
    close = Close(failed.value.reason_code, "unsupported")
    assert failed.value.reason_code == mq.ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
    (connack,) = decoded(proto.final_packet(close), 4)
    assert isinstance(connack, mq.Connack)
    assert connack.reason_code == mq.ReasonCode.UNSUPPORTED_PROTOCOL_VERSION


def test_mqtt5_disconnect_carries_a_reason_string_unless_the_client_declined_it() -> None:
    proto = connected(mq.MQTT_5)
    close = Close(mq.ReasonCode.SESSION_TAKEN_OVER, "session_taken_over", "client id reused")
    assert decoded(proto.final_packet(close), mq.MQTT_5) == [
        mq.Disconnect(mq.ReasonCode.SESSION_TAKEN_OVER, mq.Properties(reason_string="client id reused"))
    ]
    quiet = connected(mq.MQTT_5, properties=mq.Properties(request_problem_information=0))
    assert decoded(quiet.final_packet(close), mq.MQTT_5) == [mq.Disconnect(mq.ReasonCode.SESSION_TAKEN_OVER)]


def test_disconnect_rules_and_the_will() -> None:
    proto = connected(mq.MQTT_5, will=mq.Will("w", b"x", properties=mq.Properties(will_delay_interval=5)))
    session = Session("c", 0, 10)
    with pytest.raises(Close) as refused:
        proto.on_disconnect(session, mq.Disconnect(properties=mq.Properties(session_expiry_interval=9)))
    assert refused.value.reason_code == mq.ReasonCode.PROTOCOL_ERROR
    assert proto.will_due
    assert proto.will_delay() == 5
    session = Session("c", 10, 10)
    assert (
        proto.on_disconnect(session, mq.Disconnect(properties=mq.Properties(session_expiry_interval=0)))
        == "SUCCESS"
    )
    assert session.expiry_interval == 0
    assert not proto.will_due, "a normal DISCONNECT drops the Will"
    proto.on_disconnect(session, mq.Disconnect(mq.ReasonCode.DISCONNECT_WITH_WILL_MESSAGE))
    assert proto.will_due


# --- PUBLISH from the client -----------------------------------------------------------------------
def test_topic_aliases_from_the_client() -> None:
    proto = connected(mq.MQTT_5, config=MqttConfig(topic_alias_maximum=2))
    pending: set[int] = set()
    first = proto.check_publish(
        mq.Publish("a/b", b"1", properties=mq.Properties(topic_alias=1)), (), pending, allow
    )
    assert (first.topic, first.properties.topic_alias) == ("a/b", None)
    again = proto.check_publish(
        mq.Publish("", b"2", properties=mq.Properties(topic_alias=1)), (), pending, allow
    )
    assert again.topic == "a/b"
    with pytest.raises(Close) as refused:
        proto.check_publish(mq.Publish("", b"3", properties=mq.Properties(topic_alias=2)), (), pending, allow)
    assert refused.value.reason_code == mq.ReasonCode.PROTOCOL_ERROR
    with pytest.raises(Close) as refused:
        proto.check_publish(
            mq.Publish("x", b"4", properties=mq.Properties(topic_alias=3)), (), pending, allow
        )
    assert refused.value.reason_code == mq.ReasonCode.TOPIC_ALIAS_INVALID
    with pytest.raises(Close) as refused:
        proto.check_publish(mq.Publish("", b"5"), (), pending, allow)
    assert refused.value.error == "protocol_error"


def test_qos2_duplicates_and_the_receive_maximum() -> None:
    proto = connected(mq.MQTT_5, config=MqttConfig(receive_maximum=2))
    pending: set[int] = set()
    awaiting = {1}
    assert proto.check_publish(mq.Publish("t", b"", Q2, packet_id=1), awaiting, pending, allow).duplicate
    item = proto.check_publish(mq.Publish("t", b"", Q2, packet_id=2), awaiting, pending, allow)
    assert item.stored
    assert pending == {2}
    assert proto.check_publish(mq.Publish("t", b"", Q2, packet_id=2), awaiting, pending, allow).duplicate
    with pytest.raises(Close) as refused:
        proto.check_publish(mq.Publish("t", b"", Q2, packet_id=3), awaiting, pending, allow)
    assert refused.value.reason_code == mq.ReasonCode.RECEIVE_MAXIMUM_EXCEEDED
    bad_utf8 = mq.Publish("t", b"\xff", Q1, packet_id=4, properties=mq.Properties(payload_format_indicator=1))
    assert proto.check_publish(bad_utf8, (), set(), allow).reason == mq.ReasonCode.PAYLOAD_FORMAT_INVALID
    assert proto.check_publish(mq.Publish("t", b""), (), set(), deny).reason == mq.ReasonCode.NOT_AUTHORIZED
    with pytest.raises(Close) as refused:
        connected(config=MqttConfig(maximum_qos=1)).check_publish(
            mq.Publish("t", b"", Q2, packet_id=5), (), set(), allow
        )
    assert refused.value.reason_code == mq.ReasonCode.QOS_NOT_SUPPORTED


def test_publish_acknowledgements() -> None:
    proto = connected(mq.MQTT_5)
    assert proto.publish_ack(Inbound(mq.Publish("t", b""), "t", mq.Properties())) is None
    q1 = Inbound(
        mq.Publish("t", b"", Q1, packet_id=7),
        "t",
        mq.Properties(),
        mq.ReasonCode.QUOTA_EXCEEDED,
        error="full",
    )
    # the refusal's cause travels as the Reason String (unless the client asked for no problem info)
    assert proto.publish_ack(q1) == mq.PubAck(
        7, mq.ReasonCode.QUOTA_EXCEEDED, mq.Properties(reason_string="full")
    )
    proto.problem_information = False
    assert proto.publish_ack(q1) == mq.PubAck(7, mq.ReasonCode.QUOTA_EXCEEDED)
    assert proto.publish_ack(
        Inbound(mq.Publish("t", b"", Q2, packet_id=8), "t", mq.Properties())
    ) == mq.PubRec(8)
    with pytest.raises(Close) as closed:
        connected(4).publish_ack(q1)  # 3.1.1 cannot refuse one PUBLISH
    assert (closed.value.reason_code, closed.value.error) == (None, "store_failed")


# --- acknowledgement flows and the in-flight window -------------------------------------------------
def test_outbound_qos2_flow_and_inbound_pubrel() -> None:
    proto = connected(mq.MQTT_5)
    session = Session("c", 60, 2)
    entry = session.add_inflight(
        lambda pid: mq.Publish("t", b"", Q2, packet_id=pid), None, 0, retained_for="t"
    )
    assert entry.durable
    assert entry.packet_id == 1
    assert proto.on_pubrec(session, mq.PubRec(1)) == ("SUCCESS", mq.PubRel(1), True), "durable: PUBREL waits"
    assert entry.released
    assert session.finish(1) is entry
    assert not session.inflight
    status, answer, deferred = proto.on_pubrec(session, mq.PubRec(9))
    assert (status, answer, deferred) == (
        "PACKET_IDENTIFIER_NOT_FOUND",
        mq.PubRel(9, mq.ReasonCode.PACKET_IDENTIFIER_NOT_FOUND),
        False,
    )
    session.add_inflight(lambda pid: mq.Publish("t", b"", Q2, packet_id=pid), None, 0)
    assert proto.on_pubrec(session, mq.PubRec(2, mq.ReasonCode.UNSPECIFIED_ERROR)) == (
        "UNSPECIFIED_ERROR",
        None,
        False,
    )
    assert not session.inflight, "a refusing PUBREC ends the flow"
    session.expect_rel([5])
    assert proto.on_pubrel(session, mq.PubRel(5)) == ("SUCCESS", mq.PubComp(5), True), (
        "persistent: PUBCOMP waits"
    )
    assert proto.on_pubrel(session, mq.PubRel(5))[1] == mq.PubComp(
        5, mq.ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
    )


def test_the_in_flight_window_allocates_free_packet_ids() -> None:
    session = Session("c", 0, 2)
    ids = [
        session.add_inflight(lambda pid: mq.Publish("t", b"", Q1, packet_id=pid), None, 0).packet_id
        for _ in "ab"
    ]
    assert ids == [1, 2]
    assert len(session.inflight) >= session.send_quota, "full: the next delivery waits for an ack"
    session.finish(1)
    assert session.add_inflight(lambda pid: mq.Publish("t", b"", Q1, packet_id=pid), None, 0).packet_id == 3


# --- SUBSCRIBE / UNSUBSCRIBE ------------------------------------------------------------------------
def test_subscribe_grants_and_refusals_per_level() -> None:
    config = MqttConfig(maximum_qos=1, deny_subscribe=("secret/#",))
    for level, refused in (
        (mq.MQTT_5, mq.ReasonCode.TOPIC_FILTER_INVALID),
        (4, mq.ReasonCode.UNSPECIFIED_ERROR),
    ):
        proto = connected(level, config=config)
        topics = (
            mq.SubscribeTopic("a/+", Q2),
            mq.SubscribeTopic("a/#/b", Q0),
            mq.SubscribeTopic("secret/#", Q0),
        )
        packet = mq.Subscribe(
            3, topics, mq.Properties(subscription_identifiers=(7,)) if level == mq.MQTT_5 else mq.Properties()
        )
        granted = proto.subscriptions(packet, allow)
        suback, status, first = proto.suback(packet, granted)
        denied = mq.ReasonCode.NOT_AUTHORIZED if level == mq.MQTT_5 else mq.ReasonCode.UNSPECIFIED_ERROR
        assert suback == mq.SubAck(3, (mq.ReasonCode.GRANTED_QOS_1, refused, denied))
        assert (status, first) == (refused.name, "a/+")
        assert granted[0].spec is not None
        assert granted[0].spec.qos == 1
        assert granted[0].wants_retained(new=False)
    shared = connected(mq.MQTT_5).subscriptions(
        mq.Subscribe(1, (mq.SubscribeTopic("$share/g/x", Q1),)), allow
    )
    assert (shared[0].inner, shared[0].shared, shared[0].wants_retained(True)) == ("x", True, False)
    assert connected(mq.MQTT_5).unsuback(4, [True, False]) == mq.UnsubAck(
        4, (mq.ReasonCode.SUCCESS, mq.ReasonCode.NO_SUBSCRIPTION_EXISTED)
    )
    assert connected(4).unsuback(4, [True]) == mq.UnsubAck(4, ())


# --- PUBLISH to the client --------------------------------------------------------------------------
def test_the_publish_each_subscription_gets() -> None:
    proto = connected(mq.MQTT_5)
    spec = SubscriptionSpec("a/+", 1, subscription_id=9)
    props = mq.Properties(message_expiry_interval=10)
    publish = proto.make_publish("a/b", b"x", 2, False, props, 1_000, spec, now_ms=4_500)
    assert publish is not None
    assert (publish.qos, publish.properties.message_expiry_interval) == (Q1, 7)
    assert publish.properties.subscription_identifiers == (9,)
    assert proto.make_publish("a/b", b"x", 2, False, props, 1_000, spec, now_ms=11_000) is None, "expired"
    assert not proto.shares_qos0(spec, 0, mq.Properties()), "a subscription identifier is per subscriber"
    assert connected(4).shares_qos0(spec, 0, mq.Properties())
    assert not connected(4).shares_qos0(spec, 1, mq.Properties())


def test_server_to_client_aliases_and_the_client_maximum_packet_size() -> None:
    proto = connected(mq.MQTT_5, properties=mq.Properties(topic_alias_maximum=1, maximum_packet_size=64))
    publish = mq.Publish("long/topic", b"x")
    assert decoded(proto.outbound(publish), mq.MQTT_5) == [
        mq.Publish("long/topic", b"x", properties=mq.Properties(topic_alias=1))
    ]
    assert decoded(proto.outbound(publish), mq.MQTT_5) == [
        mq.Publish("", b"x", properties=mq.Properties(topic_alias=1))
    ]
    assert proto.outbound(mq.Publish("other", b"y")) == mq.encode(mq.Publish("other", b"y"), mq.MQTT_5), (
        "aliases used up"
    )
    assert proto.fits(bytes(64))
    assert not proto.fits(bytes(65))
