"""
mqproxy.mqtt.delivery
~~~~~~~~~~~~~~~~~~~~~

The outbound half of the trio adapter of one MQTT connection (:class:`Deliveries`, a base of
:class:`~mqproxy.mqtt.connection.MqttConnection`): one reader task per subscription pulls its LMQ at the
session cursor (a shared subscription claims from its group), long-polls through the push hubs when caught
up, and pushes PUBLISHes inside the session's in-flight window. What each subscriber gets is decided by the
sans-IO core (:class:`~mqproxy.mqtt.protocol.MqttProtocol`); offsets of QoS 1/2 deliveries advance on
PUBACK / PUBCOMP, of QoS 0 on write.

A durable QoS 2 delivery (persistent session) is sent only once the session snapshot that records it is
written (:meth:`Deliveries._flush_state`, which also sends the QoS 2 acks that wait for it).
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog
import trio

from mqproxy.codecs.mqtt import Packet, Publish, QoS, ReasonCode, topic_matches
from mqproxy.model.errors import BackendError
from mqproxy.model.types import PullStatus, StoredMessage
from mqproxy.mqtt.cursor import Cursor
from mqproxy.mqtt.gateway import Gateway, now_ms, reader_filter
from mqproxy.mqtt.mapping import MqttAttributes, decode_properties, lmq_name
from mqproxy.mqtt.protocol import MqttProtocol
from mqproxy.mqtt.push_hub import Parking
from mqproxy.mqtt.read_cache import Delivery
from mqproxy.mqtt.session import InFlight, Session
from mqproxy.mqtt.session_record import InboundQos2, SubscriptionSpec
from mqproxy.mqtt.store import queue_ids
from mqproxy.runtime.context import ConnectionContext
from mqproxy.runtime.tasks import TaskHost

__all__ = ["Deliveries", "ReaderHandle"]

_log = structlog.get_logger("mqproxy.mqtt")
#: A subscription reader that keeps finding its long-poll ready yields at least every this many rounds.
_YIELD_EVERY = 8


class ReaderHandle(Protocol):
    """What ends a subscription's reader: its task's cancel scope, or the hub entry of a reader parked
    without a task (:class:`~mqproxy.mqtt.push_hub.Parking`)."""

    def cancel(self) -> None: ...


class Deliveries:
    """Subscription readers and the in-flight window of one connection (see the module docstring).

    The connection provides the attributes declared here (its ``__slots__``) and the write primitives."""

    if not TYPE_CHECKING:  # no slots of its own: the connection declares them (unseen by mypy, which would
        __slots__ = ()  # check this mixin's assignments against an empty list)

    proto: MqttProtocol
    gateway: Gateway
    ctx: ConnectionContext
    session: Session | None
    _readers: dict[str, ReaderHandle]
    _nursery: TaskHost | None
    #: QoS 2 acks (PUBREL, PUBCOMP) that wait until the session's QoS 2 state is durable.
    _deferred: list[Packet]
    #: Durable QoS 2 deliveries whose PUBLISH waits until their record is durable.
    _held: list[InFlight]

    async def send(self, packet: Packet) -> None:
        raise NotImplementedError

    async def _send_bytes(self, data: bytes) -> None:
        raise NotImplementedError

    def _write_nowait(self, data: bytes) -> bool:
        raise NotImplementedError

    def _can_write_now(self) -> bool:
        raise NotImplementedError

    def kick(self, reason_code: ReasonCode | None, error: str | None, detail: str | None = None) -> None:
        raise NotImplementedError

    # --- readers ------------------------------------------------------------------------------
    def _start_reader(self, topic_filter: str, at_end: bool = False) -> None:
        """Start the reader of a subscription (cancelled through ``_readers``). ``at_end``: a new
        subscription whose cursors were just placed at their queue's end (the first pull is skipped: the
        reader parks at once, and a message stored meanwhile ends that wait at once). Such a reader of
        one queue parks in its hub without a task (:meth:`.PushHubs.park_idle`) until the hub wakes it;
        its task then starts, in the connection's logging context, and pulls from the cursor."""
        assert self._nursery is not None
        session = self.session
        assert session is not None
        if topic_filter in session.shared:
            self._readers[topic_filter] = self._nursery.start_soon(self._shared_reader, topic_filter)
            return
        if at_end:
            lanes = session.lanes_of(topic_filter)
            if len(lanes) == 1 and lanes[0].positioned:
                parking = self.gateway.push_hubs.park_idle(
                    topic_filter, lanes[0], self._deliver_now, self._waker(topic_filter)
                )
                if parking is not None:
                    self._readers[topic_filter] = parking
                    return
        self._readers[topic_filter] = self._nursery.start_soon(self._reader, topic_filter, at_end)

    def _waker(self, topic_filter: str) -> Callable[[], None]:
        """The wake-up of a reader parked without a task: start its task, in this connection's logging
        context (the hub's task calls it). A cancelled :class:`Parking` never calls it."""
        context = contextvars.copy_context()

        def wake() -> None:
            nursery = self._nursery
            if nursery is not None and isinstance(self._readers.get(topic_filter), Parking):
                self._readers[topic_filter] = context.run(
                    nursery.start_soon, self._reader, topic_filter, False
                )

        return wake

    async def _shared_reader(self, topic_filter: str) -> None:
        session = self.session
        assert session is not None
        backend = self.gateway.backend
        group = session.shared[topic_filter]
        inner = group.topic_filter
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
                message, cursor, offset = await group.claim(backend, self.gateway.config.poll_interval_s)
                handed = False
                try:
                    await self._deliver(spec, inner, cursor, message, offset, (group, message))
                    handed = True
                finally:
                    if not handed and not any(
                        e.shared is not None and e.shared[1] is message for e in session.inflight.values()
                    ):
                        group.give_back(message, cursor, offset)
                if self._held:
                    await self._flush_state()  # a QoS 2 delivery goes out once its record is durable
                await group.commit(backend)
                await trio.lowlevel.checkpoint()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        except BackendError as exc:
            self.kick(ReasonCode.UNSPECIFIED_ERROR, "store_failed", str(exc))

    async def _reader(self, topic_filter: str, at_end: bool) -> None:
        """Read every queue of the subscription's LMQ (one, embedded; one per broker on a cluster)."""
        session = self.session
        assert session is not None
        lanes = session.lanes_of(topic_filter)
        if len(lanes) == 1:
            await self._lane(topic_filter, lanes[0], at_end)
            return
        async with trio.open_nursery() as nursery:
            for cursor in lanes:
                nursery.start_soon(self._lane, topic_filter, cursor, at_end)

    async def _lane(self, topic_filter: str, cursor: Cursor, at_end: bool = False) -> None:
        """Deliver from one queue of the subscription's LMQ. With several queues (a cluster's brokers),
        a queue whose broker fails is retried every poll interval instead of ending the connection."""
        session = self.session
        assert session is not None
        config = self.gateway.config
        several = len(session.lanes_of(topic_filter)) > 1
        while True:
            try:
                await self._read_lane(topic_filter, cursor, at_end)
                return
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            except BackendError as exc:
                if not several:
                    self.kick(ReasonCode.UNSPECIFIED_ERROR, "store_failed", str(exc))
                    return
                _log.warning("mqtt.lane_failed", topic=cursor.lmq, queue_id=cursor.queue_id, detail=str(exc))
                await trio.sleep(config.poll_interval_s)

    async def _read_lane(self, topic_filter: str, cursor: Cursor, at_end: bool = False) -> None:
        session = self.session
        assert session is not None
        backend = self.gateway.backend
        config = self.gateway.config
        inner = reader_filter(topic_filter)
        hubs = self.gateway.push_hubs
        rounds = 0
        while True:
            spec = session.subscriptions.get(topic_filter)
            if spec is None or cursor not in session.lanes_of(topic_filter) or session.connection is not self:
                return
            if at_end:  # placed at the queue's end just now: nothing to pull yet
                at_end = False
                if cursor.positioned:
                    await hubs.park(topic_filter, cursor, self._deliver_now, config.poll_interval_s)
                    continue
            if not cursor.positioned:
                await self.gateway.position(cursor)
            start = cursor.next_offset
            result = await self.gateway.read_cache.pull(cursor.lmq, cursor.queue_id, start, config.pull_batch)
            if not result.messages:
                if result.status is PullStatus.OFFSET_ILLEGAL and result.next_offset != start:
                    cursor.next_offset = result.next_offset
                    if result.next_offset > start:
                        cursor.complete(result.next_offset - 1)  # the gap is gone from the store
                    continue
                await hubs.park(topic_filter, cursor, self._deliver_now, config.poll_interval_s)
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
            caught_up = len(result.messages) < config.pull_batch
            if not caught_up or rounds % _YIELD_EVERY == 0:
                await trio.lowlevel.checkpoint()  # the store may answer without yielding
            if caught_up:
                # Probably caught up: long-poll before pulling again (returns at once if not; a
                # wait that blocks is the yield, so rounds that end in one skip the checkpoint).
                await hubs.park(topic_filter, cursor, self._deliver_now, config.poll_interval_s)

    # --- one message to one subscriber ----------------------------------------------------------
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
        publish = self._publish_of(attrs, message, attrs.retain and spec.retain_as_published, spec)
        if publish is None:
            cursor.complete(offset)
            return
        await self._push(publish, cursor, offset, shared, traced=message)

    def _shared_qos0(
        self, spec: SubscriptionSpec, inner: str, session: Session, delivery: Delivery
    ) -> bytes | None:
        """How ``delivery`` reaches this subscriber if no per-subscriber state is involved: ``b""`` if not
        at all (another topic, no-local, too big for the client), the QoS 0 PUBLISH bytes every such
        subscriber shares (encoded once per message), or None when it needs its own PUBLISH."""
        attrs = delivery.attributes
        if (
            attrs is None
            or not topic_matches(inner, attrs.topic)
            or (spec.no_local and attrs.client_id == session.client_id)
        ):
            return b""
        proto = self.proto
        if proto.shares_qos0(spec, attrs.qos, attrs.properties):
            data = delivery.qos0_publish(proto.level, attrs.retain and spec.retain_as_published)
            return data if proto.fits(data) else b""
        return None

    def _deliver_now(
        self, topic_filter: str, cursor: Cursor, messages: Sequence[StoredMessage], offset: int
    ) -> int:
        """The push hub's callback (see :mod:`.push_hub`): handle the leading ``messages`` (the first at
        ``offset``) that need no waiting, with one write; how many, the cursor moved past them.

        QoS 0 deliveries, skipped messages and QoS 1 deliveries that fit the in-flight window are
        handled (a QoS 1 one is put in flight, its offset completed on PUBACK, as :meth:`_push` does);
        the first one that needs more (QoS 2, topic aliases, a full window, QoS 2 records waiting to be
        made durable) stops the batch and is left to the reader. Nothing is handled when the write could
        not go out at once."""
        session = self.session
        if session is None or session.connection is not self or cursor not in session.lanes_of(topic_filter):
            return 0
        spec = session.subscriptions.get(topic_filter)
        if spec is None or cursor.restored or not self._can_write_now():
            return 0
        inner = reader_filter(topic_filter)
        delivery = self.gateway.read_cache.delivery
        proto = self.proto
        tracer = self.gateway.tracer
        parts: list[bytes] = []
        sent: list[StoredMessage] = []
        done: list[int] = []  # offsets completed by the write (not those put in flight)
        handled = 0
        for message in messages:
            entry = delivery(message)
            data = self._shared_qos0(spec, inner, session, entry)
            if data is None:
                attrs = entry.attributes
                assert attrs is not None  # _shared_qos0 answered b"" otherwise
                if self._held or proto.alias_maximum or len(session.inflight) >= session.send_quota:
                    break
                publish = self._publish_of(attrs, message, attrs.retain and spec.retain_as_published, spec)
                if publish is not None:
                    if publish.qos != QoS.AT_LEAST_ONCE:
                        break  # QoS 2, or QoS 0 with its own properties: the reader's
                    encoded = proto.encode(publish)
                    if proto.fits(encoded):
                        data = self._in_flight(session, publish, cursor, offset + handled, message)
                    else:
                        data = b""  # [MQTT-3.1.2-25]: discard what the client cannot take
                if not data:
                    done.append(offset + handled)
            else:
                if data:
                    sent.append(message)
                done.append(offset + handled)
            if data:
                parts.append(data)
            handled += 1
        if parts and not self._write_nowait(parts[0] if len(parts) == 1 else b"".join(parts)):
            return 0  # not reached: _can_write_now said the write goes out
        if tracer.sink.enabled and sent:
            with self._bound_context():
                for message in sent:
                    tracer.delivered(session.client_id, message, None)
        cursor.complete_all(done)
        cursor.next_offset = offset + handled
        return handled

    def _in_flight(
        self, session: Session, publish: Publish, cursor: Cursor, offset: int, message: StoredMessage
    ) -> bytes:
        """Put a QoS 1 ``publish`` of the hub in flight (the window has room) and return its bytes."""

        def factory(packet_id: int) -> Publish:
            return dataclasses.replace(publish, packet_id=packet_id)

        entry = session.add_inflight(factory, cursor, offset)
        tracer = self.gateway.tracer
        if tracer.sink.enabled:  # told before the write, so an ack that overtakes it finds it in flight
            with self._bound_context():
                tracer.delivered(session.client_id, message, entry.packet_id)
        return self.proto.encode(entry.publish)

    def _bound_context(self) -> Any:
        """The hub's task is not this connection's: bind its id for the trace.record events."""
        ctx = self.ctx
        return structlog.contextvars.bound_contextvars(conn_id=ctx.conn_id, protocol=ctx.protocol)

    async def _push(
        self,
        publish: Publish,
        cursor: Cursor | None,
        offset: int,
        shared: Any = None,
        retained_for: str | None = None,
        traced: StoredMessage | None = None,
    ) -> None:
        """Write (QoS 0) or put in flight ``publish``; ``traced``: the stored message it delivers, for the
        message trace (told before the write, so an ack that overtakes it finds it in flight)."""
        session = self.session
        assert session is not None
        proto = self.proto
        data = proto.encode(publish)
        if not proto.fits(data):
            if cursor is not None:
                cursor.complete(offset)  # [MQTT-3.1.2-25]: discard what the client cannot take
            return
        if publish.qos == QoS.AT_MOST_ONCE:
            if traced is not None:
                self.gateway.tracer.delivered(session.client_id, traced, None)
            await self._send_bytes(proto.outbound(publish) if proto.alias_maximum else data)
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
        if traced is not None:
            self.gateway.tracer.delivered(session.client_id, traced, entry.packet_id)
        if entry.durable:
            self._held.append(entry)  # sent by _flush_state once its record is durable
            return
        # The session keeps the full PUBLISH: aliases belong to this connection only.
        await self._send_bytes(proto.outbound(entry.publish))

    # --- QoS 2 durability ---------------------------------------------------------------------
    async def _expect_pubrel(self, session: Session, accepted: list[tuple[int, str]]) -> None:
        """Add the ids of QoS 2 PUBLISHes about to be stored to ``awaiting_rel``; for a persistent session
        make them durable first, each with the sizes of its topic's LMQ's queues, so that after a crash a
        re-sent PUBLISH can be told apart: stored already, or never (``Session.confirm_stored``). On a
        cluster that is every queue whose broker answers (the message goes to one of them); a broker that
        is down is left out (sends do not go there), and if none answers the id is recorded unmarked (a
        re-sent PUBLISH counts as stored)."""
        session.expect_rel([packet_id for packet_id, _ in accepted])
        if not session.persistent:
            return
        sizes: dict[str, list[tuple[int, int]]] = {}
        for packet_id, topic in accepted:
            lmq = lmq_name(topic)
            if lmq not in sizes:
                sizes[lmq] = await self._queue_sizes(lmq)
            if sizes[lmq]:
                session.rel_marks[packet_id] = InboundQos2.mark(packet_id, lmq, sizes[lmq])
        await self._flush_state()

    async def _queue_sizes(self, lmq: str) -> list[tuple[int, int]]:
        """``(queue id, max offset)`` of each queue of ``lmq`` that answers (all of them, or a failure,
        outside cluster mode)."""
        backend = self.gateway.backend
        found: list[tuple[int, int]] = []
        try:
            queues = await queue_ids(backend, lmq)
        except BackendError:
            if self.gateway.cluster is None:
                raise
            return found
        for queue_id in queues:
            try:
                found.append((queue_id, await backend.max_offset(lmq, queue_id)))
            except BackendError:
                if self.gateway.cluster is None:
                    raise
        return found

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
                    await self._send_bytes(self.proto.outbound(entry.publish))
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
        return self._publish_of(attrs, message, attrs.retain and (retained or spec.retain_as_published), spec)

    def _publish_of(
        self, attrs: MqttAttributes, message: StoredMessage, retain: bool, spec: SubscriptionSpec
    ) -> Publish | None:
        """The PUBLISH of stored ``message`` (MQTT view ``attrs``) for ``spec`` now; None if expired."""
        return self.proto.make_publish(
            attrs.topic,
            message.body,
            attrs.qos,
            retain,
            attrs.properties,
            message.store_timestamp_ms,
            spec,
            now_ms(),
        )
