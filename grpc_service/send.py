"""
mqproxy.grpc_service.send
~~~~~~~~~~~~~~~~~~~~~~~~~

``SendMessage`` and ``RecallMessage``.

Each message of a send is answered by its own ``SendResultEntry`` (a conversion or broker error fails that
entry only); the response status is the entries' common one, else MULTIPLE_RESULTS. The topic is
auto-created when allowed; a typed topic takes only its type (MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
otherwise, as Apache's ``DefaultTopicMessageTypeValidator``); a message group is hashed (CRC32) onto one
writable queue; a transactional message gets ``PGROUP`` = ``%GRPC%<topic>`` (v2 has no producer group).
A message parked until a future delivery timestamp gets a ``recall_handle``; RecallMessage cancels it
until that time (MESSAGE_NOT_FOUND after it, BAD_REQUEST for a malformed handle or one of another topic).
"""

from __future__ import annotations

import zlib
from typing import Any

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.facade.api import SendOutcome, SendRequest
from mqproxy.facade.types import TopicMessageType
from mqproxy.grpc_service.call import MAX_BATCH, Call, error_status, ok, overall_status
from mqproxy.grpc_service.convert import message_type_of, to_broker_message
from mqproxy.grpc_service.errors import ApiError
from mqproxy.grpc_service.resources import Resources
from mqproxy.grpc_service.transactions import transaction_group
from mqproxy.model.errors import BackendError
from mqproxy.model.properties import PROPERTY_PRODUCER_GROUP
from mqproxy.model.types import Message

__all__ = ["SendRpcs"]


class SendRpcs:
    def __init__(self, resources: Resources) -> None:
        self._resources = resources

    async def send_message(self, call: Call, request: Any) -> Any:
        if not request.messages:
            raise ApiError(pb.Code.BAD_REQUEST, "no message to send")
        if len(request.messages) > MAX_BATCH:
            raise ApiError(pb.Code.BAD_REQUEST, f"at most {MAX_BATCH} messages per request")
        entries = [await self._send_one(call, msg) for msg in request.messages]
        return pb.SendMessageResponse(status=overall_status(entries), entries=entries)

    async def _send_one(self, call: Call, msg: Any) -> Any:
        call.topic = msg.topic.name
        try:
            message = to_broker_message(
                msg, born_host=call.peer, max_body_bytes=self._resources.server_settings.max_body_bytes
            )
            outcome = await self._store(message, msg)
        except (ApiError, BackendError) as exc:
            return pb.SendResultEntry(status=error_status(exc))
        message_id = msg.system_properties.message_id
        return pb.SendResultEntry(
            status=ok(),
            message_id=message_id,
            transaction_id=outcome.transaction_ref or message_id,
            offset=outcome.result.queue_offset,
            recall_handle=outcome.recall_handle,
        )

    async def _store(self, message: Message, msg: Any) -> SendOutcome:
        config = await self._resources.topic(message.topic, create=True)
        self._check_type(message)
        sp = msg.system_properties
        if sp.HasField("message_group"):
            writable = max(config.write_queues, 1)
            message.queue_id = zlib.crc32(sp.message_group.encode("utf-8", "surrogatepass")) % writable
        if sp.message_type == pb.MessageType.TRANSACTION:
            message.properties[PROPERTY_PRODUCER_GROUP] = transaction_group(message.topic)
        return await self._resources.broker.send(SendRequest(message))

    def _check_type(self, message: Message) -> None:
        """A typed topic takes only its type."""
        typed = self._resources.broker.topic_type(message.topic)
        if typed is None or typed is TopicMessageType.MIXED:
            return
        actual = message_type_of(message.properties)
        if actual.name != typed.value:
            raise ApiError(
                pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                f"topic {message.topic} accepts {typed.value} messages, not {actual.name}",
            )

    async def recall_message(self, call: Call, request: Any) -> Any:
        topic = self._resources.topic_name(call, request.topic)
        message_id = await self._resources.broker.recall(topic, request.recall_handle)
        return pb.RecallMessageResponse(status=ok(), message_id=message_id)
