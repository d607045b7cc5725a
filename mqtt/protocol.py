"""
mqproxy.mqtt.protocol
~~~~~~~~~~~~~~~~~~~~~

The sans-IO core of one MQTT connection: :class:`MqttProtocol` turns received bytes into packets and
decides, for each packet, what the protocol requires: the CONNECT terms and CONNACK, the keep-alive deadline
(a value the adapter enforces), topic aliases both ways, the checks of a client PUBLISH (QoS, alias, QoS 2
duplicates, Receive Maximum, payload format) and its acknowledgement, the QoS 1/2 acknowledgement flows of
an in-flight window, SUBSCRIBE / UNSUBSCRIBE answers, the PUBLISH each subscription gets (expiry, QoS,
subscription identifier) and the packet that closes the connection. It performs no I/O and reads no
clock: the trio adapter (:mod:`mqproxy.mqtt.connection`) owns the stream, the timeouts and the gateway,
and passes the current time where a rule needs it.

A rule that ends the connection raises :class:`~mqproxy.mqtt.outcomes.Close`; the adapter sends
:meth:`MqttProtocol.final_packet` and closes.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Collection, Sequence
from typing import Any

from mqproxy.codecs import mqtt as mq
from mqproxy.mqtt.config import NEVER_EXPIRES, MqttConfig
from mqproxy.mqtt.outcomes import Close, ConnectTerms, Inbound, Permission, Subscription
from mqproxy.mqtt.session_record import SubscriptionSpec

__all__ = ["MqttProtocol"]


class MqttProtocol:
    """The protocol state of one connection (see the module docstring)."""

    __slots__ = (  # one per connection: no attribute dict
        "alias_maximum",
        "aliases",
        "client_id",
        "client_max_packet",
        "config",
        "connected",
        "decoder",
        "keep_alive",
        "level",
        "normal_disconnect",
        "out_aliases",
        "problem_information",
        "username",
        "will",
        "will_on_disconnect",
    )

    def __init__(self, config: MqttConfig) -> None:
        self.config = config
        self.level = 4
        self.decoder = mq.MqttDecoder(config.max_packet_size)
        self.connected = False
        self.client_id = ""
        self.username: str | None = None
        self.will: mq.Will | None = None
        self.keep_alive = 0
        self.client_max_packet: int | None = None
        self.problem_information = True
        self.aliases: dict[int, str] = {}  # client→server Topic Aliases
        self.alias_maximum = 0  # the client's Topic Alias Maximum (server→client aliases allowed)
        self.out_aliases: dict[str, int] = {}
        self.normal_disconnect = False
        self.will_on_disconnect = False

    # --- bytes in, deadlines, the last packet ---------------------------------------------------
    def receive_data(self, data: bytes) -> list[mq.Packet]:
        """The packets completed by ``data``; raises :class:`MqttCodecError` (the level of a CONNECT read
        so far is kept, so the refusal is encoded for it)."""
        try:
            return self.decoder.receive_data(data)
        except mq.MqttCodecError:
            if self.decoder.protocol_level is not None:
                self.level = self.decoder.protocol_level
            raise

    def read_timeout(self) -> float:
        """Seconds the next read may wait: the connect timeout, then 1.5 x the keep alive (inf if 0)."""
        if not self.connected:
            return self.config.connect_timeout_s
        if self.keep_alive == 0:
            return float("inf")
        return self.keep_alive * 1.5

    def timeout_close(self) -> Close:
        """How the connection ends when :meth:`read_timeout` passes without data."""
        if not self.connected:
            return Close(None, "connect_timeout", f"no CONNECT within {self.config.connect_timeout_s}s")
        return Close(mq.ReasonCode.KEEP_ALIVE_TIMEOUT, "keepalive_timeout", f"keep alive {self.keep_alive}s")

    def final_packet(self, close: Close) -> bytes | None:
        """The bytes that announce ``close`` to the peer, or None for a silent close."""
        if close.reason_code is None:
            return None
        packet: mq.Packet | None = None
        if not self.connected:
            # A refused CONNECT is answered at every level; a CONNECT the codec could not read, only in
            # MQTT 5 (and for an unsupported level, which 3.1.1 answers with return code 1).
            if (
                self.client_id
                or self.level == mq.MQTT_5
                or close.reason_code == mq.ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
            ):
                packet = mq.Connack(False, close.reason_code, self._reason_string(close))
        elif self.level == mq.MQTT_5:
            # A Reason String (unless the client asked for none) also makes paho read the reason code,
            # which it ignores in a DISCONNECT of remaining length 1.
            packet = mq.Disconnect(close.reason_code, self._reason_string(close))
        return None if packet is None else mq.encode(packet, self.level)

    def _reason_string(self, close: Close) -> mq.Properties:
        """MQTT 5: ``close``'s detail as the Reason String of the closing CONNACK or DISCONNECT, unless the
        client asked for no problem information (3.1.1 has no properties)."""
        why = (close.detail or close.error or "")[:200]
        if self.level != mq.MQTT_5 or not why or not self.problem_information:
            return mq.NO_PROPERTIES
        return mq.Properties(reason_string=why)

    def encode(self, packet: mq.Packet) -> bytes:
        return mq.encode(packet, self.level)

    # --- CONNECT / DISCONNECT -------------------------------------------------------------------
    def accept_connect(self, packet: mq.Connect) -> ConnectTerms:
        """Check a CONNECT (client id, Will QoS) and take its limits; raises :class:`Close` if refused.
        Authentication follows (:meth:`admit`)."""
        self.level = packet.protocol_level
        v5 = self.level == mq.MQTT_5
        config = self.config
        client_id = packet.client_id
        assigned: str | None = None
        if not client_id:
            if not packet.clean_start and not v5:
                self.client_id = "-"  # marks the CONNECT as read: the refusal gets a CONNACK
                raise Close(
                    mq.ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                    "client_id_rejected",
                    "empty client id with clean session 0",
                )
            client_id = assigned = "mqproxy-" + secrets.token_hex(8)
        self.client_id = client_id
        props = packet.properties
        if v5:
            expiry = props.session_expiry_interval or 0
            send_quota = min(props.receive_maximum or 65535, config.max_send_quota)
            self.client_max_packet = props.maximum_packet_size
            self.problem_information = props.request_problem_information != 0
            self.alias_maximum = props.topic_alias_maximum or 0
        else:
            expiry = 0 if packet.clean_start else NEVER_EXPIRES
            send_quota = config.default_send_quota
        if packet.will is not None and packet.will.qos > config.maximum_qos:
            raise Close(
                mq.ReasonCode.QOS_NOT_SUPPORTED, "qos_not_supported", "will QoS above the server maximum"
            )
        keep_alive, server_keep_alive = packet.keep_alive, None
        limit = config.max_keep_alive
        if v5 and limit is not None and (keep_alive == 0 or keep_alive > limit):
            server_keep_alive = limit
        return ConnectTerms(client_id, assigned, packet.clean_start, expiry, send_quota, server_keep_alive)

    def admit(
        self, packet: mq.Connect, terms: ConnectTerms, verdict: mq.ReasonCode, can_publish: Permission
    ) -> None:
        """Apply the authenticator's ``verdict`` (and the Will topic's publish permission); raises
        :class:`Close` if refused, else takes the user name, keep alive and Will."""
        if verdict == mq.ReasonCode.SUCCESS and packet.will is not None:
            if not can_publish(terms.client_id, packet.username, packet.will.topic):
                verdict = mq.ReasonCode.NOT_AUTHORIZED
        if verdict != mq.ReasonCode.SUCCESS:
            raise Close(verdict, "auth_failed", f"user {packet.username!r}: {verdict.name}")
        self.username = packet.username
        self.keep_alive = (
            terms.server_keep_alive if terms.server_keep_alive is not None else packet.keep_alive
        )
        self.will = packet.will

    def connack(self, present: bool, terms: ConnectTerms) -> mq.Connack:
        """The CONNACK of an admitted CONNECT; the connection counts as connected from here on."""
        config = self.config
        props = mq.NO_PROPERTIES
        if self.level == mq.MQTT_5:
            props = mq.Properties(
                receive_maximum=config.receive_maximum,
                maximum_packet_size=config.max_packet_size,
                topic_alias_maximum=config.topic_alias_maximum,
                maximum_qos=config.maximum_qos if config.maximum_qos < 2 else None,
                assigned_client_identifier=terms.assigned,
                server_keep_alive=terms.server_keep_alive,
            )
        self.connected = True
        return mq.Connack(present, mq.ReasonCode.SUCCESS, props)

    def on_disconnect(self, session: Any, packet: mq.Disconnect) -> str:
        """A client DISCONNECT: its Session Expiry Interval (none after 0) and whether the Will goes."""
        new_expiry = packet.properties.session_expiry_interval
        if new_expiry is not None:
            if session.expiry_interval == 0 and new_expiry != 0:
                raise Close(
                    mq.ReasonCode.PROTOCOL_ERROR, "protocol_error", "session expiry set at DISCONNECT after 0"
                )
            session.expiry_interval = new_expiry
        self.normal_disconnect = True
        self.will_on_disconnect = packet.reason_code == mq.ReasonCode.DISCONNECT_WITH_WILL_MESSAGE
        return packet.reason_code.name

    @property
    def will_due(self) -> bool:
        """Whether the Will is published when the connection ends."""
        return self.will is not None and (not self.normal_disconnect or self.will_on_disconnect)

    def will_delay(self) -> int:
        """The Will Delay Interval (MQTT 5; 0 otherwise)."""
        if self.will is None or self.level != mq.MQTT_5:
            return 0
        return self.will.properties.will_delay_interval or 0

    # --- PUBLISH from the client ----------------------------------------------------------------
    def check_publish(
        self,
        packet: mq.Publish,
        awaiting_rel: Collection[int],
        pending_qos2: set[int],
        can_publish: Permission,
    ) -> Inbound:
        """Resolve the topic alias and check a client PUBLISH; raises :class:`Close` for what ends the
        connection. ``awaiting_rel``: the session's QoS 2 ids awaiting PUBREL; ``pending_qos2``: those of
        this batch so far (the id is added)."""
        topic = packet.topic
        props = packet.properties
        if props.topic_alias is not None:
            alias = props.topic_alias
            if alias > self.config.topic_alias_maximum:
                raise Close(mq.ReasonCode.TOPIC_ALIAS_INVALID, "topic_alias_invalid", f"topic alias {alias}")
            if topic:
                self.aliases[alias] = topic
            else:
                known = self.aliases.get(alias)
                if known is None:
                    raise Close(
                        mq.ReasonCode.PROTOCOL_ERROR, "protocol_error", f"unknown topic alias {alias}"
                    )
                topic = known
            props = dataclasses.replace(props, topic_alias=None)
        elif not topic:
            raise Close(mq.ReasonCode.PROTOCOL_ERROR, "protocol_error", "empty topic without topic alias")
        if props.subscription_identifiers:
            props = dataclasses.replace(props, subscription_identifiers=())
        if packet.qos > self.config.maximum_qos:
            raise Close(
                mq.ReasonCode.QOS_NOT_SUPPORTED, "qos_not_supported", f"PUBLISH at QoS {int(packet.qos)}"
            )
        inbound = Inbound(packet, topic, props)
        if not can_publish(self.client_id, self.username, topic):
            inbound.reason = mq.ReasonCode.NOT_AUTHORIZED  # not stored; 3.1.1 acks carry no code (dropped)
            return inbound
        packet_id = packet.packet_id
        if packet.qos == mq.QoS.EXACTLY_ONCE and packet_id is not None:
            if packet_id in awaiting_rel or packet_id in pending_qos2:
                inbound.duplicate = True  # re-sent before PUBREL: acknowledge, do not store again
                return inbound
            in_flight = len(awaiting_rel) + len(pending_qos2)
            if in_flight >= self.config.receive_maximum:
                raise Close(
                    mq.ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                    "receive_maximum_exceeded",
                    f"{in_flight} QoS 2 in flight",
                )
            pending_qos2.add(packet_id)
        if props.payload_format_indicator == 1:
            try:
                packet.payload.decode("utf-8")
            except UnicodeDecodeError:
                inbound.reason = mq.ReasonCode.PAYLOAD_FORMAT_INVALID
        return inbound

    def publish_ack(self, item: Inbound) -> mq.Packet | None:
        """The PUBACK / PUBREC of a checked (and stored or refused) PUBLISH; None for QoS 0. A store
        failure closes a 3.1.1 connection, which cannot refuse one PUBLISH; in MQTT 5 it is refused with
        QUOTA_EXCEEDED (0x97) for a full disk or a too-large message, else 0x83."""
        if item.error is not None and self.level != mq.MQTT_5:
            raise Close(None, "store_failed", item.error)
        packet = item.packet
        if packet.packet_id is None:
            return None
        # MQTT 5: a refusal names its cause in a Reason String (e.g. the broker's disk is full), unless
        # the client asked for no problem information.
        props = mq.NO_PROPERTIES
        if item.error is not None and self.problem_information:
            props = mq.Properties(reason_string=item.error[:200])
        if packet.qos == mq.QoS.AT_LEAST_ONCE:
            return mq.PubAck(packet.packet_id, item.reason, props)
        if packet.qos == mq.QoS.EXACTLY_ONCE:
            return mq.PubRec(packet.packet_id, item.reason, props)
        return None

    # --- acknowledgement flows --------------------------------------------------------------------
    @staticmethod
    def on_pubrec(session: Any, packet: mq.PubRec) -> tuple[str, mq.PubRel | None, bool]:
        """A PUBREC for an outbound QoS 2 delivery: (status, the PUBREL to send, whether it waits until
        the session's QoS 2 state is durable)."""
        entry = session.inflight.get(packet.packet_id)
        if entry is None:
            return (
                "PACKET_IDENTIFIER_NOT_FOUND",
                mq.PubRel(packet.packet_id, mq.ReasonCode.PACKET_IDENTIFIER_NOT_FOUND),
                False,
            )
        if packet.reason_code.is_error:
            session.finish(packet.packet_id)
            return packet.reason_code.name, None, False
        entry.released = True
        # the peer may forget the id once it has the PUBREL: a durable delivery records that first
        return "SUCCESS", mq.PubRel(packet.packet_id), entry.durable

    @staticmethod
    def on_pubrel(session: Any, packet: mq.PubRel) -> tuple[str, mq.PubComp, bool]:
        """A PUBREL for an inbound QoS 2 message: (status, the PUBCOMP, whether it waits until the
        session's state is durable: the peer may reuse the id after PUBCOMP)."""
        if session.release(packet.packet_id):
            return "SUCCESS", mq.PubComp(packet.packet_id), session.persistent
        return (
            "PACKET_IDENTIFIER_NOT_FOUND",
            mq.PubComp(packet.packet_id, mq.ReasonCode.PACKET_IDENTIFIER_NOT_FOUND),
            False,
        )

    # --- SUBSCRIBE / UNSUBSCRIBE ----------------------------------------------------------------
    def subscriptions(self, packet: mq.Subscribe, can_subscribe: Permission) -> list[Subscription]:
        """The grant of each filter of a SUBSCRIBE (refused: invalid, denied, not authorized)."""
        v5 = self.level == mq.MQTT_5
        config = self.config
        ids = packet.properties.subscription_identifiers
        sub_id = ids[0] if ids else None
        out: list[Subscription] = []
        for wanted in packet.topics:
            try:
                parsed = mq.parse_topic_filter(wanted.topic_filter)
            except mq.MqttCodecError:
                out.append(
                    Subscription(
                        mq.ReasonCode.TOPIC_FILTER_INVALID if v5 else mq.ReasonCode.UNSPECIFIED_ERROR
                    )
                )
                continue
            if wanted.topic_filter in config.deny_subscribe or not can_subscribe(
                self.client_id, self.username, wanted.topic_filter
            ):
                out.append(
                    Subscription(mq.ReasonCode.NOT_AUTHORIZED if v5 else mq.ReasonCode.UNSPECIFIED_ERROR)
                )
                continue
            granted = min(int(wanted.qos), config.maximum_qos)
            spec = SubscriptionSpec(
                wanted.topic_filter,
                granted,
                wanted.no_local,
                wanted.retain_as_published,
                int(wanted.retain_handling),
                sub_id,
            )
            out.append(
                Subscription(mq.ReasonCode(granted), spec, parsed.filter, parsed.share_group is not None)
            )
        return out

    @staticmethod
    def suback(packet: mq.Subscribe, granted: Sequence[Subscription]) -> tuple[mq.SubAck, str, str | None]:
        """The SUBACK, the request status (the first error code, else SUCCESS) and the first filter."""
        codes = tuple(s.code for s in granted)
        first = packet.topics[0].topic_filter if packet.topics else None
        worst = next((c for c in codes if c.is_error), None)
        return mq.SubAck(packet.packet_id, codes), (worst.name if worst is not None else "SUCCESS"), first

    def unsuback(self, packet_id: int, existed: Sequence[bool]) -> mq.UnsubAck:
        codes = tuple(mq.ReasonCode.SUCCESS if e else mq.ReasonCode.NO_SUBSCRIPTION_EXISTED for e in existed)
        return mq.UnsubAck(packet_id, codes if self.level == mq.MQTT_5 else ())

    # --- PUBLISH to the client ------------------------------------------------------------------
    def make_publish(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        props: mq.Properties,
        store_ms: int,
        spec: SubscriptionSpec,
        now_ms: int,
    ) -> mq.Publish | None:
        """The PUBLISH of a stored message for one subscription at ``now_ms``, or None if it expired
        (its packet id is a placeholder until the in-flight window assigns one)."""
        expiry = props.message_expiry_interval
        if expiry is not None:
            remaining = expiry - (now_ms - store_ms) // 1000
            if remaining <= 0:
                return None
            props = dataclasses.replace(props, message_expiry_interval=remaining)
        if self.level != mq.MQTT_5:
            props = mq.NO_PROPERTIES
        elif spec.subscription_id is not None:
            props = dataclasses.replace(props, subscription_identifiers=(spec.subscription_id,))
        granted = mq.QoS(min(qos, spec.qos, self.config.maximum_qos))
        return mq.Publish(topic, payload, granted, retain, False, 1 if granted else None, props)

    def shares_qos0(self, spec: SubscriptionSpec, qos: int, properties: mq.Properties) -> bool:
        """Whether a message reaches this subscription as the QoS 0 PUBLISH every such subscriber shares
        (no expiry to adjust, no alias, no subscription identifier)."""
        return (
            (qos == 0 or spec.qos == 0 or self.config.maximum_qos == 0)
            and properties.message_expiry_interval is None
            and not self.alias_maximum
            and (spec.subscription_id is None or self.level != mq.MQTT_5)
        )

    def fits(self, data: bytes) -> bool:
        """Whether the client takes a packet this long (its Maximum Packet Size; [MQTT-3.1.2-25])."""
        return self.client_max_packet is None or len(data) <= self.client_max_packet

    def outbound(self, publish: mq.Publish) -> bytes:
        """The bytes of a PUBLISH to the client, with a server→client Topic Alias when it allows some."""
        return mq.encode(self.aliased(publish) if self.alias_maximum else publish, self.level)

    def aliased(self, publish: mq.Publish) -> mq.Publish:
        """``publish`` using a server→client Topic Alias (MQTT 5, when the client allows some)."""
        alias = self.out_aliases.get(publish.topic)
        if alias is not None:
            props = dataclasses.replace(publish.properties, topic_alias=alias)
            return dataclasses.replace(publish, topic="", properties=props)
        if len(self.out_aliases) < self.alias_maximum:
            alias = self.out_aliases[publish.topic] = len(self.out_aliases) + 1
            return dataclasses.replace(
                publish, properties=dataclasses.replace(publish.properties, topic_alias=alias)
            )
        return publish
