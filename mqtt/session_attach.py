"""
mqproxy.mqtt.session_attach
~~~~~~~~~~~~~~~~~~~~~~~~~~~

CONNECT and the will of one MQTT connection (:class:`SessionAttach`, a base of
:class:`~mqproxy.mqtt.connection.MqttConnection`): a CONNECT is admitted (credentials, ACL), a previous
connection of the same client id is kicked and waited for (at most ``CLEANUP_S``), the session is
opened or resumed and attached, the CONNACK is sent, then what was in flight is re-sent and the
subscriptions' readers start. When the connection ends without a normal DISCONNECT, its will is
published, at once or after its delay while the session lives on.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import trio

from mqproxy.codecs import mqtt as mq
from mqproxy.model.errors import StoreUnavailable
from mqproxy.mqtt.config import NEVER_EXPIRES
from mqproxy.mqtt.delivery import Deliveries
from mqproxy.mqtt.outcomes import Close, Permission
from mqproxy.mqtt.session import Session
from mqproxy.mqtt.session_record import WillRecord

__all__ = ["SessionAttach"]

#: How long a CONNECT waits for the previous connection of its client id to let go, and a closing
#: connection for its clean-up.
CLEANUP_S = 5.0


class SessionAttach(Deliveries):
    """The CONNECT handler and the will (the connection provides the permissions it sets)."""

    if not TYPE_CHECKING:  # no slots of its own: the connection declares them (unseen by mypy, which would
        __slots__ = ()  # check this mixin's assignments against an empty list)

    _can_publish: Permission
    _can_subscribe: Permission

    async def _on_connect(self, packet: mq.Connect) -> str:
        proto = self.proto
        gateway = self.gateway
        terms = proto.accept_connect(packet)
        if self.ctx.draining.is_set():  # the client may try again later, or another node
            raise Close(mq.ReasonCode.SERVER_BUSY, "server_draining", "server shutting down")
        admission = await gateway.access.connect(
            packet.username, packet.password, self.ctx.peer, self.ctx.acl, self.ctx.log
        )
        self._can_publish, self._can_subscribe = admission.can_publish, admission.can_subscribe
        proto.admit(packet, terms, admission.verdict, admission.can_publish)
        client_id = terms.client_id
        self.ctx.client_id = client_id
        try:
            await gateway.ready()
            await gateway.catch_up()
        except StoreUnavailable as exc:  # the client may try again later, or another node
            raise Close(mq.ReasonCode.SERVER_UNAVAILABLE, "mqtt_unavailable", str(exc)) from None
        previous = gateway.sessions.get(client_id)
        if previous is not None and previous.connection is not None:
            old = previous.connection  # an MqttConnection
            old.kick(
                mq.ReasonCode.SESSION_TAKEN_OVER,
                "session_taken_over",
                f"client id reused by {self.ctx.conn_id}",
            )
            with trio.move_on_after(CLEANUP_S):
                await old.wait_detached()
        will = proto.will
        session, present = await gateway.open_session(
            client_id,
            terms.clean_start,
            terms.expiry,
            terms.send_quota,
            WillRecord.of(will, proto.will_delay()) if will is not None and gateway.cluster else None,
        )
        if session.connection is not None:  # the old connection did not let go in time
            raise Close(mq.ReasonCode.SERVER_BUSY, "takeover_timeout", "previous connection still attached")
        session.connection = self
        self.session = session
        await self.send(proto.connack(present, terms))
        if session.restored:  # first attach after a restart: QoS 2 deliveries under their original ids
            await session.restore_inflight(gateway.backend, self._restored_publish)
        for entry in list(session.inflight.values()):
            if entry.released:
                await self.send(mq.PubRel(entry.packet_id))
            else:
                await self.send(dataclasses.replace(entry.publish, dup=True))
        for topic_filter in session.subscriptions:
            self._start_reader(topic_filter)
        return "SUCCESS"

    async def _publish_will(self, session: Session) -> None:
        will = self.proto.will
        assert will is not None
        delay = self.proto.will_delay()
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

    async def _store_will(self, will: mq.Will) -> None:
        await self.gateway.publisher.publish(
            will.topic,
            will.payload,
            int(will.qos),
            will.retain,
            will.properties,
            self.proto.client_id,
            self.ctx.peer,
        )
