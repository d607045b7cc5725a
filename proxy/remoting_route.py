"""Route entry for RocketMQ remoting connections: hands the stream to the remoting session driver.

One :class:`~mqproxy.remoting.context.ServerContext` (with the process-wide consumer-group registry)
is shared by every remoting connection of a server; it is built on first use from the settings.
"""

from __future__ import annotations

import dataclasses
import functools

import trio

from mqproxy.context import ServerState
from mqproxy.mqtt.gateway import rocketmq_dispatch
from mqproxy.negotiation import Detected
from mqproxy.remoting.connection import ConnectionLimits, ConnectionRegistry, ConnectionStats, serve_remoting
from mqproxy.remoting.context import RequestEvent, ServerContext
from mqproxy.runtime.context import ConnectionContext

_KEY = "remoting"
#: Registry keys shared with :mod:`mqproxy.server`.
SERVICES_KEY = "services"
REMOTING_CHECK_BACK_KEY = "remoting_check_back"
#: RequestEvent's field names, read once: a shallow copy per request (``asdict`` deep-copies).
_EVENT_FIELDS = tuple(f.name for f in dataclasses.fields(RequestEvent))


def remoting_context(server: ServerState) -> ServerContext:
    """The server's shared remoting context (created once)."""
    existing = server.registries.get(_KEY)
    if existing is None:
        settings = server.settings
        host, port = server.advertised
        registry = ConnectionRegistry()
        existing = ServerContext(
            advertised_host=host,
            advertised_port=port,
            groups=registry,
            services=server.registries.get(SERVICES_KEY),
            mqtt_dispatch=functools.partial(rocketmq_dispatch, server.registries),
            auto_create_topics=settings.store.auto_create_topics,
            default_queue_count=settings.store.default_queue_count,
            max_pull_batch=settings.remoting.max_pull_batch,
            long_poll_max_s=settings.remoting.long_poll_max_s,
        )
        server.registries[_KEY] = existing
        server.registries[REMOTING_CHECK_BACK_KEY] = registry.check_transaction
    return existing


async def serve_remoting_connection(
    stream: trio.abc.Stream, ctx: ConnectionContext, detected: Detected
) -> None:
    settings = ctx.server.settings
    limits = ConnectionLimits(
        max_frame_bytes=settings.remoting.max_frame_bytes,
        idle_timeout_s=settings.server.idle_timeout_s,
    )

    def on_request(event: RequestEvent) -> None:
        ctx.request_event(**{name: getattr(event, name) for name in _EVENT_FIELDS})

    stats = ConnectionStats()
    try:
        await serve_remoting(
            stream,
            ctx.server.backend,
            remoting_context(ctx.server),
            peer=ctx.peer,
            on_request=on_request,
            stats=stats,
            log=ctx.log,
            limits=limits,
            draining=ctx.draining,
        )
    finally:
        ctx.error = ctx.error or stats.error
        ctx.detail = ctx.detail or stats.detail
