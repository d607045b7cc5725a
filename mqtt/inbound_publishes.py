"""
mqproxy.mqtt.inbound_publishes
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

The client's PUBLISHes of one MQTT connection (:class:`InboundPublishes`, a base of
:class:`~mqproxy.mqtt.connection.MqttConnection`): a run of PUBLISHes read together is checked by the
sans-IO core, stored with one batch write per parent topic, and only then acknowledged, in order, with the
run's PUBACKs / PUBRECs in one write and its request events reported together (one ``request.run`` event).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from mqproxy.codecs import mqtt as mq
from mqproxy.model.errors import BackendError, MessageTooLarge, StoreFull, TopicNotFound
from mqproxy.mqtt.delivery import Deliveries
from mqproxy.mqtt.outcomes import Close, Inbound, Permission, outcome

__all__ = ["InboundPublishes"]

_PUBLISH_CODE = int(mq.PacketType.PUBLISH)


class InboundPublishes(Deliveries):
    """The PUBLISH handler (the connection provides ``_can_publish`` and the slots)."""

    if not TYPE_CHECKING:  # no slots of its own: the connection declares them (unseen by mypy, which would
        __slots__ = ()  # check this mixin's assignments against an empty list)

    _can_publish: Permission

    async def _on_publishes(self, packets: list[mq.Publish]) -> None:
        """Store a run of client PUBLISHes, then acknowledge them in order (their request events reported
        as one run; the acknowledgements are queued for the writer together).

        Packets before one that ends the connection are still stored and acknowledged.
        """
        session = self.session
        assert session is not None
        started = time.perf_counter()
        inbound: list[Inbound] = []
        failure: Close | None = None
        pending_qos2: set[int] = set()
        if session.unconfirmed:  # after a restart: was a re-sent QoS 2 PUBLISH stored before the crash?
            for packet in packets:
                if packet.qos == mq.QoS.EXACTLY_ONCE and packet.packet_id in session.unconfirmed:
                    await session.confirm_stored(
                        self.gateway.backend,
                        packet.packet_id,
                        self.proto.client_id,
                        packet.topic,
                        packet.payload,
                    )
        can_publish = self._can_publish
        for packet in packets:
            try:
                inbound.append(
                    self.proto.check_publish(packet, session.awaiting_rel, pending_qos2, can_publish)
                )
            except Close as close:
                failure = close
                break
        to_store = [item for item in inbound if item.stored]
        accepted_qos2 = [
            (i.packet.packet_id, i.topic)
            for i in to_store
            if i.packet.qos == mq.QoS.EXACTLY_ONCE and i.packet.packet_id is not None
        ]
        if accepted_qos2:
            await self._expect_pubrel(session, accepted_qos2)
        if to_store:
            outcomes = await self.gateway.publisher.publish_many(
                [
                    (i.topic, i.packet.payload, int(i.packet.qos), i.packet.retain, i.properties)
                    for i in to_store
                ],
                self.proto.client_id,
                self.ctx.peer,
            )
            await self.gateway.push_hubs.let_woken_run()  # before this run's acks and request events
            for item, result in zip(to_store, outcomes, strict=True):
                if isinstance(result, BackendError):
                    item.error = str(result)
                    item.reason = (
                        mq.ReasonCode.QUOTA_EXCEEDED
                        if isinstance(result, (MessageTooLarge, StoreFull))
                        # several backends and none for this topic (no routing.default)
                        else mq.ReasonCode.TOPIC_NAME_INVALID
                        if isinstance(result, TopicNotFound)
                        else mq.ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
                    )
        for item in to_store:
            packet_id = item.packet.packet_id
            if item.packet.qos == mq.QoS.EXACTLY_ONCE and packet_id is not None:
                if item.reason.is_error:  # not stored: a re-send is a new attempt
                    session.awaiting_rel.discard(packet_id)
                session.rel_marks.pop(packet_id, None)  # stored (or refused): nothing to look for
        acks: list[bytes] = []  # the run's PUBACKs / PUBRECs, queued for the writer as one write
        events: list[tuple[str, str | None, bool]] = []  # the run's request events: (status, topic, failed)
        try:
            for item in inbound:
                try:
                    ack = self.proto.publish_ack(item)
                except Close:
                    events.append(("CLOSED", item.topic, True))
                    raise
                if ack is not None:
                    acks.append(self.proto.encode(ack))
                events.append(("DUPLICATE" if item.duplicate else item.reason.name, item.topic, False))
            if failure is not None:
                status = failure.status
                events.append((status, None, True))
        finally:
            self._log_publishes(events, started)
            if acks:
                await self._send_bytes(acks[0] if len(acks) == 1 else b"".join(acks))
        if failure is not None:
            raise failure

    def _log_publishes(self, events: list[tuple[str, str | None, bool]], started: float) -> None:
        """The request events of a run of PUBLISHes (the fields :meth:`_log_request` gives one),
        reported together as one run (:meth:`.ConnectionContext.request_run`: one ``request.run`` event,
        or a ``request`` for a run of one); the run's packets share its latency (stored together,
        acknowledged together)."""
        if not events:
            return
        latency_ms = round((time.perf_counter() - started) * 1000, 3)
        statuses = [status for status, _, _ in events]
        self.ctx.request_run(
            {
                "op": "PUBLISH",
                "code": _PUBLISH_CODE,
                "latency_ms": latency_ms,
                "client_id": self.proto.client_id or None,
            },
            statuses,
            [outcome(status, failed) for status, _, failed in events],
            [topic for _, topic, _ in events],
        )
