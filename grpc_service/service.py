"""
mqproxy.grpc_service.service
~~~~~~~~~~~~~~~~~~~~~~~~~~~~

``apache.rocketmq.v2.MessagingService``: one handler per RPC over the
:class:`~mqproxy.facade.api.BrokerFacade`, independent of HTTP/2 (the driver in :mod:`.connection` feeds it
decoded requests).

Contracts:

* Unary handlers return the response message; application errors are answered in the body
  (``Status{code, message}``, grpc-status 0) — every response carries a status, ``OK`` on success
  (the clients reject code 0).
* Streaming handlers (``ReceiveMessage``, ``PullMessage``) send ``status`` first, then messages, then the
  final ``delivery_timestamp`` / ``next_offset``; long polls end before the call's deadline and on drain.
* ``Telemetry`` answers every ``settings`` command with the merged settings and completes (grpc-status 0)
  when the client half-closes or the server drains; settings without pub/sub, an undecodable command or
  no settings within ``settings_timeout_s`` end it with INVALID_ARGUMENT.
* :class:`~.errors.RpcError` ends a call with a gRPC status instead.

Routes name one broker (``broker-a``, id 0) at the proxy's advertised address, queue ids from 0,
permission READ_WRITE. ``accept_message_types`` is the topic's administrator-set message type
(:meth:`~mqproxy.facade.api.Admin.topic_type`: MIXED lists all four) and a send of another type is
refused with MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, as the Apache proxy does; an untyped (auto-created) topic
lists all four as well (clients validate the type they send against it). QueryAssignment gives a FIFO
group (one whose config says ``consumeMessageOrderly``) every queue, any other group one broker-wide
queue (id -1), like the Apache proxy.

A message parked for a future delivery timestamp gets a
``recall_handle`` in its SendResultEntry; RecallMessage cancels it through the scheduler until that time
(MESSAGE_NOT_FOUND after it, BAD_REQUEST for a malformed handle or one of another topic).

Semantics worth knowing: a message group is hashed (CRC32) onto one writable queue; ReceiveMessage pops
from every queue of the topic (the request's queue id is ignored: the Node client only ever names queue 0)
and pops in order for a FIFO group (its config, else the client's settings saying ``fifo``);
transactional messages get ``PGROUP`` = ``%GRPC%<topic>`` (v2 has no producer group) and
:meth:`MessagingService.check_back` sends their check-back to a live producer of the topic over its
Telemetry stream.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio
from google.protobuf.message import DecodeError

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.codecs.grpc_wire import GrpcStatus
from mqproxy.facade.api import BrokerFacade, EndTransaction, PopRequest, PullRequest, SendRequest
from mqproxy.facade.types import GroupConfig, Resolution, TopicMessageType
from mqproxy.grpc_service.convert import ConvertError, message_type_of, to_broker_message, to_rmq_message
from mqproxy.grpc_service.errors import ApiError, RpcError, code_for
from mqproxy.grpc_service.telemetry import ClientRegistry, ServerSettings, SettingsError, settings_reply
from mqproxy.model.errors import BackendError, IllegalTopic
from mqproxy.model.topics import validate_topic
from mqproxy.model.types import PERM_READ, PERM_WRITE, FilterExpression, Message, PullStatus, TopicConfig

__all__ = [
    "BROKER_NAME",
    "GRPC_TRANSACTION_GROUP_PREFIX",
    "Call",
    "MessagingService",
    "Send",
]

BROKER_NAME = "broker-a"
#: ``PGROUP`` of transactional messages sent over gRPC (v2 has no producer group): prefix + topic.
GRPC_TRANSACTION_GROUP_PREFIX = "%GRPC%"
#: Longest long poll served (seconds), whatever the client asks.
MAX_LONG_POLL_S = 30.0
#: A long poll ends this long before the call's deadline so the answer arrives in time.
DEADLINE_MARGIN_S = 0.2
MAX_BATCH = 32
#: Invisible duration when a ReceiveMessage carries none, and the accepted range (ms).
DEFAULT_INVISIBLE_MS = 30_000
MIN_INVISIBLE_MS = 1_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000

#: Sends one response message on the call's stream (waits for flow control).
Send = Callable[[Any], Awaitable[None]]


@dataclass(slots=True)
class Call:
    """One RPC as the service sees it. ``group``/``topic``/``code`` are filled in for the request log."""

    method: str
    client_id: str
    peer: tuple[str, int]
    metadata: Mapping[str, str] = field(default_factory=dict)
    deadline: float = math.inf  # trio time
    group: str | None = None
    topic: str | None = None
    code: pb.Code | None = None
    drained: bool = False
    _drain_scopes: set[trio.CancelScope] = field(default_factory=set)

    def remaining(self) -> float:
        return self.deadline - trio.current_time()

    @contextlib.contextmanager
    def until_drain(self) -> Iterator[trio.CancelScope]:
        """A cancel scope for a long poll: cancelled when the server drains (see :meth:`drain`)."""
        with trio.CancelScope() as scope:
            if self.drained:
                scope.cancel()
            self._drain_scopes.add(scope)
            try:
                yield scope
            finally:
                self._drain_scopes.discard(scope)

    def drain(self) -> None:
        """The server is draining: long polls of this call end now (the driver calls this)."""
        self.drained = True
        for scope in self._drain_scopes:
            scope.cancel()


def _status(code: pb.Code, message: str = "") -> Any:
    return pb.Status(code=code, message=message or code.name)


def _ok() -> Any:
    return _status(pb.Code.OK)


def _scheme(host: str) -> pb.AddressScheme:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return pb.AddressScheme.DOMAIN_NAME
    return pb.AddressScheme.IPv4 if ip.version == 4 else pb.AddressScheme.IPv6


class MessagingService:
    """The v2 RPCs for one server, over the broker facade ``broker``."""

    def __init__(
        self,
        broker: BrokerFacade,
        *,
        advertised: tuple[str, int],
        auto_create_topics: bool = True,
        server_settings: ServerSettings | None = None,
        settings_timeout_s: float = 30.0,
    ) -> None:
        self.broker = broker
        self.advertised = advertised
        self.auto_create_topics = auto_create_topics
        self.server_settings = server_settings or ServerSettings()
        self.settings_timeout_s = settings_timeout_s
        self.clients = ClientRegistry()
        host, port = advertised
        self._endpoints = pb.Endpoints(scheme=_scheme(host), addresses=[pb.Address(host=host, port=port)])
        self._unary: dict[str, Callable[[Call, Any], Awaitable[Any]]] = {
            "QueryRoute": self.query_route,
            "Heartbeat": self.heartbeat,
            "SendMessage": self.send_message,
            "QueryAssignment": self.query_assignment,
            "AckMessage": self.ack_message,
            "ForwardMessageToDeadLetterQueue": self.forward_to_dlq,
            "UpdateOffset": self.update_offset,
            "GetOffset": self.get_offset,
            "QueryOffset": self.query_offset,
            "EndTransaction": self.end_transaction,
            "NotifyClientTermination": self.notify_client_termination,
            "ChangeInvisibleDuration": self.change_invisible_duration,
            "RecallMessage": self.recall_message,
            "SyncLiteSubscription": self.sync_lite_subscription,
        }
        self._streaming: dict[str, Callable[[Call, Any, Send], Awaitable[None]]] = {
            "ReceiveMessage": self.receive_message,
            "PullMessage": self.pull_message,
        }

    # ------------------------------------------------------------------------------- dispatch

    def handles(self, name: str) -> bool:
        return name in self._unary or name in self._streaming or name == "Telemetry"

    async def unary(self, call: Call, request: Any) -> Any:
        """Run a unary RPC; application errors become the response's status."""
        response_type = pb.METHODS[f"/{pb.SERVICE}/{call.method}"].response
        try:
            response = await self._unary[call.method](call, request)
        except ApiError as err:
            response = response_type(status=_status(err.code, err.message))
        except BackendError as exc:
            response = response_type(status=_status(code_for(exc), str(exc) or type(exc).__name__))
        call.code = pb.Code(response.status.code)
        return response

    async def server_stream(self, call: Call, request: Any, send: Send) -> None:
        """Run a server-streaming RPC; an application error is sent as the (only) status response."""
        response_type = pb.METHODS[f"/{pb.SERVICE}/{call.method}"].response
        call.code = pb.Code.OK
        try:
            await self._streaming[call.method](call, request, send)
        except ApiError as err:
            call.code = err.code
            await send(response_type(status=_status(err.code, err.message)))
        except BackendError as exc:
            call.code = code_for(exc)
            await send(response_type(status=_status(call.code, str(exc) or type(exc).__name__)))

    # ------------------------------------------------------------------------------- helpers

    def _topic_name(self, call: Call, resource: Any) -> str:
        name = resource.name
        call.topic = name
        try:
            validate_topic(name)
        except IllegalTopic as exc:
            raise ApiError(pb.Code.ILLEGAL_TOPIC, str(exc)) from None
        return name

    def _group_name(self, call: Call, resource: Any) -> str:
        name = resource.name
        call.group = name or None
        if not name:
            raise ApiError(pb.Code.ILLEGAL_CONSUMER_GROUP, "consumer group is empty")
        try:
            validate_topic(name)  # same character rules and length limit as topics
        except IllegalTopic:
            raise ApiError(pb.Code.ILLEGAL_CONSUMER_GROUP, f"illegal consumer group {name[:64]!r}") from None
        return name

    async def _topic(self, topic: str, *, create: bool) -> TopicConfig:
        config = await self.broker.get_topic(topic)
        if config is None and create and self.auto_create_topics:
            config = await self.broker.create_topic(topic, None)
        if config is None:
            raise ApiError(pb.Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        return config

    def _topic_type(self, topic: str) -> TopicMessageType | None:
        return self.broker.topic_type(topic)

    def _group_config(self, group: str) -> GroupConfig | None:
        return self.broker.group_config(group)

    def _accept_types(self, topic: str) -> list[pb.MessageType]:
        """What the route of ``topic`` says it accepts (see the module docstring)."""
        typed = self._topic_type(topic)
        if typed is not None and typed is not TopicMessageType.MIXED:
            return [pb.MessageType[typed.value]]
        return [pb.MessageType.NORMAL, pb.MessageType.FIFO, pb.MessageType.DELAY, pb.MessageType.TRANSACTION]

    def _check_type(self, message: Message) -> None:
        """A typed topic takes only its type (Apache ``DefaultTopicMessageTypeValidator``)."""
        typed = self._topic_type(message.topic)
        if typed is None or typed is TopicMessageType.MIXED:
            return
        actual = message_type_of(message.properties)
        if actual.name != typed.value:
            raise ApiError(
                pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                f"topic {message.topic} accepts {typed.value} messages, not {actual.name}",
            )

    def _queues(self, config: TopicConfig) -> list[Any]:
        broker = pb.Broker(name=BROKER_NAME, id=0, endpoints=self._endpoints)
        perm = pb.Permission.NONE
        if config.perm & PERM_READ and config.perm & PERM_WRITE:
            perm = pb.Permission.READ_WRITE
        elif config.perm & PERM_READ:
            perm = pb.Permission.READ
        elif config.perm & PERM_WRITE:
            perm = pb.Permission.WRITE
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

    def _poll_budget(self, call: Call, requested: Any | None) -> float:
        """Seconds a long poll may wait: the client's ask, capped, and ending before the deadline."""
        wait = MAX_LONG_POLL_S
        if requested is not None:
            wait = min(wait, max(requested.ToMilliseconds() / 1000, 0.0))
        return max(0.0, min(wait, call.remaining() - DEADLINE_MARGIN_S))

    # ------------------------------------------------------------------------------- routes

    async def query_route(self, call: Call, request: Any) -> Any:
        topic = self._topic_name(call, request.topic)
        config = await self._topic(topic, create=True)
        return pb.QueryRouteResponse(status=_ok(), message_queues=self._queues(config))

    async def query_assignment(self, call: Call, request: Any) -> Any:
        topic = self._topic_name(call, request.topic)
        group = self._group_name(call, request.group)
        config = await self._topic(topic, create=True)
        queues = self._queues(config)
        if not self._is_fifo_group(group):
            # one broker-wide queue: a receive pops every queue anyway (Apache proxy: queue id -1)
            whole = queues[0]
            whole.id = -1
            del whole.accept_message_types[:]
            queues = [whole]
        assignments = [pb.Assignment(message_queue=q) for q in queues]
        return pb.QueryAssignmentResponse(status=_ok(), assignments=assignments)

    # ------------------------------------------------------------------------------- clients

    def _require_client_id(self, call: Call) -> str:
        if not call.client_id:
            raise ApiError(pb.Code.CLIENT_ID_REQUIRED, "x-mq-client-id is required")
        return call.client_id

    async def heartbeat(self, call: Call, request: Any) -> Any:
        client_id = self._require_client_id(call)
        record = self.clients.get(client_id)
        if request.HasField("group") and request.group.name:
            self._group_name(call, request.group)
        client_type = request.client_type or (record.client_type if record else 0)
        if not client_type:
            raise ApiError(pb.Code.UNRECOGNIZED_CLIENT_TYPE, "unrecognized client type")
        record = self.clients.touch(client_id)
        record.client_type = int(client_type)
        if call.group:
            record.group = call.group
        return pb.HeartbeatResponse(status=_ok())

    async def notify_client_termination(self, call: Call, request: Any) -> Any:
        if request.HasField("group") and request.group.name:
            call.group = request.group.name
        if call.client_id:
            self.clients.remove(call.client_id)
        return pb.NotifyClientTerminationResponse(status=_ok())

    async def sync_lite_subscription(self, call: Call, request: Any) -> Any:
        raise ApiError(pb.Code.NOT_IMPLEMENTED, "lite topics are not supported")

    async def telemetry(self, call: Call, requests: trio.MemoryReceiveChannel[bytes], send: Send) -> None:
        """The bidi Telemetry stream (see the module docstring)."""
        client_id = call.client_id
        got_settings = False

        async def push(command: Any) -> None:
            await send(command)

        try:
            while True:
                timeout = math.inf if got_settings else self.settings_timeout_s
                payload = None
                with trio.move_on_after(timeout):
                    try:
                        payload = await requests.receive()
                    except trio.EndOfChannel:
                        return
                if payload is None:
                    raise RpcError(
                        GrpcStatus.INVALID_ARGUMENT,
                        f"no settings received within {self.settings_timeout_s:g} s",
                    )
                try:
                    command = pb.TelemetryCommand.FromString(payload)
                except DecodeError:
                    raise RpcError(GrpcStatus.INVALID_ARGUMENT, "undecodable TelemetryCommand") from None
                if command.WhichOneof("command") != "settings":
                    continue  # thread stack traces / verify results: nothing to do with them
                try:
                    reply = settings_reply(
                        command.settings, self.server_settings, self._settings_group(command.settings)
                    )
                except SettingsError as exc:
                    raise RpcError(GrpcStatus.INVALID_ARGUMENT, str(exc)) from None
                if client_id:
                    record = self.clients.update_settings(client_id, command.settings)
                    record.telemetry = push
                    call.group = call.group or record.group or None
                    call.topic = call.topic or next(iter(sorted(record.topics)), None)
                got_settings = True
                await send(pb.TelemetryCommand(status=_ok(), settings=reply))
        finally:
            if client_id:
                self.clients.detach(client_id, push)

    def _settings_group(self, settings: Any) -> GroupConfig | None:
        if settings.WhichOneof("pub_sub") != "subscription":
            return None
        return self._group_config(settings.subscription.group.name)

    async def check_back(self, check: Any) -> bool:
        """Transaction check-back for half messages sent over gRPC (``PGROUP`` = prefix + topic):
        sends ``RecoverOrphanedTransactionCommand`` to a live producer of the topic; False if none (or if
        the half message was not sent over gRPC)."""
        if not check.producer_group.startswith(GRPC_TRANSACTION_GROUP_PREFIX):
            return False
        topic = check.message.topic
        message = to_rmq_message(check.message, max_body_bytes=self.server_settings.max_body_bytes)
        command = pb.TelemetryCommand(
            recover_orphaned_transaction_command=pb.RecoverOrphanedTransactionCommand(
                message=message,
                transaction_id=check.transaction_id,
            )
        )
        for record in self.clients.producers_of(topic):
            sender = record.telemetry
            if sender is None:
                continue
            try:
                await sender(command)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                continue
            return True
        return False

    # ------------------------------------------------------------------------------- produce

    async def send_message(self, call: Call, request: Any) -> Any:
        if not request.messages:
            raise ApiError(pb.Code.BAD_REQUEST, "no message to send")
        if len(request.messages) > MAX_BATCH:
            raise ApiError(pb.Code.BAD_REQUEST, f"at most {MAX_BATCH} messages per request")
        entries = []
        for msg in request.messages:
            entries.append(await self._send_one(call, msg))
        codes = {entry.status.code for entry in entries}
        code = pb.Code(codes.pop()) if len(codes) == 1 else pb.Code.MULTIPLE_RESULTS
        return pb.SendMessageResponse(
            status=_status(
                code,
                entries[0].status.message if code != pb.Code.OK and code != pb.Code.MULTIPLE_RESULTS else "",
            ),
            entries=entries,
        )

    async def _send_one(self, call: Call, msg: Any) -> Any:
        call.topic = msg.topic.name
        try:
            message = to_broker_message(
                msg, born_host=call.peer, max_body_bytes=self.server_settings.max_body_bytes
            )
            outcome = await self._store(message, msg)
        except ConvertError as err:
            return pb.SendResultEntry(status=_status(err.code, err.message))
        except ApiError as err:
            return pb.SendResultEntry(status=_status(err.code, err.message))
        except BackendError as exc:
            return pb.SendResultEntry(status=_status(code_for(exc), str(exc) or type(exc).__name__))
        message_id = msg.system_properties.message_id
        return pb.SendResultEntry(
            status=_ok(),
            message_id=message_id,
            transaction_id=message_id,
            offset=outcome.result.queue_offset,
            recall_handle=outcome.recall_handle,
        )

    async def _store(self, message: Message, msg: Any) -> Any:
        config = await self._topic(message.topic, create=True)
        self._check_type(message)
        sp = msg.system_properties
        if sp.HasField("message_group"):
            writable = max(config.write_queues, 1)
            message.queue_id = zlib.crc32(sp.message_group.encode("utf-8", "surrogatepass")) % writable
        if sp.message_type == pb.MessageType.TRANSACTION:
            message.properties["PGROUP"] = GRPC_TRANSACTION_GROUP_PREFIX + message.topic
        return await self.broker.send(SendRequest(message))

    async def recall_message(self, call: Call, request: Any) -> Any:
        topic = self._topic_name(call, request.topic)
        message_id = await self.broker.recall(topic, request.recall_handle)
        return pb.RecallMessageResponse(status=_ok(), message_id=message_id)

    async def end_transaction(self, call: Call, request: Any) -> Any:
        topic = self._topic_name(call, request.topic)
        resolution = {
            pb.TransactionResolution.COMMIT: Resolution.COMMIT,
            pb.TransactionResolution.ROLLBACK: Resolution.ROLLBACK,
        }.get(request.resolution, Resolution.UNKNOWN)
        transaction_id = request.transaction_id or request.message_id
        if not transaction_id:
            raise ApiError(pb.Code.INVALID_TRANSACTION_ID, "transaction id is empty")
        await self.broker.end_transaction(
            EndTransaction(
                resolution,
                producer_group=GRPC_TRANSACTION_GROUP_PREFIX + topic,
                transaction_id=transaction_id,
                from_check=request.source == pb.TransactionSource.SOURCE_SERVER_CHECK,
            )
        )
        return pb.EndTransactionResponse(status=_ok())

    # ------------------------------------------------------------------------------- pull & offsets

    async def _queue(self, call: Call, mq: Any) -> tuple[str, int]:
        topic = self._topic_name(call, mq.topic)
        config = await self._topic(topic, create=False)
        if not 0 <= mq.id < max(config.read_queues, config.write_queues):
            raise ApiError(pb.Code.BAD_REQUEST, f"topic {topic} has no queue {mq.id}")
        return topic, mq.id

    async def pull_message(self, call: Call, request: Any, send: Send) -> None:
        group = self._group_name(call, request.group)
        topic, queue_id = await self._queue(call, request.message_queue)
        message_filter = self._filter(request.filter_expression)
        batch = min(max(request.batch_size, 1), MAX_BATCH)
        offset = request.offset
        wait_s = self._poll_budget(
            call, request.long_polling_timeout if request.HasField("long_polling_timeout") else None
        )
        deadline = trio.current_time() + wait_s
        while True:
            result = await self.broker.pull(
                PullRequest(group, topic, queue_id, offset, batch, message_filter=message_filter)
            )
            if result.status in (PullStatus.FOUND, PullStatus.OFFSET_ILLEGAL):
                break
            offset = result.next_offset
            remaining = deadline - trio.current_time()
            if remaining <= 0 or call.drained:
                break
            with call.until_drain():
                await self.broker.wait_for_message(topic, queue_id, offset, remaining)
        if result.status is PullStatus.FOUND:
            await send(pb.PullMessageResponse(status=_ok()))
            for stored in result.messages:
                await send(
                    pb.PullMessageResponse(
                        message=to_rmq_message(stored, max_body_bytes=self.server_settings.max_body_bytes)
                    )
                )
        elif result.status is PullStatus.OFFSET_ILLEGAL:
            call.code = pb.Code.ILLEGAL_OFFSET
            await send(
                pb.PullMessageResponse(
                    status=_status(pb.Code.ILLEGAL_OFFSET, f"offset {request.offset} is out of range")
                )
            )
        else:
            call.code = pb.Code.MESSAGE_NOT_FOUND
            await send(pb.PullMessageResponse(status=_status(pb.Code.MESSAGE_NOT_FOUND, "no new message")))
        await send(pb.PullMessageResponse(next_offset=result.next_offset))

    @staticmethod
    def _filter(expression: Any) -> FilterExpression:
        if expression.type == pb.FilterType.SQL:
            raise ApiError(pb.Code.ILLEGAL_FILTER_EXPRESSION, "SQL92 filters are not supported")
        return FilterExpression(expression.expression or "*")

    async def update_offset(self, call: Call, request: Any) -> Any:
        group = self._group_name(call, request.group)
        topic, queue_id = await self._queue(call, request.message_queue)
        if request.offset < 0:
            raise ApiError(pb.Code.ILLEGAL_OFFSET, f"offset {request.offset} is negative")
        await self.broker.commit_consumer_offset(group, topic, queue_id, request.offset)
        return pb.UpdateOffsetResponse(status=_ok())

    async def get_offset(self, call: Call, request: Any) -> Any:
        group = self._group_name(call, request.group)
        topic, queue_id = await self._queue(call, request.message_queue)
        offset = await self.broker.query_consumer_offset(group, topic, queue_id)
        if offset is None:
            raise ApiError(pb.Code.OFFSET_NOT_FOUND, f"{group} has no offset on {topic}:{queue_id}")
        return pb.GetOffsetResponse(status=_ok(), offset=offset)

    async def query_offset(self, call: Call, request: Any) -> Any:
        topic, queue_id = await self._queue(call, request.message_queue)
        policy = request.query_offset_policy
        if policy == pb.QueryOffsetPolicy.BEGINNING:
            offset = await self.broker.min_offset(topic, queue_id)
        elif policy == pb.QueryOffsetPolicy.END:
            offset = await self.broker.max_offset(topic, queue_id)
        else:
            if not request.HasField("timestamp"):
                raise ApiError(pb.Code.BAD_REQUEST, "TIMESTAMP policy needs a timestamp")
            offset = await self.broker.search_offset(topic, queue_id, request.timestamp.ToMilliseconds())
        return pb.QueryOffsetResponse(status=_ok(), offset=offset)

    # ------------------------------------------------------------------------------- pop consumption

    def _is_fifo_group(self, group: str) -> bool:
        """The group's config says ``consumeMessageOrderly``."""
        config = self._group_config(group)
        return config is not None and config.consume_orderly

    def _is_fifo(self, call: Call, group: str) -> bool:
        """Pop in order: the group's config decides; a group without one follows the client's settings."""
        config = self._group_config(group)
        if config is not None:
            return config.consume_orderly
        record = self.clients.get(call.client_id) if call.client_id else None
        settings = record.settings if record is not None else None
        if settings is None or settings.WhichOneof("pub_sub") != "subscription":
            return False
        sub = settings.subscription
        return bool(sub.fifo) and sub.group.name == group

    async def receive_message(self, call: Call, request: Any, send: Send) -> None:
        group = self._group_name(call, request.group)
        topic = self._topic_name(call, request.message_queue.topic)
        message_filter = self._filter(request.filter_expression)
        batch = min(max(request.batch_size, 1), MAX_BATCH)
        if request.HasField("invisible_duration"):
            invisible_ms = request.invisible_duration.ToMilliseconds()
        else:
            invisible_ms = DEFAULT_INVISIBLE_MS
        if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
            raise ApiError(
                pb.Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible duration {invisible_ms} ms outside {MIN_INVISIBLE_MS}..{MAX_INVISIBLE_MS}",
            )
        poll_s = self._poll_budget(
            call, request.long_polling_timeout if request.HasField("long_polling_timeout") else None
        )
        await self._topic(topic, create=False)
        result = None
        with call.until_drain():
            result = await self.broker.pop(
                PopRequest(
                    group,
                    topic,
                    batch,
                    invisible_ms,
                    message_filter=message_filter,
                    order=self._is_fifo(call, group),
                    hold_s=poll_s,
                )
            )
        max_body = self.server_settings.max_body_bytes
        if result is None or not result.messages:
            call.code = pb.Code.MESSAGE_NOT_FOUND
            await send(pb.ReceiveMessageResponse(status=_status(pb.Code.MESSAGE_NOT_FOUND, "no new message")))
        else:
            await send(pb.ReceiveMessageResponse(status=_ok()))
            for popped in result.messages:
                message = to_rmq_message(
                    popped.message,
                    max_body_bytes=max_body,
                    receipt_handle=popped.receipt.encode(),
                    invisible_duration_ms=invisible_ms,
                    delivery_attempt=popped.delivery_attempt,
                    topic=popped.topic,
                )
                await send(pb.ReceiveMessageResponse(message=message))
        now = trio_wall_ms()
        await send(
            pb.ReceiveMessageResponse(
                delivery_timestamp=pb.Timestamp(seconds=now // 1000, nanos=(now % 1000) * 1_000_000)
            )
        )

    async def ack_message(self, call: Call, request: Any) -> Any:
        group = self._group_name(call, request.group)
        topic = self._topic_name(call, request.topic)
        if not request.entries:
            raise ApiError(pb.Code.BAD_REQUEST, "no entry to ack")
        entries = []
        for entry in request.entries:
            try:
                await self.broker.ack(group, topic, entry.receipt_handle)
                status = _ok()
            except BackendError as exc:
                status = _status(code_for(exc), str(exc) or type(exc).__name__)
            entries.append(
                pb.AckMessageResultEntry(
                    message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=status
                )
            )
        codes = {e.status.code for e in entries}
        if len(codes) == 1:
            status = entries[0].status
        else:
            status = _status(pb.Code.MULTIPLE_RESULTS)
        return pb.AckMessageResponse(status=status, entries=entries)

    async def change_invisible_duration(self, call: Call, request: Any) -> Any:
        group = self._group_name(call, request.group)
        topic = self._topic_name(call, request.topic)
        invisible_ms = request.invisible_duration.ToMilliseconds()
        if not 0 <= invisible_ms <= MAX_INVISIBLE_MS:
            raise ApiError(
                pb.Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible_ms} ms out of range"
            )
        receipt = await self.broker.change_invisible(group, topic, request.receipt_handle, invisible_ms)
        return pb.ChangeInvisibleDurationResponse(status=_ok(), receipt_handle=receipt)

    async def forward_to_dlq(self, call: Call, request: Any) -> Any:
        group = self._group_name(call, request.group)
        topic = self._topic_name(call, request.topic)
        await self.broker.forward_to_dlq(group, topic, request.receipt_handle)
        return pb.ForwardMessageToDeadLetterQueueResponse(status=_ok())


def trio_wall_ms() -> int:
    """Wall-clock milliseconds (delivery timestamps are wall-clock)."""
    return time.time_ns() // 1_000_000
