"""
mqproxy.grpc_service.protocol
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

:class:`GrpcService`: RocketMQ 5 gRPC as a :class:`~mqproxy.runtime.handlers.ProtocolService`. It is built
once per server with the broker facade and :class:`~.settings.GrpcSettings`; every connection the sniffer
attributes to gRPC is served by a :class:`~mqproxy.grpc_service.connection.GrpcConnectionDriver` over the
one shared :class:`~mqproxy.grpc_service.service.MessagingService` (so the registry of live clients spans
connections).

``run`` registers the gRPC transaction check-back with the facade: half messages sent over gRPC
(``PGROUP`` = ``%GRPC%<topic>``) are checked through a live producer's Telemetry stream.
"""

from __future__ import annotations

import trio

from mqproxy.facade.api import BrokerFacade
from mqproxy.grpc_service.connection import GrpcConnectionDriver
from mqproxy.grpc_service.service import MessagingService
from mqproxy.grpc_service.settings import GrpcSettings
from mqproxy.negotiation import Detected
from mqproxy.runtime.context import ConnectionContext

__all__ = ["GrpcService", "GrpcSettings"]


class GrpcService:
    """The gRPC protocol of one server (see the module docstring)."""

    def __init__(self, broker: BrokerFacade, settings: GrpcSettings) -> None:
        self.broker = broker
        self.settings = settings
        self.messaging = MessagingService(broker, settings)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register the transaction check-back with the facade; no other background work."""
        self.broker.add_check_back(self.messaging.check_back)
        task_status.started()

    async def serve(self, stream: trio.abc.Stream, ctx: ConnectionContext, detected: Detected) -> None:
        """Serve gRPC on ``stream`` until the connection ends."""
        await GrpcConnectionDriver(stream, ctx, self.messaging, self.settings.limits).run()
