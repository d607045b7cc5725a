"""The route table: sniffed protocol → connection handler. Adding a protocol is one entry here plus
one detector in :mod:`mqproxy.negotiation`.

A handler owns the (prefix-replaying) stream until it returns; the caller closes it and logs
``conn.closed`` from the context's counters.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import trio

from mqproxy.context import ConnectionContext
from mqproxy.grpc_service.connection import serve_grpc
from mqproxy.http import serve_http
from mqproxy.mqtt.connection import serve_mqtt
from mqproxy.negotiation import Detected, Protocol
from mqproxy.remoting_route import serve_remoting_connection

Handler = Callable[[trio.abc.Stream, ConnectionContext, Detected], Awaitable[None]]

ROUTES: Mapping[Protocol, Handler] = {
    Protocol.REMOTING: serve_remoting_connection,
    Protocol.MQTT: serve_mqtt,
    Protocol.GRPC: serve_grpc,
    Protocol.HTTP: serve_http,
}
