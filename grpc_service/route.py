"""
mqproxy.grpc_service.route
~~~~~~~~~~~~~~~~~~~~~~~~~~

``QueryRoute`` and ``QueryAssignment``.

Routes name one broker (``broker-a``, id 0) at the proxy's advertised address, queue ids from 0, and the
topic's permission. ``accept_message_types`` is the topic's administrator-set message type
(:meth:`~mqproxy.facade.api.Admin.topic_type`); an untyped (auto-created) or MIXED topic lists NORMAL,
FIFO, DELAY and TRANSACTION (clients validate the type they send against it). QueryAssignment gives a FIFO
group (one whose config says ``consumeMessageOrderly``) every queue, any other group one broker-wide queue
(id -1): a receive pops every queue anyway, as with the Apache proxy.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.facade.types import TopicMessageType
from mqproxy.grpc_service.call import Call, ok
from mqproxy.grpc_service.resources import Resources
from mqproxy.model.properties import PROXY_BROKER_NAME
from mqproxy.model.types import PERM_READ, PERM_WRITE, TopicConfig

__all__ = ["RouteRpcs"]

_ALL_TYPES = (pb.MessageType.NORMAL, pb.MessageType.FIFO, pb.MessageType.DELAY, pb.MessageType.TRANSACTION)


def _scheme(host: str) -> pb.AddressScheme:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return pb.AddressScheme.DOMAIN_NAME
    return pb.AddressScheme.IPv4 if ip.version == 4 else pb.AddressScheme.IPv6


def _permission(perm: int) -> pb.Permission:
    if perm & PERM_READ and perm & PERM_WRITE:
        return pb.Permission.READ_WRITE
    if perm & PERM_READ:
        return pb.Permission.READ
    if perm & PERM_WRITE:
        return pb.Permission.WRITE
    return pb.Permission.NONE


class RouteRpcs:
    """Routes and assignments of topics served at ``advertised`` (host, port)."""

    def __init__(self, resources: Resources, advertised: tuple[str, int]) -> None:
        self._resources = resources
        host, port = advertised
        self._endpoints = pb.Endpoints(scheme=_scheme(host), addresses=[pb.Address(host=host, port=port)])

    def _accept_types(self, topic: str) -> list[pb.MessageType]:
        typed = self._resources.broker.topic_type(topic)
        if typed is not None and typed is not TopicMessageType.MIXED:
            return [pb.MessageType[typed.value]]
        return list(_ALL_TYPES)

    def _queues(self, config: TopicConfig) -> list[Any]:
        broker = pb.Broker(name=PROXY_BROKER_NAME, id=0, endpoints=self._endpoints)
        perm = _permission(config.perm)
        accept = self._accept_types(config.name)
        count = max(config.read_queues, config.write_queues)
        return [
            pb.MessageQueue(
                topic=pb.Resource(name=config.name),
                id=i,
                permission=perm,
                broker=broker,
                accept_message_types=accept,
            )
            for i in range(count)
        ]

    async def query_route(self, call: Call, request: Any) -> Any:
        topic = self._resources.topic_name(call, request.topic)
        config = await self._resources.topic(topic, create=True)
        return pb.QueryRouteResponse(status=ok(), message_queues=self._queues(config))

    async def query_assignment(self, call: Call, request: Any) -> Any:
        topic = self._resources.topic_name(call, request.topic)
        group = self._resources.group_name(call, request.group)
        config = await self._resources.topic(topic, create=True)
        queues = self._queues(config)
        if not self._resources.is_fifo_group(group):
            whole = queues[0]
            whole.id = -1
            del whole.accept_message_types[:]
            queues = [whole]
        assignments = [pb.Assignment(message_queue=q) for q in queues]
        return pb.QueryAssignmentResponse(status=ok(), assignments=assignments)
