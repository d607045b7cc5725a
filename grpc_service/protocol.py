"""
mqproxy.grpc_service.protocol
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

:class:`GrpcService`: RocketMQ 5 gRPC as a :class:`~mqproxy.runtime.handlers.ProtocolService`. It is built
once per server with the broker facade and :class:`GrpcSettings`; every connection the sniffer attributes
to gRPC is served by a :class:`~mqproxy.grpc_service.connection.GrpcConnectionDriver` over the one shared
:class:`~mqproxy.grpc_service.service.MessagingService` (so the registry of live clients spans connections).

``run`` registers the gRPC transaction check-back with the facade: half messages sent over gRPC
(``PGROUP`` = ``%GRPC%<topic>``) are checked through a live producer's Telemetry stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from mqproxy.facade.api import BrokerFacade
from mqproxy.grpc_service.connection import ConnectionLimits, GrpcConnectionDriver
from mqproxy.grpc_service.service import MessagingService
from mqproxy.grpc_service.telemetry import ServerSettings
from mqproxy.negotiation import Detected
from mqproxy.runtime.context import ConnectionContext

__all__ = ["GrpcService", "GrpcSettings"]

#: Room a request needs beyond its message body (properties and envelope).
REQUEST_ENVELOPE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class GrpcSettings:
    """What the gRPC protocol needs from the server's configuration. ``advertised`` is the address routes
    name; ``server`` the values merged into client settings; ``limits`` the per-connection limits."""

    advertised: tuple[str, int]
    auto_create_topics: bool = True
    server: ServerSettings = field(default_factory=ServerSettings)
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    settings_timeout_s: float = 30.0

    @classmethod
    def from_config(cls, config: Any, advertised: tuple[str, int]) -> GrpcSettings:
        """From the server's ``Settings`` (its ``store``, ``broker``, ``remoting`` and ``server``
        sections)."""
        max_body = config.store.max_message_bytes
        return cls(
            advertised=advertised,
            auto_create_topics=config.store.auto_create_topics,
            server=ServerSettings(
                max_body_bytes=max_body,
                consumer_max_attempts=config.broker.max_reconsume_times + 1,
                long_polling_timeout_s=min(20.0, config.remoting.long_poll_max_s) or 20.0,
            ),
            limits=ConnectionLimits(
                max_message_bytes=max_body + REQUEST_ENVELOPE_BYTES,
                idle_timeout_s=config.server.idle_timeout_s,
            ),
        )


class GrpcService:
    """The gRPC protocol of one server (see the module docstring)."""

    def __init__(self, broker: BrokerFacade, settings: GrpcSettings) -> None:
        self.broker = broker
        self.settings = settings
        self.messaging = MessagingService(
            broker,
            advertised=settings.advertised,
            auto_create_topics=settings.auto_create_topics,
            server_settings=settings.server,
            settings_timeout_s=settings.settings_timeout_s,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register the transaction check-back with the facade; no other background work."""
        self.broker.add_check_back(self.messaging.check_back)
        task_status.started()

    async def serve(self, stream: trio.abc.Stream, ctx: ConnectionContext, detected: Detected) -> None:
        """Serve gRPC on ``stream`` until the connection ends."""
        await GrpcConnectionDriver(stream, ctx, self.messaging, self.settings.limits).run()
