"""
mqproxy.grpc_service.sessions
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Client sessions: ``Heartbeat``, ``NotifyClientTermination`` and the bidi ``Telemetry`` stream, over the
:class:`~mqproxy.grpc_service.telemetry.ClientRegistry`.

Telemetry answers every ``settings`` command with the merged settings
(:func:`~mqproxy.grpc_service.telemetry.settings_reply`) and remembers the stream as the client's channel
for server-initiated commands (transaction check-back); it completes (grpc-status 0) when the client
half-closes or the server drains. Settings without pub/sub, an undecodable command or no settings within
``settings_timeout_s`` end it with INVALID_ARGUMENT. A producer's stream announces the transaction producer
group of each topic it publishes (:func:`~.transactions.transaction_group`) to the facade
(:meth:`~mqproxy.facade.api.Producing.announce_producer`), so a cluster's brokers may send this node the
check-backs of those topics; when this node's last producer stream of a topic ends, the group is withdrawn.
gRPC clients are not registered as remoting consumer-group members: they consume with receipt handles,
never by rebalanced queue ownership.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import trio
from google.protobuf.message import DecodeError

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.codecs.grpc_framing import GrpcStatus
from mqproxy.facade.types import GroupConfig
from mqproxy.grpc_service.call import Call, Send, ok
from mqproxy.grpc_service.errors import ApiError, RpcError
from mqproxy.grpc_service.resources import Resources
from mqproxy.grpc_service.telemetry import SettingsError, settings_reply
from mqproxy.grpc_service.transactions import transaction_group

__all__ = ["SessionRpcs"]


class SessionRpcs:
    def __init__(self, resources: Resources, settings_timeout_s: float = 30.0) -> None:
        self._resources = resources
        self.settings_timeout_s = settings_timeout_s

    async def heartbeat(self, call: Call, request: Any) -> Any:
        if not call.client_id:
            raise ApiError(pb.Code.CLIENT_ID_REQUIRED, "x-mq-client-id is required")
        clients = self._resources.clients
        record = clients.get(call.client_id)
        if request.HasField("group") and request.group.name:
            self._resources.group_name(call, request.group)
        client_type = request.client_type or (record.client_type if record else 0)
        if not client_type:
            raise ApiError(pb.Code.UNRECOGNIZED_CLIENT_TYPE, "unrecognized client type")
        record = clients.touch(call.client_id)
        record.client_type = int(client_type)
        if call.group:
            record.group = call.group
        return pb.HeartbeatResponse(status=ok())

    async def notify_client_termination(self, call: Call, request: Any) -> Any:
        if request.HasField("group") and request.group.name:
            call.group = request.group.name
        if call.client_id:
            self._resources.clients.remove(call.client_id)
        return pb.NotifyClientTerminationResponse(status=ok())

    async def telemetry(
        self,
        call: Call,
        requests: trio.MemoryReceiveChannel[bytes],
        send: Send,
        check: Callable[[Any], None] | None = None,
    ) -> None:
        """The bidi Telemetry stream (see the module docstring); ``check`` vets each ``settings`` command
        before it is applied (it raises :class:`~.errors.RpcError` to end the stream)."""
        client_id = call.client_id
        clients = self._resources.clients
        got_settings = False
        announced: set[str] = set()  # topics whose transaction group this stream announced

        async def push(command: Any) -> None:
            await send(command)

        try:
            while True:
                payload = await self._next(requests, first=not got_settings)
                if payload is None:
                    return
                command = self._decode(payload)
                if command.WhichOneof("command") != "settings":
                    continue  # thread stack traces / verify results: nothing to do with them
                if check is not None:
                    check(command.settings)
                reply = self._reply(command.settings)
                if client_id:
                    record = clients.update_settings(client_id, command.settings)
                    record.telemetry = push
                    if record.client_type == pb.ClientType.PRODUCER:
                        for topic in record.topics - announced:
                            self._resources.broker.announce_producer(transaction_group(topic))
                        announced |= record.topics
                    call.group = call.group or record.group or None
                    call.topic = call.topic or next(iter(sorted(record.topics)), None)
                got_settings = True
                await send(pb.TelemetryCommand(status=ok(), settings=reply))
        finally:
            if client_id:
                clients.detach(client_id, push)
            for topic in sorted(announced):
                if not clients.producers_of(topic):
                    self._resources.broker.announce_producer(transaction_group(topic), present=False)

    async def _next(self, requests: trio.MemoryReceiveChannel[bytes], *, first: bool) -> bytes | None:
        """The next command's bytes; None once the client half-closes. Raises INVALID_ARGUMENT when the
        ``first`` command does not arrive within ``settings_timeout_s``."""
        with trio.move_on_after(self.settings_timeout_s if first else math.inf):
            try:
                return await requests.receive()
            except trio.EndOfChannel:
                return None
        raise RpcError(
            GrpcStatus.INVALID_ARGUMENT, f"no settings received within {self.settings_timeout_s:g} s"
        )

    @staticmethod
    def _decode(payload: bytes) -> Any:
        try:
            return pb.TelemetryCommand.FromString(payload)
        except DecodeError:
            raise RpcError(GrpcStatus.INVALID_ARGUMENT, "undecodable TelemetryCommand") from None

    def _reply(self, settings: Any) -> Any:
        group: GroupConfig | None = None
        if settings.WhichOneof("pub_sub") == "subscription":
            group = self._resources.broker.group_config(settings.subscription.group.name)
        try:
            return settings_reply(settings, self._resources.server_settings, group)
        except SettingsError as exc:
            raise RpcError(GrpcStatus.INVALID_ARGUMENT, str(exc)) from None
