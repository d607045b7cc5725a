"""One MQTT network connection: :class:`MqttConnection`, the trio adapter around the sans-IO core
(:class:`~mqproxy.mqtt.protocol.MqttProtocol`), served by the MQTT service.

Tasks per connection (hosted by a :class:`~mqproxy.runtime.tasks.TaskHost` in the nursery that runs the
connection, not a nursery each): the packet reader (this task; its read deadline, CONNECT timeout or 1.5 x
keep alive, is checked by the run's one keep-alive timer (:mod:`mqproxy.mqtt.keepalive`), which cancels the
connection's one read scope when it passes: no cancel scope or trio deadline per read), a writer only while
packets wait to be sent (:mod:`mqproxy.mqtt.writer`: on plain TCP a packet goes straight to the socket
when nothing is queued before it; bounded outbox; a peer that takes nothing for ``write_timeout_s`` is a
slow consumer and is disconnected), and one delivery reader per subscription
(:mod:`mqproxy.mqtt.delivery`). An idle connection is one task: the server's drain reaches it through the
gateway's registry of live connections (:meth:`Gateway.drains`), not a watcher task of its own.
Client PUBLISHes that arrive in one read are stored with one batch write per parent topic and then
acknowledged in order (PUBACK / PUBREC only after the store accepted them); under light load (no task
runnable but the push hubs) the connection yields once between the write and the acknowledgements, so
caught-up subscribers get the run first. The request events of such a run, and of a run of PUBACKs read
together, are reported as one run (a ``request.run`` event, see the log event schema).

QoS 2 of a persistent session survives a crash: what the peer may act on is recorded in the session
snapshot before the packet leaves (``_flush_state``, one write per read or delivery round): inbound ids
before their PUBREC, their removal before PUBCOMP, an outbound delivery before its PUBLISH, its release
before PUBREL. After a restart the first CONNECT re-sends them under their original packet ids.

Closing: MQTT 5 peers get a DISCONNECT (or, while connecting, a CONNACK) with the reason code first; 3.1.1
peers are closed silently, except that a refused CONNECT gets its CONNACK return code (0x01 for an
unsupported level, 0x02 for a rejected client id, 0x03 (Server unavailable, 0x88 in MQTT 5, error
``mqtt_unavailable``) when the store cannot be reached at CONNECT, e.g. a cluster node whose cluster is
down, or 0x89 server busy, error ``server_draining``, for a CONNECT read while the server drains). The
session is then detached (ended or persisted) and the will is published unless the client
sent a normal DISCONNECT.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import trio

from mqproxy.codecs import mqtt as mq
from mqproxy.model.errors import (
    BackendError,
)
from mqproxy.mqtt.delivery import ReaderHandle
from mqproxy.mqtt.gateway import Gateway
from mqproxy.mqtt.inbound_publishes import InboundPublishes
from mqproxy.mqtt.keepalive import keepalive_timer
from mqproxy.mqtt.outcomes import Close, Permission, error_name, outcome
from mqproxy.mqtt.protocol import MqttProtocol
from mqproxy.mqtt.session import InFlight, Session
from mqproxy.mqtt.session_attach import CLEANUP_S, SessionAttach
from mqproxy.mqtt.subscribing import Subscribing
from mqproxy.mqtt.writer import PacketWriter
from mqproxy.runtime.context import ConnectionContext
from mqproxy.runtime.streams import plain_layers, read_nowait
from mqproxy.runtime.tasks import TaskHost

__all__ = ["MqttConnection"]

_READ_BYTES = 65536
#: Request-event ``op`` of each packet type (``Enum.name`` is a property lookup per call).
_OP_NAMES = {kind: kind.name for kind in mq.PacketType}
_PUBACK_CODE = int(mq.PacketType.PUBACK)
#: While the server drains, how long a connection that has not sent its CONNECT yet is waited for (to be
#: refused politely) before it is closed.
_DRAIN_CONNECT_WAIT_S = 2.0
_NO_DEADLINE = float("inf")
#: How a connection ends unless something else says (read-only; ``run`` replaces it, never raises it).
_NOT_CLOSED = Close(None, None)
#: What ends the read loop without being a bug (:meth:`MqttConnection._close_for`).
_READ_ENDINGS = (Close, mq.MqttCodecError, BackendError, trio.BrokenResourceError, trio.ClosedResourceError)


class MqttConnection(PacketWriter, Subscribing, InboundPublishes, SessionAttach):
    """One connection: the stream, its tasks and the gateway calls; the protocol rules are ``proto``'s.

    Slotted (no ``__dict__``, ~300 B less per connection): the slots of its mixins' attributes are declared
    here, the mixins declaring none (only one base of a class may have a slotted layout)."""

    # Its own attributes, PacketWriter's (set by _open_writer) and Subscribing's (_subacks).
    __slots__ = (
        "_broken",
        "_can_publish",
        "_can_subscribe",
        "_closed",
        "_deferred",
        "_detached",
        "_direct",
        "_held",
        "_interrupted",
        "_is_detached",
        "_kicked",
        "_limit",
        "_nursery",
        "_outbox",
        "_queued",
        "_read_scope",
        "_readers",
        "_room",
        "_subacks",
        "_waiting_on",
        "_writing",
        "config",
        "ctx",
        "gateway",
        "proto",
        "read_deadline",
        "session",
        "stream",
        "wheel_due",
        "wheel_slot",
    )

    def __init__(self, stream: trio.abc.Stream, ctx: ConnectionContext, gateway: Gateway) -> None:
        self.stream = stream
        self.ctx = ctx
        self.gateway = gateway
        self.config = gateway.config
        self.proto = MqttProtocol(gateway.config)
        self.session: Session | None = None
        self._detached: trio.Event | None = None  # made by the first waiter (most connections have none)
        self._is_detached = False
        self._open_writer(stream, self.config)
        # What ends the read loop (kick, a failed task, the keep-alive timer; see _interrupt): the scope of
        # the packets being handled, or the socket a plain TCP read waits on without a scope (notify_closing).
        self._interrupted = False
        self._read_scope: trio.CancelScope | None = None
        self._waiting_on: trio.socket.SocketType | None = None
        # The read deadline, checked by the run's one keep-alive timer (mqtt.keepalive), not trio's.
        self.read_deadline = _NO_DEADLINE
        self.wheel_due = _NO_DEADLINE
        self.wheel_slot = -1
        self._kicked: Close | None = None
        self._readers: dict[str, ReaderHandle] = {}
        self._nursery: TaskHost | None = None  # the connection's tasks (writer, readers), while it runs
        self._deferred: list[mq.Packet] = []
        self._held: list[InFlight] = []
        #: This connection's topic permissions, set when its CONNECT is admitted.
        self._can_publish: Permission = gateway.auth.can_publish
        self._can_subscribe: Permission = gateway.auth.can_subscribe
        self._subacks: list[bytes] | None = None

    @property
    def client_id(self) -> str:
        return self.proto.client_id

    # --- lifecycle ----------------------------------------------------------------------------
    async def run(self) -> None:
        close = _NOT_CLOSED  # a value, never raised: no exception object per connection while it runs
        registered = False
        # The connection's tasks run beside it, in the nursery that runs it (no nursery of its own).
        tasks = self._nursery = TaskHost(trio.lowlevel.current_task().parent_nursery, self._task_failed)
        keepalive = keepalive_timer()
        try:
            keepalive.add(self, trio.current_time() + self.proto.read_timeout())
            if self.gateway.drains(self):
                registered = True
            else:  # a draining event the gateway does not watch (tests): a watcher of its own
                tasks.start_soon(self._watch_drain)
            try:  # the read loop, inline: an idle connection waits in one frame fewer
                await self._read_packets()  # returns only when interrupted (kick, failed task, keep alive)
                close = self._kicked or self.proto.timeout_close()
            except _READ_ENDINGS as exc:
                close = self._close_for(exc)
            finally:
                for scope in self._readers.values():
                    scope.cancel()
                if tasks.error is None:
                    self._flush_subacks_nowait()  # SUBSCRIBEs handled before what ended the loop
                    await self._close_writer(self.proto.final_packet(close), 1.0)
                tasks.cancel()
                await tasks.join()
            if tasks.error is not None:  # a bug in one of the connection's tasks (as a nursery would)
                raise tasks.error
        finally:
            keepalive.discard(self)
            if registered:
                self.gateway.live.discard(self)
            if close.error and self.ctx.error is None:
                self.ctx.error = close.error
                self.ctx.detail = close.detail
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + CLEANUP_S
                try:
                    await self._detach()
                finally:
                    self._is_detached = True
                    if self._detached is not None:
                        self._detached.set()

    def expire(self) -> None:
        """The keep-alive timer: the read deadline passed (the read loop ends with ``timeout_close``)."""
        self._interrupt()

    def _task_failed(self, exc: BaseException) -> None:
        """One of the connection's tasks raised: end the read loop (``run`` re-raises ``exc``)."""
        self._interrupt()

    def _interrupt(self) -> None:
        """End the read loop promptly, wherever it is. While a read's packets are handled, their cancel
        scope is cancelled; while a plain TCP read waits for bytes and no writer task runs (no cancel scope
        then: ~630 B less per idle connection), ``trio.lowlevel.notify_closing`` wakes it (the socket stays
        open for the final packet; it would wake a writer task waiting on the socket too, so a writer task's
        start first moves the read to a wait under a cancel scope, see :meth:`PacketWriter._write_nowait`);
        in between, the loop sees ``_interrupted`` before it waits."""
        self._interrupted = True
        if self._read_scope is not None:
            self._read_scope.cancel()
        elif self._waiting_on is not None:
            sock, self._waiting_on = self._waiting_on, None
            trio.lowlevel.notify_closing(sock)

    async def wait_detached(self) -> None:
        """Wait until this connection has let go of its session (detached, will published)."""
        if not self._is_detached:
            if self._detached is None:
                self._detached = trio.Event()
            await self._detached.wait()

    def kick(self, reason_code: mq.ReasonCode | None, error: str | None, detail: str | None = None) -> None:
        """Ask the connection to close (takeover, drain, slow consumer, store failure)."""
        if self._kicked is None:
            self._kicked = Close(reason_code, error, detail)
        self._interrupt()

    def drain(self) -> None:
        """The server drains: close now (connected) or after a moment (no CONNECT yet, see
        :meth:`_watch_drain`); called by the gateway for every live connection."""
        if self.proto.connected:
            self._drain_kick()
        elif self._nursery is not None:
            self._nursery.start_soon(self._watch_drain)

    def _drain_kick(self) -> None:
        self.ctx.detail = self.ctx.detail or "server shutting down"
        self.kick(mq.ReasonCode.SERVER_SHUTTING_DOWN, None, "server shutting down")

    async def _watch_drain(self) -> None:
        await self.ctx.draining.wait()
        if not self.proto.connected:
            # A CONNECT read from now on is refused politely (CONNACK 0x89 server busy; 3.1.1 return code
            # 3 server unavailable, see _on_connect); one that does not arrive within a moment is not awaited.
            await trio.sleep(min(self.config.connect_timeout_s, _DRAIN_CONNECT_WAIT_S))
        self._drain_kick()

    # --- the end: detach, will ----------------------------------------------------------------
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
            if self.proto.will_due:
                await self._publish_will(session)
        except BackendError as exc:
            self.ctx.error = self.ctx.error or "store_failed"
            self.ctx.detail = str(exc)

    # --- reading ------------------------------------------------------------------------------
    def _close_for(self, exc: BaseException) -> Close:
        """How the connection ends after the read loop raised ``exc`` (one of ``_READ_ENDINGS``)."""
        if isinstance(exc, Close):
            return exc
        if isinstance(exc, mq.MqttCodecError):
            return Close(exc.reason_code, error_name(exc.reason_code), exc.reason)
        if isinstance(exc, BackendError):
            return Close(mq.ReasonCode.UNSPECIFIED_ERROR, "store_failed", str(exc))
        return self._kicked or Close(None, "connection_reset", str(exc) or type(exc).__name__)

    async def _read_packets(self) -> None:
        """Read and handle packets until :meth:`_interrupt` (then it returns) or the end of the connection
        (one of ``_READ_ENDINGS`` is raised)."""
        proto = self.proto
        schedule = keepalive_timer().schedule  # the deadline of each read (no cancel scope per read)
        receive_some = self.stream.receive_some
        # Plain TCP: read the socket itself once the sniffed bytes are replayed (counted as the counting
        # layer would), so an idle connection waits in one frame fewer per wrapper, and in one frame over
        # trio's wait_readable instead of trio's socket layers (runtime.streams.receive_plain, inlined here:
        # one coroutine fewer per waiting connection), and without a cancel scope (see _interrupt).
        layers = plain_layers(self.stream)
        sock = layers[0].socket if layers is not None else None
        # The prefixed layers still replaying, outermost first (their bytes come before the socket's).
        # A tuple: the empty one an idle connection keeps is shared (an empty list would be 56 B each).
        replays = tuple(p for p in layers[2] if p.replaying) if layers is not None else ()
        checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
        wait_readable = trio.lowlevel.wait_readable
        while not self._interrupted:
            schedule(self, trio.current_time() + proto.read_timeout())
            data: bytes | bytearray | None = None
            if replays:  # the sniffed bytes (a CONNECT), already counted: handled without a yield first
                await checkpoint_if_cancelled()
                data = replays[0].take_replay(_READ_BYTES)
                if not replays[0].replaying:
                    replays = replays[1:]
            elif sock is not None:
                await checkpoint_if_cancelled()
                waited = False  # a wait is a schedule point: only a read that found its bytes at once yields
                try:
                    while (data := read_nowait(sock, _READ_BYTES)) is None:
                        if self._interrupted:
                            return
                        waited = True
                        if self._writing:  # its task may wait on the socket too: wait under a cancel scope
                            try:
                                with trio.CancelScope() as self._read_scope:
                                    await wait_readable(sock)
                            finally:
                                self._read_scope = None
                            continue
                        self._waiting_on = sock  # woken by _interrupt or a writer task's start (writer.py)
                        try:
                            await wait_readable(sock)
                        except trio.ClosedResourceError:
                            pass  # woken (or the socket closed: read_nowait says so)
                        finally:
                            self._waiting_on = None
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise Close(None, "connection_reset", str(exc) or type(exc).__name__) from None
                if not waited:  # as trio's own socket reads: yield after a read that did not wait
                    await trio.lowlevel.cancel_shielded_checkpoint()
                if layers[1] is not None:
                    layers[1].bytes_in += len(data)
            with trio.CancelScope() as scope:  # only while the read's packets are handled
                self._read_scope = scope
                if self._interrupted:
                    scope.cancel()
                try:
                    await self._handle_read(data, receive_some)
                finally:
                    self._read_scope = None
            if scope.cancelled_caught:
                return
            del data, scope  # not kept alive by an idle connection's wait

    async def _handle_read(
        self, data: bytes | bytearray | None, receive_some: Callable[[int], Awaitable[bytes | bytearray]]
    ) -> None:
        """Handle the packets of one read (``data``; None: read it with ``receive_some`` first)."""
        proto = self.proto
        if data is None:
            try:
                data = await receive_some(_READ_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise Close(None, "connection_reset", str(exc) or type(exc).__name__) from None
        keepalive_timer().schedule(self, _NO_DEADLINE)
        if not data:
            if proto.connected and not proto.normal_disconnect:
                self.ctx.detail = self.ctx.detail or "peer closed without DISCONNECT"
            raise Close(None, None)
        packets = proto.receive_data(data)
        packet: mq.Packet | None = None
        index = 0
        while index < len(packets):
            packet = packets[index]
            if self._subacks and not isinstance(packet, mq.Subscribe):
                await self._flush_subacks()  # before any other answer
            if isinstance(packet, mq.Publish):
                # A run of PUBLISHes from one read is stored with one batch write per parent topic.
                end = index + 1
                while end < len(packets) and isinstance(packets[end], mq.Publish):
                    end += 1
                await self._on_publishes(packets[index:end])  # type: ignore[arg-type]
                index = end
                continue
            if (
                type(packet) is mq.PubAck
                and index + 1 < len(packets)
                and type(packets[index + 1]) is mq.PubAck
            ):
                end = index + 2  # a run of PUBACKs (QoS 1 deliveries acknowledged): one run of events
                while end < len(packets) and type(packets[end]) is mq.PubAck:
                    end += 1
                await self._on_pubacks(packets[index:end])  # type: ignore[arg-type]
                index = end
                continue
            await self._handle_logged(packet)
            index += 1
            if proto.normal_disconnect:
                raise Close(None, None)
        if self._subacks:
            await self._flush_subacks()
        if self._deferred or self._held:
            await self._flush_state()

    def _log_request(
        self, kind: mq.PacketType, status: str, started: float, topic: str | None, failed: bool = False
    ) -> None:
        self.ctx.request_event(
            op=_OP_NAMES[kind],
            code=int(kind),
            status=status,
            outcome=outcome(status, failed),
            latency_ms=round((time.perf_counter() - started) * 1000, 3),
            client_id=self.client_id or None,
            topic=topic,
        )

    async def _handle_logged(self, packet: mq.Packet) -> None:
        started = time.perf_counter()
        status = "SUCCESS"
        failed = False
        topic: str | None = None
        try:
            status, topic = await self._handle(packet)
        except Close as close:
            status = close.status
            failed = True
            raise
        finally:
            kind = mq.PACKET_TYPES[type(packet)]
            if kind is not mq.PacketType.PINGREQ:
                self._log_request(kind, status, started, topic, failed)

    async def _on_pubacks(self, packets: list[mq.PubAck]) -> None:
        """Handle a run of PUBACKs of one read in order, each as :meth:`_handle_logged` does; their request
        events are reported as one run (:meth:`.ConnectionContext.request_run`), sharing its latency."""
        started = time.perf_counter()
        statuses: list[str] = []
        outcomes: list[str] = []
        try:
            for packet in packets:
                status, failed = "SUCCESS", False
                try:
                    status, _ = await self._handle(packet)
                except Close as close:
                    status = close.status
                    failed = True
                    raise
                finally:
                    statuses.append(status)
                    outcomes.append(outcome(status, failed))
        finally:
            fields = {
                "op": "PUBACK",
                "code": _PUBACK_CODE,
                "latency_ms": round((time.perf_counter() - started) * 1000, 3),
                "client_id": self.client_id or None,
            }
            self.ctx.request_run(fields, statuses, outcomes, [None] * len(statuses))

    async def _handle(self, packet: mq.Packet) -> tuple[str, str | None]:
        """Handle one packet; returns (status for the request event, topic)."""
        if isinstance(packet, mq.Connect):
            return await self._on_connect(packet), None
        session = self.session
        assert session is not None  # the decoder refuses anything before CONNECT
        if isinstance(packet, mq.PubAck | mq.PubComp):
            entry = session.finish(packet.packet_id)
            if entry is None:
                return "PACKET_IDENTIFIER_NOT_FOUND", None
            self.gateway.tracer.acked(session.client_id, packet.packet_id)
            if entry.cursor is not None:
                await entry.cursor.commit(self.gateway.backend)
            return "SUCCESS", None
        if isinstance(packet, mq.PubRec | mq.PubRel):
            status, answer, deferred = (
                self.proto.on_pubrec(session, packet)
                if isinstance(packet, mq.PubRec)
                else self.proto.on_pubrel(session, packet)
            )
            if answer is not None and deferred:
                self._deferred.append(answer)
            elif answer is not None:
                await self.send(answer)
            return status, None
        if isinstance(packet, mq.Subscribe):
            return await self._on_subscribe(packet)
        if isinstance(packet, mq.Unsubscribe):
            return await self._on_unsubscribe(packet)
        if isinstance(packet, mq.PingReq):
            await self.send(mq.PingResp())
            return "SUCCESS", None
        if isinstance(packet, mq.Disconnect):
            if self._deferred:
                await self._flush_state()
            return self.proto.on_disconnect(session, packet), None
        raise Close(
            mq.ReasonCode.PROTOCOL_ERROR, "protocol_error", f"unexpected {type(packet).__name__} from client"
        )
