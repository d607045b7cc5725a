"""
mqproxy.remoting.service
~~~~~~~~~~~~~~~~~~~~~~~~

:class:`RemotingService`: the RocketMQ remoting protocol as a
:class:`~mqproxy.runtime.handlers.ProtocolService`. One instance per server, built with the broker
facade, the server-wide :class:`~mqproxy.remoting.context.ServerContext` (advertised address, pull and
long-poll limits) and the connection limits; it owns the registry of consumer- and producer-group
connections every remoting connection of the server shares.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import trio

from mqproxy.codecs.remoting_codes import RequestCode
from mqproxy.facade.api import BrokerFacade
from mqproxy.negotiation import Detected
from mqproxy.remoting.connection import ConnectionLimits, ConnectionStats, serve_remoting
from mqproxy.remoting.context import RequestEvent, ServerContext
from mqproxy.remoting.registry import ConnectionRegistry
from mqproxy.runtime.context import ConnectionContext

__all__ = ["RemotingService"]

#: Requests the embedded store answers without waiting on anything but its own write: handled inline
#: by the connection's read loop (no task per request; see :mod:`mqproxy.remoting.connection`). Long
#: polls (pulls, pops, notifications), lock and client round trips and transaction ends are not here.
INLINE_ON_EMBEDDED: frozenset[int] = frozenset(
    {
        RequestCode.HEART_BEAT,
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        RequestCode.QUERY_CONSUMER_OFFSET,
        RequestCode.UPDATE_CONSUMER_OFFSET,
        RequestCode.GET_MAX_OFFSET,
        RequestCode.GET_MIN_OFFSET,
        RequestCode.GET_CONSUMER_LIST_BY_GROUP,
    }
)
#: Sends join the inline set when the store acknowledges before fsync (``store.flush = "async"``); with
#: sync flush a send waits for fdatasync, and concurrent tasks let one fsync cover a client's pipeline.
INLINE_SENDS: frozenset[int] = frozenset(
    {RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}
)
#: Served inline in the read loop however many a read brings, answers written together (embedded store):
#: a pull either answers at once or, to be held, goes to a task of its own.
BATCH_ON_EMBEDDED: frozenset[int] = frozenset({RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE})

#: RequestEvent's field names, read once: a shallow copy per request (``asdict`` deep-copies).
_EVENT_FIELDS = tuple(f.name for f in dataclasses.fields(RequestEvent))


class RemotingService:
    """Serves remoting connections over ``broker``.

    ``ctx.groups`` is replaced by this service's :class:`ConnectionRegistry` (the one registry of group
    connections); :meth:`run` registers the registry as the facade's transaction check-back sender for
    remoting producers.
    """

    def __init__(
        self, broker: BrokerFacade, ctx: ServerContext, limits: ConnectionLimits | None = None
    ) -> None:
        self.broker = broker
        self.registry = ConnectionRegistry()
        self.ctx = dataclasses.replace(ctx, groups=self.registry)
        self.limits = ConnectionLimits() if limits is None else limits

    @classmethod
    def from_settings(
        cls, broker: BrokerFacade, settings: Any, advertised: tuple[str, int], *, msg_id_host: str = ""
    ) -> RemotingService:
        """The service for a server's ``settings`` (its ``remoting``, ``store`` and ``server`` sections),
        advertising ``advertised`` in routes and message ids (``msg_id_host``: the IP message ids carry
        when the advertised host is a name; see :class:`~mqproxy.remoting.context.ServerContext`)."""
        ctx = ServerContext(
            advertised_host=advertised[0],
            advertised_port=advertised[1],
            msg_id_host=msg_id_host,
            auto_create_topics=settings.store.auto_create_topics,
            default_queue_count=settings.store.default_queue_count,
            max_pull_batch=settings.remoting.max_pull_batch,
            long_poll_max_s=settings.remoting.long_poll_max_s,
        )
        inline: frozenset[int] = frozenset()
        batch: frozenset[int] = frozenset()
        if not settings.routed and settings.backend.kind == "embedded":
            inline = INLINE_ON_EMBEDDED | (INLINE_SENDS if settings.store.flush == "async" else frozenset())
            batch = BATCH_ON_EMBEDDED
        limits = ConnectionLimits(
            max_frame_bytes=settings.remoting.max_frame_bytes,
            max_in_flight=settings.remoting.max_inflight_requests,
            idle_timeout_s=settings.server.idle_timeout_s,
            frame_timeout_s=settings.server.frame_timeout_s,
            inline_codes=inline,
            batch_codes=batch,
        )
        return cls(broker, ctx, limits)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register the check-back sender; nothing else runs in the background."""
        self.broker.add_check_back(self.registry.check_transaction)
        self.broker.watch_groups(lambda group: self.registry.notify_changed(group, None))
        task_status.started()

    async def serve(self, stream: trio.abc.Stream, ctx: ConnectionContext, detected: Detected) -> None:
        """Serve one remoting connection; the request events and the close reason go to ``ctx``."""

        def on_request(event: RequestEvent) -> None:
            if event.client_id:
                ctx.client_id = event.client_id
            ctx.request_event(**{name: getattr(event, name) for name in _EVENT_FIELDS})

        stats = ConnectionStats()
        try:
            await serve_remoting(
                stream,
                self.broker,
                self.ctx,
                peer=ctx.peer,
                on_request=on_request,
                stats=stats,
                log=ctx.log,
                limits=self.limits,
                draining=ctx.draining,
                acl=ctx.acl,
            )
        finally:
            ctx.error = ctx.error or stats.error
            ctx.detail = ctx.detail or stats.detail
