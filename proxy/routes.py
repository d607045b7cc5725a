"""The one registry of protocol handlers: sniffed protocol →
:class:`~mqproxy.runtime.handlers.ProtocolService`.

:func:`build_protocols` makes one service per protocol when the server starts; adding a protocol is one
entry here plus one detector in :mod:`mqproxy.negotiation`. A service owns the (prefix-replaying) stream
until ``serve`` returns; the caller closes it and logs ``conn.closed`` from the context's counters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mqproxy.context import ServerState
from mqproxy.grpc_service.protocol import GrpcService, GrpcSettings
from mqproxy.http import HttpService
from mqproxy.mqtt.service import MqttService
from mqproxy.negotiation import Protocol
from mqproxy.remoting.service import RemotingService
from mqproxy.runtime.handlers import ProtocolService

__all__ = ["Protocols", "build_protocols"]


@dataclass(frozen=True, slots=True)
class Protocols:
    """The server's protocol services, one per negotiated protocol."""

    remoting: ProtocolService
    mqtt: MqttService
    grpc: ProtocolService
    http: ProtocolService

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter((self.remoting, self.mqtt, self.grpc, self.http))

    def route(self, protocol: Protocol) -> ProtocolService:
        return _ROUTES[protocol](self)


_ROUTES: dict[Protocol, Callable[[Protocols], ProtocolService]] = {
    Protocol.REMOTING: lambda p: p.remoting,
    Protocol.MQTT: lambda p: p.mqtt,
    Protocol.GRPC: lambda p: p.grpc,
    Protocol.HTTP: lambda p: p.http,
}


def build_protocols(state: ServerState) -> Protocols:
    """One service per protocol for the server ``state`` (its settings, broker facade, drain event)."""
    return Protocols(
        remoting=RemotingService.from_settings(
            state.broker, state.settings, state.advertised, msg_id_host=state.id_host
        ),
        mqtt=MqttService.from_settings(state.broker, state.settings, state.draining),
        grpc=GrpcService(state.broker, GrpcSettings.from_config(state.settings, state.advertised)),
        http=HttpService(state),
    )
