"""
mqproxy.grpc_service.service
~~~~~~~~~~~~~~~~~~~~~~~~~~~~

``apache.rocketmq.v2.MessagingService``: the dispatcher of the v2 RPCs to their handlers over the
:class:`~mqproxy.facade.api.BrokerFacade`, independent of HTTP/2 (the driver in :mod:`.connection` feeds it
decoded requests). Handlers live by activity: :mod:`.route`, :mod:`.send`, :mod:`.receive`, :mod:`.pull`,
:mod:`.transactions` and :mod:`.sessions`.

Contracts:

* Unary handlers return the response message; application errors are answered in the body
  (``Status{code, message}``, grpc-status 0) — every response carries a status, ``OK`` on success
  (the clients reject code 0).
* Streaming handlers (``ReceiveMessage``, ``PullMessage``) send ``status`` first, then messages, then the
  final ``delivery_timestamp`` / ``next_offset``; an application error is sent as the only status.
* ``Telemetry`` is the one bidi call (:meth:`MessagingService.telemetry`).
* :class:`~.errors.RpcError` ends a call with a gRPC status instead.
* ``SyncLiteSubscription`` answers NOT_IMPLEMENTED (lite topics are not supported).
* With an ACL account file loaded, :class:`~.guard.GrpcGuard` vets every call before its handler runs
  (UNAUTHORIZED / FORBIDDEN in the response status; for Telemetry, grpc-status UNAUTHENTICATED /
  PERMISSION_DENIED).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.facade.api import BrokerFacade
from mqproxy.facade.types import TransactionCheck
from mqproxy.grpc_service.call import Call, Send, error_status
from mqproxy.grpc_service.errors import ApiError
from mqproxy.grpc_service.guard import GrpcGuard
from mqproxy.grpc_service.pull import PullRpcs
from mqproxy.grpc_service.receive import ReceiveRpcs
from mqproxy.grpc_service.resources import Resources
from mqproxy.grpc_service.route import RouteRpcs
from mqproxy.grpc_service.send import SendRpcs
from mqproxy.grpc_service.sessions import SessionRpcs
from mqproxy.grpc_service.settings import GrpcSettings
from mqproxy.grpc_service.telemetry import ClientRegistry
from mqproxy.grpc_service.transactions import TransactionRpcs
from mqproxy.model.errors import BackendError

__all__ = ["Call", "MessagingService", "Send"]

Unary = Callable[[Call, Any], Awaitable[Any]]
Streaming = Callable[[Call, Any, Send], Awaitable[None]]


async def _lite_unsupported(call: Call, request: Any) -> Any:
    raise ApiError(pb.Code.NOT_IMPLEMENTED, "lite topics are not supported")


class MessagingService:
    """The v2 RPCs for one server, over the broker facade ``broker`` (one instance serves every
    connection: the registry of live clients spans them), configured by ``settings``; ``guard`` applies
    the ACL account file (none: every call passes)."""

    def __init__(self, broker: BrokerFacade, settings: GrpcSettings, guard: GrpcGuard | None = None) -> None:
        self.guard = guard if guard is not None else GrpcGuard()
        self.resources = Resources(
            broker, auto_create_topics=settings.auto_create_topics, server_settings=settings.server
        )
        route = RouteRpcs(self.resources, settings.advertised)
        send = SendRpcs(self.resources)
        receive = ReceiveRpcs(self.resources)
        pull = PullRpcs(self.resources)
        self.transactions = TransactionRpcs(self.resources)
        self.sessions = SessionRpcs(self.resources, settings.settings_timeout_s)
        self._unary: dict[str, Unary] = {
            "QueryRoute": route.query_route,
            "QueryAssignment": route.query_assignment,
            "Heartbeat": self.sessions.heartbeat,
            "NotifyClientTermination": self.sessions.notify_client_termination,
            "SendMessage": send.send_message,
            "RecallMessage": send.recall_message,
            "EndTransaction": self.transactions.end_transaction,
            "AckMessage": receive.ack_message,
            "ChangeInvisibleDuration": receive.change_invisible_duration,
            "ForwardMessageToDeadLetterQueue": receive.forward_to_dlq,
            "UpdateOffset": pull.update_offset,
            "GetOffset": pull.get_offset,
            "QueryOffset": pull.query_offset,
            "SyncLiteSubscription": _lite_unsupported,
        }
        self._streaming: dict[str, Streaming] = {
            "ReceiveMessage": receive.receive_message,
            "PullMessage": pull.pull_message,
        }

    @property
    def clients(self) -> ClientRegistry:
        return self.resources.clients

    def handles(self, name: str) -> bool:
        return name in self._unary or name in self._streaming or name == "Telemetry"

    async def unary(self, call: Call, request: Any) -> Any:
        """Run a unary RPC; application errors become the response's status."""
        response_type = pb.METHODS[f"/{pb.SERVICE}/{call.method}"].response
        try:
            await self.guard.admit(call, request)
            response = await self._unary[call.method](call, request)
        except (ApiError, BackendError) as exc:
            response = response_type(status=error_status(exc))
        call.code = pb.Code(response.status.code)
        return response

    async def server_stream(self, call: Call, request: Any, send: Send) -> None:
        """Run a server-streaming RPC; an application error is sent as the (only) status response."""
        response_type = pb.METHODS[f"/{pb.SERVICE}/{call.method}"].response
        call.code = pb.Code.OK
        try:
            await self.guard.admit(call, request)
            await self._streaming[call.method](call, request, send)
        except (ApiError, BackendError) as exc:
            status = error_status(exc)
            call.code = pb.Code(status.code)
            await send(response_type(status=status))

    async def telemetry(self, call: Call, requests: trio.MemoryReceiveChannel[bytes], send: Send) -> None:
        """The bidi Telemetry stream (:meth:`.sessions.SessionRpcs.telemetry`), once the guard let it open."""
        check = await self.guard.open_stream(call)
        await self.sessions.telemetry(call, requests, send, check)

    async def check_back(self, check: TransactionCheck) -> bool:
        """Transaction check-back for half messages sent over gRPC
        (:meth:`.transactions.TransactionRpcs.check_back`)."""
        return await self.transactions.check_back(check)
