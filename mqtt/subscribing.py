"""
mqproxy.mqtt.subscribing
~~~~~~~~~~~~~~~~~~~~~~~~

SUBSCRIBE and UNSUBSCRIBE of one MQTT connection (:class:`Subscribing`, a base of
:class:`~mqproxy.mqtt.connection.MqttConnection`): what is granted is decided by the sans-IO core; a new
subscription starts its reader (:class:`~mqproxy.mqtt.delivery.Deliveries`) and retained messages that
match are pushed after the SUBACK, as Retain Handling asks; UNSUBSCRIBE cancels the readers first. The
SUBACKs of one read's SUBSCRIBEs are written together, once the read's last SUBSCRIBE is handled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqproxy.codecs import mqtt as mq
from mqproxy.mqtt.delivery import Deliveries
from mqproxy.mqtt.gateway import now_ms
from mqproxy.mqtt.outcomes import Permission

__all__ = ["Subscribing"]


class Subscribing(Deliveries):
    """The SUBSCRIBE / UNSUBSCRIBE handlers (the connection provides ``_can_subscribe`` and the slots)."""

    if not TYPE_CHECKING:  # no slots of its own: the connection declares them (unseen by mypy, which would
        __slots__ = ()  # check this mixin's assignments against an empty list)
    _can_subscribe: Permission
    #: SUBACKs not written yet: those of one read's SUBSCRIBEs leave together (one write), before any
    #: other answer of the connection's (the read loop flushes them), after the PUBLISHes of the new
    #: subscriptions the hubs may have sent meanwhile (which MQTT allows). Made by the first SUBSCRIBE
    #: (None until then; the connection sets it).
    _subacks: list[bytes] | None

    async def _on_subscribe(self, packet: mq.Subscribe) -> tuple[str, str | None]:
        session = self.session
        assert session is not None
        gateway = self.gateway
        granted = self.proto.subscriptions(packet, self._can_subscribe)
        retained = []
        for item in granted:
            if item.spec is None:
                continue
            new = await gateway.subscribe(session, item.spec)
            if new:
                self._start_reader(item.spec.topic_filter, at_end=True)
            if item.wants_retained(new):
                retained.append(item)
        suback, status, first = self.proto.suback(packet, granted)
        data = self.proto.encode(suback)
        if not retained:  # written with the other SUBACKs of its read (see _flush_subacks)
            if self._subacks is None:
                self._subacks = []
            self._subacks.append(data)
            return status, first
        await self._flush_subacks(data)
        for item in retained:
            spec = item.spec
            assert spec is not None
            for message in gateway.retained.matching(item.inner):
                publish = self.proto.make_publish(
                    message.topic,
                    message.payload,
                    message.qos,
                    True,
                    message.properties,
                    message.store_timestamp_ms,
                    spec,
                    now_ms(),
                )
                if publish is not None:
                    await self._push(publish, None, message.commitlog_offset, retained_for=spec.topic_filter)
        if self._held:
            await self._flush_state()
        return status, first

    async def _flush_subacks(self, data: bytes = b"") -> None:
        """Write the waiting SUBACKs (and then ``data``) with one write."""
        pending = self._subacks
        if pending:
            self._subacks = None
            data = b"".join([*pending, data])
        if data:
            await self._send_bytes(data)

    def _flush_subacks_nowait(self) -> None:
        """Write the waiting SUBACKs without waiting (the connection ends: best effort)."""
        pending = self._subacks
        if pending:
            self._subacks = None
            self._write_nowait(b"".join(pending))

    async def _on_unsubscribe(self, packet: mq.Unsubscribe) -> tuple[str, str | None]:
        session = self.session
        assert session is not None
        existed: list[bool] = []
        for topic_filter in packet.topic_filters:
            scope = self._readers.pop(topic_filter, None)
            if scope is not None:
                scope.cancel()
            existed.append(await self.gateway.unsubscribe(session, topic_filter))
        await self.send(self.proto.unsuback(packet.packet_id, existed))
        return "SUCCESS", packet.topic_filters[0] if packet.topic_filters else None
