"""
mqproxy.fuzz.mqtt_target
~~~~~~~~~~~~~~~~~~~~~~~~

Fuzz targets for MQTT: the packet decoder at a fixed level (3.1.1, 5.0; every packet type, both
directions, properties included) with a round-trip oracle, and the server's sans-IO connection core
(:class:`~mqproxy.mqtt.protocol.MqttProtocol`: CONNECT first, the level read from it, then every client
packet through the rule it meets: CONNECT terms, PUBLISH checks and acks, SUBSCRIBE grants, QoS 2 flows,
DISCONNECT).

Documented errors: :class:`~mqproxy.codecs.mqtt.MqttCodecError` and, for the connection core,
:class:`~mqproxy.mqtt.outcomes.Close`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mqproxy.codecs import mqtt as mq
from mqproxy.fuzz.mutator import Field, Seed
from mqproxy.mqtt.config import MqttConfig
from mqproxy.mqtt.outcomes import Close
from mqproxy.mqtt.protocol import MqttProtocol

__all__ = ["DECODER_ERRORS", "SESSION_ERRORS", "decoder_run", "decoder_seeds", "session_run", "session_seeds"]

DECODER_ERRORS: tuple[type[BaseException], ...] = (mq.MqttCodecError,)
SESSION_ERRORS: tuple[type[BaseException], ...] = (mq.MqttCodecError, Close)

_MAX_PACKET = 64 * 1024
_CONFIG = MqttConfig(max_packet_size=_MAX_PACKET, topic_alias_maximum=4, receive_maximum=4)


class RoundTripError(AssertionError):
    """A decoded packet did not re-encode to bytes that decode back to it (a finding, never documented)."""


def decoder_run(level: int) -> Callable[[bytes, int], None]:
    """The decoder target at ``level``: decode, then re-encode and decode every packet again."""

    def run(data: bytes, split: int) -> None:
        decoder = mq.MqttDecoder(_MAX_PACKET, protocol_level=level)
        packets = decoder.receive_data(data[:split]) if split else []
        packets += decoder.receive_data(data[split:])
        for packet in packets:
            again = mq.MqttDecoder(_MAX_PACKET, protocol_level=level).receive_data(mq.encode(packet, level))
            if again != [packet]:
                raise RoundTripError(f"{packet!r} came back as {again!r}")

    return run


class _Session:
    """The few session attributes the QoS 2 and DISCONNECT rules read."""

    def __init__(self) -> None:
        self.inflight: dict[int, object] = {}
        self.awaiting_rel: set[int] = set()
        self.persistent = False
        self.expiry_interval = 0

    def release(self, packet_id: int) -> bool:
        if packet_id in self.awaiting_rel:
            self.awaiting_rel.discard(packet_id)
            return True
        return False

    def finish(self, packet_id: int) -> None:
        self.inflight.pop(packet_id, None)


def _allow(client_id: str, username: str | None, topic: str) -> bool:
    return not topic.startswith("deny")


def session_run(data: bytes, split: int) -> None:
    """Feed ``data`` to a fresh server-side connection core and apply each packet's rule."""
    proto = MqttProtocol(_CONFIG)
    session = _Session()
    out: list[mq.Packet] = []
    for chunk in (data[:split], data[split:]) if split else (data,):
        for packet in proto.receive_data(chunk):
            _apply(proto, session, packet, out)
    for reply in out:
        proto.encode(reply)


def _apply(proto: MqttProtocol, session: _Session, packet: mq.Packet, out: list[mq.Packet]) -> None:
    if isinstance(packet, mq.Connect):
        terms = proto.accept_connect(packet)
        proto.admit(packet, terms, mq.ReasonCode.SUCCESS, _allow)
        session.expiry_interval = terms.expiry
        out.append(proto.connack(False, terms))
    elif isinstance(packet, mq.Publish):
        pending: set[int] = set()
        item = proto.check_publish(packet, session.awaiting_rel, pending, _allow)
        session.awaiting_rel |= pending
        ack = proto.publish_ack(item)
        if ack is not None:
            out.append(ack)
    elif isinstance(packet, mq.Subscribe):
        out.append(proto.suback(packet, proto.subscriptions(packet, lambda c, u, t: _allow(c, u, t)))[0])
    elif isinstance(packet, mq.Unsubscribe):
        out.append(proto.unsuback(packet.packet_id, [True] * len(packet.topic_filters)))
    elif isinstance(packet, mq.PubRec):
        reply = proto.on_pubrec(session, packet)[1]
        if reply is not None:
            out.append(reply)
    elif isinstance(packet, mq.PubRel):
        out.append(proto.on_pubrel(session, packet)[1])
    elif isinstance(packet, mq.Disconnect):
        proto.on_disconnect(session, packet)


# --- seeds ---------------------------------------------------------------------------------------


def _packets(level: int) -> list[mq.Packet]:
    v5 = level == mq.MQTT_5
    P = mq.Properties
    props = P(
        payload_format_indicator=1, message_expiry_interval=60, content_type="text/plain",
        response_topic="reply/to", correlation_data=b"\x01\x02", user_properties=(("k", "v"), ("k", "w")),
        topic_alias=2,
    ) if v5 else mq.NO_PROPERTIES
    connect_props = P(session_expiry_interval=30, receive_maximum=10, maximum_packet_size=4096,
                      topic_alias_maximum=3, request_problem_information=1, request_response_information=1,
                      authentication_method="m",
                      authentication_data=b"d", user_properties=(("a", "b"),)) if v5 else mq.NO_PROPERTIES
    will_props = P(will_delay_interval=5, content_type="c") if v5 else mq.NO_PROPERTIES
    ack_props = P(reason_string="why", user_properties=(("x", "y"),)) if v5 else mq.NO_PROPERTIES
    error = mq.ReasonCode.UNSPECIFIED_ERROR
    out: list[mq.Packet] = [
        mq.Connect("client-1", level, clean_start=False, keep_alive=30, username="user", password=b"pw",
                   will=mq.Will("will/t", b"bye", mq.QoS.AT_LEAST_ONCE, True, will_props),
                   properties=connect_props),
        mq.Connect("", level, keep_alive=0),
        mq.Connack(True, mq.ReasonCode.SUCCESS, P(
            assigned_client_identifier="id", server_keep_alive=9, maximum_qos=1, retain_available=1,
            wildcard_subscription_available=0, subscription_identifier_available=1,
            shared_subscription_available=1,
            response_information="info", server_reference="other:1883", receive_maximum=20,
            maximum_packet_size=1000, topic_alias_maximum=5, session_expiry_interval=60,
        ) if v5 else mq.NO_PROPERTIES),
        mq.Connack(False, mq.ReasonCode.NOT_AUTHORIZED),
        mq.Publish("a/b/c", b"payload", mq.QoS.AT_MOST_ONCE, retain=True),
        mq.Publish("a/b", b"q1" * 8, mq.QoS.AT_LEAST_ONCE, packet_id=7, properties=props),
        mq.Publish("t", b"", mq.QoS.EXACTLY_ONCE, dup=True, packet_id=65535),
        mq.PubAck(7, error if v5 else mq.ReasonCode.SUCCESS, ack_props),
        mq.PubRec(8), mq.PubRel(8, properties=ack_props), mq.PubComp(8),
        mq.Subscribe(9, (mq.SubscribeTopic("a/+/c", mq.QoS.AT_LEAST_ONCE, no_local=v5,
                                           retain_as_published=v5,
                                           retain_handling=mq.RetainHandling(2 if v5 else 0)),
                         mq.SubscribeTopic("$share/g/x/#", mq.QoS.EXACTLY_ONCE)),
                     P(subscription_identifiers=(300,), user_properties=(("s", "t"),)) if v5 else
                     mq.NO_PROPERTIES),
        mq.SubAck(9, (mq.ReasonCode.GRANTED_QOS_1, mq.ReasonCode.UNSPECIFIED_ERROR)),
        mq.Unsubscribe(10, ("a/+/c", "deny/#")),
        mq.UnsubAck(10, (mq.ReasonCode.SUCCESS, mq.ReasonCode.NO_SUBSCRIPTION_EXISTED) if v5 else ()),
        mq.PingReq(), mq.PingResp(),
        mq.Disconnect(mq.ReasonCode.DISCONNECT_WITH_WILL_MESSAGE if v5 else
                      mq.ReasonCode.NORMAL_DISCONNECTION,
                      P(session_expiry_interval=0, reason_string="r") if v5 else mq.NO_PROPERTIES),
    ]
    if v5:
        out.append(mq.Auth(mq.ReasonCode.CONTINUE_AUTHENTICATION,
                           P(authentication_method="m", authentication_data=b"\x00")))
    return out


def _seed(encoded: list[bytes]) -> Seed:
    fields: list[Field] = []
    at = 0
    for raw in encoded:
        width = 1
        while raw[width] & 0x80:
            width += 1
        fields.append(Field(at + 1, width, varint=True))
        if width + 3 <= len(raw):
            fields.append(Field(at + 1 + width, 2))  # a packet id or a string length
        at += len(raw)
    return Seed(b"".join(encoded), tuple(fields))


def decoder_seeds(level: int) -> list[Seed]:
    """Every packet type at ``level`` alone, and the whole list as one stream."""
    encoded = [mq.encode(packet, level) for packet in _packets(level)]
    return [_seed([raw]) for raw in encoded] + [_seed(encoded)]


_CLIENT_TYPES = (mq.Publish, mq.PubAck, mq.PubRec, mq.PubRel, mq.PubComp, mq.Subscribe, mq.Unsubscribe,
                 mq.PingReq, mq.Disconnect, mq.Auth)


def session_seeds() -> list[Seed]:
    """For levels 3, 4 and 5: the CONNECT followed by each client packet, and by all of them."""
    out: list[Seed] = []
    for level in (3, 4, 5):
        packets = _packets(5 if level == 5 else 4)
        connect = mq.encode(dataclasses.replace(packets[0], protocol_level=level), level)
        client = [mq.encode(p, level) for p in packets if isinstance(p, _CLIENT_TYPES)]
        alias = mq.Publish("", b"aliased", mq.QoS.AT_LEAST_ONCE, packet_id=3,
                           properties=mq.Properties(topic_alias=2))
        out += [_seed([connect, raw]) for raw in client if raw[0] >> 4 != mq.PacketType.DISCONNECT]
        if level == 5:
            client.append(mq.encode(alias, level))  # after the PUBLISH that set alias 2
        out.append(_seed([connect, *client]))
    return out
