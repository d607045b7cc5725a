"""
mqproxy.mqtt.service
~~~~~~~~~~~~~~~~~~~~

:class:`MqttService`: MQTT behind the one port (a :class:`~mqproxy.runtime.handlers.ProtocolService`).

Built once per server with the broker facade and the ``[mqtt]`` / ``[store]`` settings, it owns the
:class:`~mqproxy.mqtt.gateway.Gateway` (sessions, subscriptions, retained messages, timers) and serves every
MQTT connection, over TCP or WebSocket, with it. Its :meth:`MqttService.run` installs the gateway as the
facade's light-queue dispatch (so a RocketMQ producer that names only ``MQTT_TOPIC`` reaches the matching
subscriptions, whatever protocol it used), runs the gateway's timers and, when ``[store]
lmq_idle_seconds`` > 0, loads the gateway's state and sweeps idle light queues the gateway does not read.

With ``[backend] kind = "rocketmq"`` the gateway runs in cluster mode: it gets a node id (random, per
process), keeps no state of its own beyond caches and follows what the other nodes write
(:mod:`mqproxy.mqtt.cluster_sync`); :meth:`MqttService.run` loads the gateway eagerly, retrying while
the cluster is unreachable (a CONNECT meanwhile gets Server unavailable with the reason).
"""

from __future__ import annotations

import uuid
from collections.abc import Coroutine, Mapping
from typing import Any

import structlog
import trio

from mqproxy.facade.api import BrokerFacade
from mqproxy.mqtt.auth import Authorizer
from mqproxy.mqtt.connection import MqttConnection
from mqproxy.mqtt.gateway import Gateway, config_from_settings
from mqproxy.mqtt.store import FacadeStore
from mqproxy.mqtt.sweeper import run_lmq_sweeper
from mqproxy.negotiation import Detected
from mqproxy.runtime.context import ConnectionContext

__all__ = ["LMQ_SWEEP_LIMIT", "MqttService"]

_log = structlog.get_logger("mqproxy.server")

#: Most idle light queues one sweep deletes (the rest wait for the next sweep).
LMQ_SWEEP_LIMIT = 100_000


class MqttService:
    """The MQTT protocol service. ``gateway`` is the one gateway every connection uses (tests may
    replace it before connecting)."""

    def __init__(
        self,
        broker: BrokerFacade,
        gateway: Gateway,
        *,
        lmq_idle_s: float = 0,
        lmq_sweep_interval_s: float = 60.0,
    ) -> None:
        self.broker = broker
        self.gateway = gateway
        self.lmq_idle_s = lmq_idle_s
        self.lmq_sweep_interval_s = lmq_sweep_interval_s

    @classmethod
    def from_settings(cls, broker: BrokerFacade, settings: Any, draining: trio.Event) -> MqttService:
        """The service for a server's ``settings`` (its ``mqtt``, ``store`` and ``backend`` sections);
        ``draining`` is set when the server stops (connections close, the gateway's timers end)."""
        mqtt = settings.mqtt
        auth = Authorizer.from_settings(mqtt.allow_anonymous, mqtt.users, mqtt.acl)
        default = settings.default_backend
        node = uuid.uuid4().hex[:12] if default is not None and default.cluster else None
        only = getattr(broker, "only", None)
        if only is not None:  # several backends: MQTT lives on the default one (LMQs stay with parents)
            broker = only(settings.routing.default or None)
        store = FacadeStore(broker)
        gateway = Gateway(store, config_from_settings(mqtt), draining, auth, node=node, directory=store)
        return cls(
            broker,
            gateway,
            lmq_idle_s=0 if node is not None else settings.store.lmq_idle_seconds,  # the brokers own LMQs
            lmq_sweep_interval_s=settings.store.lmq_sweep_interval_seconds,
        )

    @property
    def max_packet_size(self) -> int:
        """Largest MQTT packet a client may send (a WebSocket transport bounds its messages by it)."""
        return self.gateway.config.max_packet_size

    def lmq_dispatch(self, properties: Mapping[str, str]) -> tuple[str, ...]:
        """The facade's light-queue dispatch (see :meth:`.Publisher.rocketmq_dispatch`)."""
        return self.gateway.publisher.rocketmq_dispatch(properties)

    def lmqs_in_use(self) -> set[str]:
        """Light queues the idle sweep must keep (see :meth:`Gateway.lmqs_in_use`)."""
        return self.gateway.lmqs_in_use()

    def stats(self) -> dict[str, int]:
        """The gateway's figures for ``/metrics``."""
        return self.gateway.stats()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Install the light-queue dispatch, then run the gateway's timers (session expiry, delayed Wills,
        state-log housekeeping), in cluster mode the gateway's load and follow of the other nodes, and the
        idle-LMQ sweep, until cancelled."""
        self.broker.set_lmq_dispatch(self.lmq_dispatch)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.gateway.run_timers)
            nursery.start_soon(self.gateway.run_drain)
            if self.gateway.cluster is not None:
                nursery.start_soon(self.gateway.cluster.serve)
            task_status.started()
            if self.lmq_idle_s > 0:
                await self._sweep_idle_lmqs()

    async def _sweep_idle_lmqs(self) -> None:
        """Sweep once the gateway has loaded: until then the queues of offline persistent sessions are
        unknown and would look idle."""
        try:
            await self.gateway.ready()
        except Exception:  # the gateway logs and re-raises its load error to every MQTT connection too
            _log.exception("internal.error", detail="MQTT state failed to load; idle LMQs are not swept")
            return
        await run_lmq_sweeper(
            self.broker,
            idle_ms=int(self.lmq_idle_s * 1000),
            interval_s=self.lmq_sweep_interval_s,
            in_use=self.lmqs_in_use,
            limit=LMQ_SWEEP_LIMIT,
        )

    def serve(
        self, stream: trio.abc.Stream, ctx: ConnectionContext, detected: Detected
    ) -> Coroutine[Any, Any, None]:
        """Serve one MQTT connection (TCP, TLS or a WebSocket stream) until it closes: the connection's
        own ``run`` coroutine, awaited by the caller (an idle connection waits in one frame fewer)."""
        return MqttConnection(stream, ctx, self.gateway).run()
