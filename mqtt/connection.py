"""One MQTT network connection: :class:`MqttConnection`, served by the MQTT service.

Tasks per connection (one nursery): the packet reader (this task), a writer that coalesces queued packets
into one ``send_all`` (bounded queue; a peer that takes nothing for ``write_timeout_s`` is a slow
consumer and is disconnected; on plain TCP a push hub's delivery skips the writer and goes straight
to the socket when nothing is queued before it), a drain watcher, and one delivery reader per
subscription (pull from the subscription's LMQ at the session cursor, long-poll the store when caught
up, push PUBLISHes inside the in-flight window). Offsets of QoS 1/2 deliveries advance on PUBACK /
PUBCOMP, of QoS 0 on write.
Client PUBLISHes that arrive in one read are stored with one batch write per parent topic and then
acknowledged in order (PUBACK / PUBREC only after the store accepted them).

QoS 2 of a persistent session survives a crash: what the peer may act on is recorded in the session
snapshot before the packet leaves (``_flush_state``, one write per read or delivery round): inbound ids
before their PUBREC, their removal before PUBCOMP, an outbound delivery before its PUBLISH, its release
before PUBREL. After a restart the first CONNECT re-sends them under their original packet ids.

Closing: MQTT 5 peers get a DISCONNECT (or, while connecting, a CONNACK) with the reason code first; 3.1.1
peers are closed silently, except that a refused CONNECT gets its CONNACK return code (0x01 for an
unsupported level, 0x02 for a rejected client id). The session is then detached (ended or persisted) and
the will is published unless the client sent a normal DISCONNECT.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Sequence
from typing import Any

import trio

from mqproxy.codecs.mqtt import (
    MQTT_5,
    NO_PROPERTIES,
    PACKET_TYPES,
    Connack,
    Connect,
    Disconnect,
    MqttCodecError,
    MqttDecoder,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    QoS,
    ReasonCode,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    Will,
    encode,
    parse_topic_filter,
    topic_matches,
)
from mqproxy.model.errors import BackendError, MessageTooLarge
from mqproxy.model.topics import LMQ_QUEUE_ID
from mqproxy.model.types import PullStatus, StoredMessage
from mqproxy.mqtt.gateway import Gateway, now_ms, reader_filter
from mqproxy.mqtt.mapping import decode_properties, lmq_name
from mqproxy.mqtt.read_cache import Delivery
from mqproxy.mqtt.session import NEVER_EXPIRES, Cursor, InFlight, Session
from mqproxy.mqtt.state import SubscriptionSpec
from mqproxy.runtime.context import ConnectionContext
from mqproxy.runtime.streams import direct_sender

_READ_BYTES = 65536
_COALESCE = 256
_CLEANUP_S = 5.0
#: A subscription reader that keeps finding its long-poll ready yields at least every this many rounds.
_YIELD_EVERY = 8


class _Close(Exception):
    """End the connection: ``reason_code`` goes in a DISCONNECT (MQTT 5) or CONNACK (before CONNACK)."""

    def __init__(self, reason_code: ReasonCode | None, error: str | None, detail: str | None = None) -> None:
        super().__init__(error or "closed")
        self.reason_code = reason_code
        self.error = error
        self.detail = detail


def _error_name(code: ReasonCode) -> str:
    return {
        ReasonCode.MALFORMED_PACKET: "malformed_packet",
        ReasonCode.PROTOCOL_ERROR: "protocol_error",
        ReasonCode.PACKET_TOO_LARGE: "packet_too_large",
    }.get(code, code.name.lower())


@dataclasses.dataclass(slots=True)
class _Inbound:
    """One client PUBLISH, checked, on its way to the store and its acknowledgement."""

    packet: Publish
    topic: str
    properties: Properties
    reason: ReasonCode = ReasonCode.SUCCESS
    duplicate: bool = False
    error: str | None = None  # the store refused it

    @property
    def stored(self) -> bool:
        """True if this PUBLISH is to be written (not a QoS 2 duplicate, payload valid)."""
        return not self.duplicate and self.reason == ReasonCode.SUCCESS


def _is_error(status: str) -> bool:
    code = ReasonCode.__members__.get(status)
    return code is not None and code.is_error


class MqttConnection:
    def __init__(self, stream: trio.abc.Stream, ctx: ConnectionContext, gateway: Gateway) -> None:
        self.stream = stream
        self.ctx = ctx
        self.gateway = gateway
        self.config = gateway.config
        self.level = 4
        self.decoder = MqttDecoder(self.config.max_packet_size)
        self.connected = False
        self.session: Session | None = None
        self.client_id = ""
        self.username: str | None = None
        self.will: Will | None = None
        self.keep_alive = 0
        self.client_max_packet: int | None = None
        self.problem_information = True
        self.aliases: dict[int, str] = {}  # client→server Topic Aliases
        self.alias_maximum = 0  # the client's Topic Alias Maximum (server→client aliases allowed)
        self.out_aliases: dict[str, int] = {}
        self.normal_disconnect = False
        self.will_on_disconnect = False
        self.detached = trio.Event()
        self._send, self._receive = trio.open_memory_channel[bytes](self.config.send_buffer_packets)
        self._direct = direct_sender(stream)
        self._queued = 0  # byte strings handed to the writer and not yet sent
        self._writer_done = trio.Event()
        self._read_scope = trio.CancelScope()
        self._kicked: _Close | None = None
        self._readers: dict[str, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        #: QoS 2 acks (PUBREL, PUBCOMP) that wait until the session's QoS 2 state is durable.
        self._deferred: list[Packet] = []
        #: Durable QoS 2 deliveries whose PUBLISH waits until their record is durable.
        self._held: list[InFlight] = []

    # --- lifecycle ----------------------------------------------------------------------------
    async def run(self) -> None:
        close = _Close(None, None)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                nursery.start_soon(self._watch_drain)
                try:
                    close = await self._read_loop()
                finally:
                    for scope in self._readers.values():
                        scope.cancel()
                    self._final_packet(close)
                    self._send.close()
                    self._direct = None
                    with trio.move_on_after(1.0):
                        await self._writer_done.wait()
                    nursery.cancel_scope.cancel()
        finally:
            if close.error and self.ctx.error is None:
                self.ctx.error = close.error
                self.ctx.detail = close.detail
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + _CLEANUP_S
                try:
                    await self._detach()
                finally:
                    self.detached.set()

    def kick(self, reason_code: ReasonCode | None, error: str | None, detail: str | None = None) -> None:
        """Ask the connection to close (takeover, drain, slow consumer, store failure)."""
        if self._kicked is None:
            self._kicked = _Close(reason_code, error, detail)
        self._read_scope.cancel()

    async def _watch_drain(self) -> None:
        await self.ctx.draining.wait()
        self.ctx.detail = self.ctx.detail or "server shutting down"
        self.kick(ReasonCode.SERVER_SHUTTING_DOWN, None, "server shutting down")

    def _final_packet(self, close: _Close) -> None:
        if close.reason_code is None:
            return
        packet: Packet | None = None
        if not self.connected:
            # A refused CONNECT is answered at every level; a CONNECT the codec could not read, only in
            # MQTT 5 (and for an unsupported level, which 3.1.1 answers with return code 1).
            if (
                self.client_id
                or self.level == MQTT_5
                or close.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
            ):
                packet = Connack(False, close.reason_code)
        elif self.level == MQTT_5:
            # A Reason String (unless the client asked for none) also makes paho read the reason code,
            # which it ignores in a DISCONNECT of remaining length 1.
            why = (close.detail or close.error or "")[:200]
            props = Properties(reason_string=why) if why and self.problem_information else NO_PROPERTIES
            packet = Disconnect(close.reason_code, props)
        if packet is not None:
            self._write_nowait(encode(packet, self.level))

    async def _writer(self) -> None:
        receive = self._receive
        try:
            async for first in receive:
                chunks = [first]
                while len(chunks) < _COALESCE:
                    try:
                        chunks.append(receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                with trio.move_on_after(self.config.write_timeout_s) as scope:
                    await self.stream.send_all(b"".join(chunks) if len(chunks) > 1 else first)
                if scope.cancelled_caught:
                    self.kick(None, "slow_consumer", f"peer took no data for {self.config.write_timeout_s}s")
                    return
                self._queued -= len(chunks)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.kick(None, "connection_reset", str(exc) or type(exc).__name__)
        finally:
            self._direct = None  # a packet may be cut short: nothing more goes to this socket
            receive.close()
            self._writer_done.set()

    async def send(self, packet: Packet) -> None:
        await self._send_bytes(encode(packet, self.level))

    async def _send_bytes(self, data: bytes) -> None:
        """Queue bytes for the writer. No schedule point while the queue has room, so the packets of one
        read (e.g. a burst of PUBACKs) reach the writer together and leave in one ``send_all``."""
        self._queued += 1  # counted before any wait: the writer may send it before we resume
        try:
            try:
                self._send.send_nowait(data)
            except trio.WouldBlock:
                await self._send.send(data)
        except BaseException:
            self._queued -= 1
            raise

    def _write_nowait(self, data: bytes) -> bool:
        """Send ``data`` after everything queued before it, without a schedule point: straight to the
        socket if nothing is queued and the socket takes it (what it does not take is queued), else
        queued for the writer. False, with nothing written, if the queue is full or closed."""
        if not self._queued and self._direct is not None:
            try:
                written = self._direct(data)
            except trio.BrokenResourceError:
                self._direct = None  # the writer's send_all reports it and closes the connection
                written = 0
            if written == len(data):
                return True
            data = data[written:]  # the queue is empty, so the rest fits
        try:
            self._send.send_nowait(data)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        self._queued += 1
        return True

    async def _detach(self) -> None:
        session = self.session
        if session is None:
            return
        gateway = self.gateway
        try:
            if session.connection is self:
                session.connection = None
                session.wake_all()
                await gateway.detached(session)
            if self.will is not None and (not self.normal_disconnect or self.will_on_disconnect):
                await self._publish_will(session)
        except BackendError as exc:
            self.ctx.error = self.ctx.error or "store_failed"
            self.ctx.detail = str(exc)

    async def _publish_will(self, session: Session) -> None:
        will = self.will
        assert will is not None
        delay = will.properties.will_delay_interval or 0 if self.level == MQTT_5 else 0
        if session.persistent and not session.ended and delay > 0:
            if session.expiry_interval != NEVER_EXPIRES:
                delay = min(delay, session.expiry_interval)
            epoch = session.epoch

            async def fire() -> None:
                if session.ended or (session.connection is None and session.epoch == epoch):
                    await self._store_will(will)

            self.gateway.call_later(delay, fire)
            return
        await self._store_will(will)

    async def _store_will(self, will: Will) -> None:
        await self.gateway.publish(
            will.topic,
            will.payload,
            int(will.qos),
            will.retain,
            will.properties,
            self.client_id,
            self.ctx.peer,
        )

    # --- reading ------------------------------------------------------------------------------
    async def _read_loop(self) -> _Close:
        with self._read_scope:
            try:
                await self._read_packets()
            except _Close as close:
                return close
            except MqttCodecError as exc:
                return _Close(exc.reason_code, _error_name(exc.reason_code), exc.reason)
            except BackendError as exc:
                return _Close(ReasonCode.UNSPECIFIED_ERROR, "store_failed", str(exc))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                return self._kicked or _Close(None, "connection_reset", str(exc) or type(exc).__name__)
        return self._kicked or _Close(None, None)

    def _timeout(self) -> float:
        if not self.connected:
            return self.config.connect_timeout_s
        if self.keep_alive == 0:
            return float("inf")
        return self.keep_alive * 1.5

    async def _read_packets(self) -> None:
        while True:
            data = b""
            with trio.move_on_after(self._timeout()) as scope:
                try:
                    data = await self.stream.receive_some(_READ_BYTES)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise _Close(None, "connection_reset", str(exc) or type(exc).__name__) from None
            if scope.cancelled_caught:
                if not self.connected:
                    raise _Close(
                        None, "connect_timeout", f"no CONNECT within {self.config.connect_timeout_s}s"
                    )
                raise _Close(
                    ReasonCode.KEEP_ALIVE_TIMEOUT, "keepalive_timeout", f"keep alive {self.keep_alive}s"
                )
            if not data:
                if self.connected and not self.normal_disconnect:
                    self.ctx.detail = self.ctx.detail or "peer closed without DISCONNECT"
                raise _Close(None, None)
            try:
                packets = self.decoder.receive_data(data)
            except MqttCodecError:
                if self.decoder.protocol_level is not None:
                    self.level = self.decoder.protocol_level
                raise
            index = 0
            while index < len(packets):
                packet = packets[index]
                if isinstance(packet, Publish):
                    # A run of PUBLISHes from one read is stored with one batch write per parent topic.
                    end = index + 1
                    while end < len(packets) and isinstance(packets[end], Publish):
                        end += 1
                    await self._on_publishes(packets[index:end])  # type: ignore[arg-type]
                    index = end
                    continue
                await self._handle_logged(packet)
                index += 1
                if self.normal_disconnect:
                    raise _Close(None, None)
            if self._deferred or self._held:
                await self._flush_state()

    def _log_request(
        self, kind: PacketType, status: str, started: float, topic: str | None, failed: bool = False
    ) -> None:
        self.ctx.request_event(
            op=kind.name,
            code=int(kind),
            status=status,
            outcome="error" if failed or _is_error(status) else "ok",
            latency_ms=round((time.perf_counter() - started) * 1000, 3),
            client_id=self.client_id or None,
            topic=topic,
        )

    async def _handle_logged(self, packet: Packet) -> None:
        started = time.perf_counter()
        status = "SUCCESS"
        failed = False
        topic: str | None = None
        try:
            status, topic = await self._handle(packet)
        except _Close as close:
            status = close.reason_code.name if close.reason_code is not None else "CLOSED"
            failed = True
            raise
        finally:
            kind = PACKET_TYPES[type(packet)]
            if kind is not PacketType.PINGREQ:
                self._log_request(kind, status, started, topic, failed)

    async def _handle(self, packet: Packet) -> tuple[str, str | None]:
        """Handle one packet; returns (status for the request event, topic)."""
        if isinstance(packet, Connect):
            return await self._on_connect(packet), None
        session = self.session
        assert session is not None  # the decoder refuses anything before CONNECT
        if isinstance(packet, PubAck | PubComp):
            entry = session.finish(packet.packet_id)
            if entry is None:
                return "PACKET_IDENTIFIER_NOT_FOUND", None
            if entry.cursor is not None:
                await entry.cursor.commit(self.gateway.backend)
            return "SUCCESS", None
        if isinstance(packet, PubRec):
            entry = session.inflight.get(packet.packet_id)
            if entry is None:
                await self.send(PubRel(packet.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
                return "PACKET_IDENTIFIER_NOT_FOUND", None
            if packet.reason_code.is_error:
                session.finish(packet.packet_id)
                return packet.reason_code.name, None
            entry.released = True
            if entry.durable:  # the peer may forget the id once it has the PUBREL: record that first
                self._deferred.append(PubRel(packet.packet_id))
            else:
                await self.send(PubRel(packet.packet_id))
            return "SUCCESS", None
        if isinstance(packet, PubRel):
            if session.release(packet.packet_id):
                if session.persistent:  # the peer may reuse the id after PUBCOMP: record that first
                    self._deferred.append(PubComp(packet.packet_id))
                else:
                    await self.send(PubComp(packet.packet_id))
                return "SUCCESS", None
            await self.send(PubComp(packet.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
            return "PACKET_IDENTIFIER_NOT_FOUND", None
        if isinstance(packet, Subscribe):
            return await self._on_subscribe(packet)
        if isinstance(packet, Unsubscribe):
            return await self._on_unsubscribe(packet)
        if isinstance(packet, PingReq):
            await self.send(PingResp())
            return "SUCCESS", None
        if isinstance(packet, Disconnect):
            if self._deferred:
                await self._flush_state()
            return self._on_disconnect(packet), None
        raise _Close(
            ReasonCode.PROTOCOL_ERROR, "protocol_error", f"unexpected {type(packet).__name__} from client"
        )

    # --- CONNECT ------------------------------------------------------------------------------
    async def _on_connect(self, packet: Connect) -> str:
        self.level = packet.protocol_level
        v5 = self.level == MQTT_5
        config = self.config
        client_id = packet.client_id
        assigned: str | None = None
        if not client_id:
            if not packet.clean_start and not v5:
                self.client_id = "-"  # marks the CONNECT as read: the refusal gets a CONNACK
                raise _Close(
                    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
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
            raise _Close(
                ReasonCode.QOS_NOT_SUPPORTED, "qos_not_supported", "will QoS above the server maximum"
            )
        verdict = await self.gateway.auth.authenticate(packet.username, packet.password)
        if verdict == ReasonCode.SUCCESS and packet.will is not None:
            if not self.gateway.auth.can_publish(client_id, packet.username, packet.will.topic):
                verdict = ReasonCode.NOT_AUTHORIZED
        if verdict != ReasonCode.SUCCESS:
            raise _Close(verdict, "auth_failed", f"user {packet.username!r}: {verdict.name}")
        self.username = packet.username
        self.keep_alive = packet.keep_alive
        server_keep_alive = None
        limit = config.max_keep_alive
        if v5 and limit is not None and (self.keep_alive == 0 or self.keep_alive > limit):
            self.keep_alive = server_keep_alive = limit
        self.client_id = client_id
        gateway = self.gateway
        await gateway.ready()
        previous = gateway.sessions.get(client_id)
        if previous is not None and previous.connection is not None:
            old: MqttConnection = previous.connection
            old.kick(
                ReasonCode.SESSION_TAKEN_OVER, "session_taken_over", f"client id reused by {self.ctx.conn_id}"
            )
            with trio.move_on_after(_CLEANUP_S):
                await old.detached.wait()
        session, present = await gateway.open_session(client_id, packet.clean_start, expiry, send_quota)
        if session.connection is not None:  # the old connection did not let go in time
            raise _Close(ReasonCode.SERVER_BUSY, "takeover_timeout", "previous connection still attached")
        session.connection = self
        self.session = session
        self.will = packet.will
        connack_props = NO_PROPERTIES
        if v5:
            connack_props = Properties(
                receive_maximum=config.receive_maximum,
                maximum_packet_size=config.max_packet_size,
                topic_alias_maximum=config.topic_alias_maximum,
                maximum_qos=config.maximum_qos if config.maximum_qos < 2 else None,
                assigned_client_identifier=assigned,
                server_keep_alive=server_keep_alive,
            )
        await self.send(Connack(present, ReasonCode.SUCCESS, connack_props))
        self.connected = True
        if session.restored:  # first attach after a restart: QoS 2 deliveries under their original ids
            await session.restore_inflight(gateway.backend, self._restored_publish)
        for entry in list(session.inflight.values()):
            if entry.released:
                await self.send(PubRel(entry.packet_id))
            else:
                await self.send(dataclasses.replace(entry.publish, dup=True))
        for topic_filter in session.subscriptions:
            self._start_reader(topic_filter)
        return "SUCCESS"

    def _on_disconnect(self, packet: Disconnect) -> str:
        session = self.session
        assert session is not None
        new_expiry = packet.properties.session_expiry_interval
        if new_expiry is not None:
            if session.expiry_interval == 0 and new_expiry != 0:
                raise _Close(
                    ReasonCode.PROTOCOL_ERROR, "protocol_error", "session expiry set at DISCONNECT after 0"
                )
            session.expiry_interval = new_expiry
        self.normal_disconnect = True
        self.will_on_disconnect = packet.reason_code == ReasonCode.DISCONNECT_WITH_WILL_MESSAGE
        return packet.reason_code.name

    # --- PUBLISH from the client ----------------------------------------------------------------
    def _check_publish(self, packet: Publish, pending_qos2: set[int]) -> _Inbound:
        """Resolve the topic alias and check a client PUBLISH; raises _Close for what ends the connection."""
        session = self.session
        assert session is not None
        topic = packet.topic
        props = packet.properties
        if props.topic_alias is not None:
            alias = props.topic_alias
            if alias > self.config.topic_alias_maximum:
                raise _Close(ReasonCode.TOPIC_ALIAS_INVALID, "topic_alias_invalid", f"topic alias {alias}")
            if topic:
                self.aliases[alias] = topic
            else:
                known = self.aliases.get(alias)
                if known is None:
                    raise _Close(ReasonCode.PROTOCOL_ERROR, "protocol_error", f"unknown topic alias {alias}")
                topic = known
            props = dataclasses.replace(props, topic_alias=None)
        elif not topic:
            raise _Close(ReasonCode.PROTOCOL_ERROR, "protocol_error", "empty topic without topic alias")
        if props.subscription_identifiers:
            props = dataclasses.replace(props, subscription_identifiers=())
        if packet.qos > self.config.maximum_qos:
            raise _Close(
                ReasonCode.QOS_NOT_SUPPORTED, "qos_not_supported", f"PUBLISH at QoS {int(packet.qos)}"
            )
        inbound = _Inbound(packet, topic, props)
        if not self.gateway.auth.can_publish(self.client_id, self.username, topic):
            inbound.reason = ReasonCode.NOT_AUTHORIZED  # not stored; 3.1.1 acks carry no code (dropped)
            return inbound
        packet_id = packet.packet_id
        if packet.qos == QoS.EXACTLY_ONCE and packet_id is not None:
            if packet_id in session.awaiting_rel or packet_id in pending_qos2:
                inbound.duplicate = True  # re-sent before PUBREL: acknowledge, do not store again
                return inbound
            if len(session.awaiting_rel) + len(pending_qos2) >= self.config.receive_maximum:
                raise _Close(
                    ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                    "receive_maximum_exceeded",
                    f"{len(session.awaiting_rel) + len(pending_qos2)} QoS 2 in flight",
                )
            pending_qos2.add(packet_id)
        if props.payload_format_indicator == 1:
            try:
                packet.payload.decode("utf-8")
            except UnicodeDecodeError:
                inbound.reason = ReasonCode.PAYLOAD_FORMAT_INVALID
        return inbound

    async def _on_publishes(self, packets: list[Publish]) -> None:
        """Store a run of client PUBLISHes, then acknowledge them in order (one request event each).

        Packets before one that ends the connection are still stored and acknowledged.
        """
        session = self.session
        assert session is not None
        started = time.perf_counter()
        inbound: list[_Inbound] = []
        failure: _Close | None = None
        pending_qos2: set[int] = set()
        if session.unconfirmed:  # after a restart: was a re-sent QoS 2 PUBLISH stored before the crash?
            for packet in packets:
                if packet.qos == QoS.EXACTLY_ONCE and packet.packet_id in session.unconfirmed:
                    await session.confirm_stored(
                        self.gateway.backend, packet.packet_id, self.client_id, packet.topic, packet.payload
                    )
        for packet in packets:
            try:
                inbound.append(self._check_publish(packet, pending_qos2))
            except _Close as close:
                failure = close
                break
        to_store = [item for item in inbound if item.stored]
        accepted_qos2 = [
            (i.packet.packet_id, i.topic)
            for i in to_store
            if i.packet.qos == QoS.EXACTLY_ONCE and i.packet.packet_id is not None
        ]
        if accepted_qos2:
            await self._expect_pubrel(session, accepted_qos2)
        if to_store:
            outcomes = await self.gateway.publish_many(
                [
                    (i.topic, i.packet.payload, int(i.packet.qos), i.packet.retain, i.properties)
                    for i in to_store
                ],
                self.client_id,
                self.ctx.peer,
            )
            for item, outcome in zip(to_store, outcomes, strict=True):
                if isinstance(outcome, BackendError):
                    item.error = str(outcome)
                    item.reason = (
                        ReasonCode.QUOTA_EXCEEDED
                        if isinstance(outcome, MessageTooLarge)
                        else ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
                    )
        for item in to_store:
            packet_id = item.packet.packet_id
            if item.packet.qos == QoS.EXACTLY_ONCE and packet_id is not None:
                if item.reason.is_error:  # not stored: a re-send is a new attempt
                    session.awaiting_rel.discard(packet_id)
                session.rel_marks.pop(packet_id, None)  # stored (or refused): nothing to look for
        for item in inbound:
            packet = item.packet
            if item.error is not None and self.level != MQTT_5:  # 3.1.1 cannot refuse one PUBLISH
                self._log_request(PacketType.PUBLISH, "CLOSED", started, item.topic, True)
                raise _Close(None, "store_failed", item.error)
            packet_id = packet.packet_id
            if packet.qos == QoS.AT_LEAST_ONCE and packet_id is not None:
                await self.send(PubAck(packet_id, item.reason))
            elif packet.qos == QoS.EXACTLY_ONCE and packet_id is not None:
                await self.send(PubRec(packet_id, item.reason))
            status = "DUPLICATE" if item.duplicate else item.reason.name
            self._log_request(PacketType.PUBLISH, status, started, item.topic)
        if failure is not None:
            status = failure.reason_code.name if failure.reason_code is not None else "CLOSED"
            self._log_request(PacketType.PUBLISH, status, started, None, True)
            raise failure

    # --- SUBSCRIBE / UNSUBSCRIBE ------------------------------------------------------------------
    async def _on_subscribe(self, packet: Subscribe) -> tuple[str, str | None]:
        session = self.session
        assert session is not None
        v5 = self.level == MQTT_5
        config = self.config
        sub_id = (
            packet.properties.subscription_identifiers[0]
            if packet.properties.subscription_identifiers
            else None
        )
        codes: list[ReasonCode] = []
        retained: list[tuple[SubscriptionSpec, str]] = []
        for wanted in packet.topics:
            try:
                parsed = parse_topic_filter(wanted.topic_filter)
            except MqttCodecError:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID if v5 else ReasonCode.UNSPECIFIED_ERROR)
                continue
            if wanted.topic_filter in config.deny_subscribe or not self.gateway.auth.can_subscribe(
                self.client_id, self.username, wanted.topic_filter
            ):
                codes.append(ReasonCode.NOT_AUTHORIZED if v5 else ReasonCode.UNSPECIFIED_ERROR)
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
            new = await self.gateway.subscribe(session, spec)
            codes.append(ReasonCode(granted))
            if new:
                self._start_reader(wanted.topic_filter)
            if parsed.share_group is None and (
                spec.retain_handling == 0 or (spec.retain_handling == 1 and new)
            ):
                retained.append((spec, parsed.filter))
        await self.send(SubAck(packet.packet_id, tuple(codes)))
        for spec, inner in retained:
            for message in self.gateway.retained.matching(inner):
                publish = self._make_publish(
                    message.topic,
                    message.payload,
                    message.qos,
                    True,
                    message.properties,
                    message.store_timestamp_ms,
                    spec,
                )
                if publish is not None:
                    await self._push(publish, None, message.commitlog_offset, retained_for=spec.topic_filter)
        if self._held:
            await self._flush_state()
        first = packet.topics[0].topic_filter if packet.topics else None
        worst = next((c for c in codes if c.is_error), None)
        return (worst.name if worst is not None else "SUCCESS"), first

    async def _on_unsubscribe(self, packet: Unsubscribe) -> tuple[str, str | None]:
        session = self.session
        assert session is not None
        codes: list[ReasonCode] = []
        for topic_filter in packet.topic_filters:
            scope = self._readers.pop(topic_filter, None)
            if scope is not None:
                scope.cancel()
            existed = await self.gateway.unsubscribe(session, topic_filter)
            codes.append(ReasonCode.SUCCESS if existed else ReasonCode.NO_SUBSCRIPTION_EXISTED)
        await self.send(UnsubAck(packet.packet_id, tuple(codes) if self.level == MQTT_5 else ()))
        return "SUCCESS", packet.topic_filters[0] if packet.topic_filters else None

    # --- delivery -----------------------------------------------------------------------------
    def _start_reader(self, topic_filter: str) -> None:
        assert self._nursery is not None
        assert self.session is not None
        scope = trio.CancelScope()
        self._readers[topic_filter] = scope
        if topic_filter in self.session.shared:
            self._nursery.start_soon(self._shared_reader, topic_filter, scope)
        else:
            self._nursery.start_soon(self._reader, topic_filter, scope)

    async def _shared_reader(self, topic_filter: str, scope: trio.CancelScope) -> None:
        session = self.session
        assert session is not None
        backend = self.gateway.backend
        group = session.shared[topic_filter]
        inner = group.topic_filter
        with scope:
            try:
                while True:
                    spec = session.subscriptions.get(topic_filter)
                    if (
                        spec is None
                        or session.shared.get(topic_filter) is not group
                        or session.connection is not self
                    ):
                        return
                    await session.acquire_slot()  # claim only what this member can take now
                    message, offset = await group.claim(backend, self.config.poll_interval_s)
                    handed = False
                    try:
                        await self._deliver(spec, inner, group.cursor, message, offset, (group, message))
                        handed = True
                    finally:
                        if not handed and not any(
                            e.shared is not None and e.shared[1] is message for e in session.inflight.values()
                        ):
                            group.give_back(message, offset)
                    if self._held:
                        await self._flush_state()  # a QoS 2 delivery goes out once its record is durable
                    await group.cursor.commit(backend)
                    await trio.lowlevel.checkpoint()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            except BackendError as exc:
                self.kick(ReasonCode.UNSPECIFIED_ERROR, "store_failed", str(exc))

    async def _reader(self, topic_filter: str, scope: trio.CancelScope) -> None:
        session = self.session
        assert session is not None
        backend = self.gateway.backend
        inner = reader_filter(topic_filter)
        hubs = self.gateway.push_hubs
        rounds = 0
        with scope:
            try:
                while True:
                    spec = session.subscriptions.get(topic_filter)
                    cursor = session.cursors.get(topic_filter)
                    if spec is None or cursor is None or session.connection is not self:
                        return
                    start = cursor.next_offset
                    result = await self.gateway.read_cache.pull(
                        cursor.lmq, LMQ_QUEUE_ID, start, self.config.pull_batch
                    )
                    if not result.messages:
                        if result.status is PullStatus.OFFSET_ILLEGAL and result.next_offset != start:
                            cursor.next_offset = result.next_offset
                            if result.next_offset > start:
                                cursor.complete(result.next_offset - 1)  # the gap is gone from the store
                            continue
                        await hubs.park(topic_filter, cursor, self._deliver_now, self.config.poll_interval_s)
                        continue
                    offset = start
                    for message in result.messages:
                        await self._deliver(spec, inner, cursor, message, offset)
                        offset += 1
                        cursor.next_offset = offset
                    if self._held:
                        await self._flush_state()
                    await session.commit_offsets(backend)
                    rounds += 1
                    caught_up = len(result.messages) < self.config.pull_batch
                    if not caught_up or rounds % _YIELD_EVERY == 0:
                        await trio.lowlevel.checkpoint()  # the store may answer without yielding
                    if caught_up:
                        # Probably caught up: long-poll before pulling again (returns at once if not; a
                        # wait that blocks is the yield, so rounds that end in one skip the checkpoint).
                        await hubs.park(topic_filter, cursor, self._deliver_now, self.config.poll_interval_s)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            except BackendError as exc:
                self.kick(ReasonCode.UNSPECIFIED_ERROR, "store_failed", str(exc))

    async def _deliver(
        self,
        spec: SubscriptionSpec,
        inner: str,
        cursor: Cursor,
        message: StoredMessage,
        offset: int,
        shared: Any = None,
    ) -> None:
        session = self.session
        assert session is not None
        if cursor.restored and cursor.reached(offset):
            return  # restored after a restart: in flight under its original id, or already done
        delivery = self.gateway.read_cache.delivery(message)
        shared_bytes = self._shared_qos0(spec, inner, session, delivery)
        if shared_bytes is not None:
            if shared_bytes:
                await self._send_bytes(shared_bytes)
            cursor.complete(offset)
            return
        attrs = delivery.attributes
        assert attrs is not None  # _shared_qos0 answered b"" otherwise
        retain = attrs.retain and spec.retain_as_published
        publish = self._make_publish(
            attrs.topic, message.body, attrs.qos, retain, attrs.properties, message.store_timestamp_ms, spec
        )
        if publish is None:
            cursor.complete(offset)
            return
        await self._push(publish, cursor, offset, shared)

    def _shared_qos0(
        self, spec: SubscriptionSpec, inner: str, session: Session, delivery: Delivery
    ) -> bytes | None:
        """How ``delivery`` reaches this subscriber if no per-subscriber state is involved: ``b""`` if not
        at all (another topic, no-local, too big for the client), the QoS 0 PUBLISH bytes every such
        subscriber shares (encoded once per message), or None when it needs :meth:`_make_publish`."""
        attrs = delivery.attributes
        if (
            attrs is None
            or not topic_matches(inner, attrs.topic)
            or (spec.no_local and attrs.client_id == session.client_id)
        ):
            return b""
        if (
            (attrs.qos == 0 or spec.qos == 0 or self.config.maximum_qos == 0)
            and attrs.properties.message_expiry_interval is None
            and not self.alias_maximum
            and (spec.subscription_id is None or self.level != MQTT_5)
        ):
            data = delivery.qos0_publish(self.level, attrs.retain and spec.retain_as_published)
            return data if self.client_max_packet is None or len(data) <= self.client_max_packet else b""
        return None

    def _deliver_now(
        self, topic_filter: str, cursor: Cursor, messages: Sequence[StoredMessage], offset: int
    ) -> int:
        """The push hub's callback (see :mod:`.push_hub`): handle the leading ``messages`` (the first at
        ``offset``) that need no waiting, with one write; how many, the cursor moved past them."""
        session = self.session
        if (
            session is None
            or session.connection is not self
            or session.cursors.get(topic_filter) is not cursor
        ):
            return 0
        spec = session.subscriptions.get(topic_filter)
        if spec is None or cursor.restored:
            return 0
        inner = reader_filter(topic_filter)
        delivery = self.gateway.read_cache.delivery
        parts: list[bytes] = []
        handled = 0
        for message in messages:
            data = self._shared_qos0(spec, inner, session, delivery(message))
            if data is None:
                break
            if data:
                parts.append(data)
            handled += 1
        if parts and not self._write_nowait(parts[0] if len(parts) == 1 else b"".join(parts)):
            return 0
        for done in range(offset, offset + handled):
            cursor.complete(done)
        cursor.next_offset = offset + handled
        return handled

    def _make_publish(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        props: Properties,
        store_ms: int,
        spec: SubscriptionSpec,
    ) -> Publish | None:
        """The PUBLISH for one subscriber, or None if the message expired."""
        expiry = props.message_expiry_interval
        if expiry is not None:
            remaining = expiry - (now_ms() - store_ms) // 1000
            if remaining <= 0:
                return None
            props = dataclasses.replace(props, message_expiry_interval=remaining)
        if self.level != MQTT_5:
            props = NO_PROPERTIES
        elif spec.subscription_id is not None:
            props = dataclasses.replace(props, subscription_identifiers=(spec.subscription_id,))
        granted = QoS(min(qos, spec.qos, self.config.maximum_qos))
        return Publish(topic, payload, granted, retain, False, 1 if granted else None, props)

    async def _push(
        self,
        publish: Publish,
        cursor: Cursor | None,
        offset: int,
        shared: Any = None,
        retained_for: str | None = None,
    ) -> None:
        session = self.session
        assert session is not None
        data = encode(publish, self.level)
        if self.client_max_packet is not None and len(data) > self.client_max_packet:
            if cursor is not None:
                cursor.complete(offset)  # [MQTT-3.1.2-25]: discard what the client cannot take
            return
        if publish.qos == QoS.AT_MOST_ONCE:
            await self._send_bytes(encode(self._aliased(publish), self.level) if self.alias_maximum else data)
            if cursor is not None:
                cursor.complete(offset)
            return
        if self._held and len(session.inflight) >= session.send_quota:
            await self._flush_state()  # the window is full: what we hold must go before we wait
        await session.acquire_slot()
        if session.connection is not self:
            raise trio.ClosedResourceError("session detached")

        def factory(packet_id: int) -> Publish:
            return dataclasses.replace(publish, packet_id=packet_id)

        entry = session.add_inflight(factory, cursor, offset, shared, retained_for)
        if entry.durable:
            self._held.append(entry)  # sent by _flush_state once its record is durable
            return
        # The session keeps the full PUBLISH: aliases belong to this connection only.
        await self.send(self._aliased(entry.publish) if self.alias_maximum else entry.publish)

    async def _expect_pubrel(self, session: Session, accepted: list[tuple[int, str]]) -> None:
        """Add the ids of QoS 2 PUBLISHes about to be stored to ``awaiting_rel``; for a persistent session
        make them durable first, each with the size of its topic's LMQ, so that after a crash a re-sent
        PUBLISH can be told apart: stored already, or never (``Session.confirm_stored``)."""
        session.awaiting_rel.update(packet_id for packet_id, _ in accepted)
        if not session.persistent:
            return
        sizes: dict[str, int] = {}
        for packet_id, topic in accepted:
            lmq = lmq_name(topic)
            if lmq not in sizes:
                sizes[lmq] = await self.gateway.backend.max_offset(lmq, LMQ_QUEUE_ID)
            session.rel_marks[packet_id] = (lmq, sizes[lmq])
        await self._flush_state()

    async def _flush_state(self) -> None:
        """Write the session snapshot (QoS 2 ids and phases), then send what waited for it: the deferred
        acks and the held PUBLISHes. Any task may call it; what it could not send stays queued."""
        session = self.session
        assert session is not None
        deferred, self._deferred = self._deferred, []
        held, self._held = self._held, []
        try:
            await self.gateway.persist(session)
            while deferred:
                await self.send(deferred[0])
                del deferred[0]
            while held:
                entry = held[0]
                if session.inflight.get(entry.packet_id) is entry and not entry.released:
                    await self.send(self._aliased(entry.publish) if self.alias_maximum else entry.publish)
                del held[0]
        finally:
            self._deferred[:0] = deferred
            self._held[:0] = held

    def _restored_publish(
        self, spec: SubscriptionSpec, message: StoredMessage, retained: bool
    ) -> Publish | None:
        """The PUBLISH of a QoS 2 delivery restored after a restart (see ``Session.restore_inflight``);
        ``retained``: it was a retained message sent at SUBSCRIBE."""
        attrs = decode_properties(message.properties)
        if attrs is None:
            return None
        retain = attrs.retain and (retained or spec.retain_as_published)
        return self._make_publish(
            attrs.topic, message.body, attrs.qos, retain, attrs.properties, message.store_timestamp_ms, spec
        )

    def _aliased(self, publish: Publish) -> Publish:
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
