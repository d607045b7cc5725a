"""Builds the server's :class:`~mqproxy.remoting.service.RemotingService` from its settings and facade."""

from __future__ import annotations

from mqproxy.context import ServerState
from mqproxy.remoting.connection import ConnectionLimits
from mqproxy.remoting.context import ServerContext
from mqproxy.remoting.service import RemotingService


def remoting_service(state: ServerState) -> RemotingService:
    """The remoting protocol service of ``state`` (its broker facade must be open)."""
    assert state.broker is not None, "the broker facade opens before the protocols are built"
    settings = state.settings
    host, port = state.advertised
    ctx = ServerContext(
        advertised_host=host,
        advertised_port=port,
        auto_create_topics=settings.store.auto_create_topics,
        default_queue_count=settings.store.default_queue_count,
        max_pull_batch=settings.remoting.max_pull_batch,
        long_poll_max_s=settings.remoting.long_poll_max_s,
    )
    limits = ConnectionLimits(
        max_frame_bytes=settings.remoting.max_frame_bytes, idle_timeout_s=settings.server.idle_timeout_s
    )
    return RemotingService(state.broker, ctx, limits)
