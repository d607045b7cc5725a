"""
mqproxy.grpc_service.pull
~~~~~~~~~~~~~~~~~~~~~~~~~

``PullMessage`` and the consumer offsets (``UpdateOffset``, ``GetOffset``, ``QueryOffset``): consumption
of one named queue by offset.

PullMessage sends ``status`` first, then the messages, then the ``next_offset``; finding nothing, it waits
for a new message up to the client's long-polling timeout (capped, and ending before the call's deadline
and when the server drains). An offset out of range answers ILLEGAL_OFFSET, nothing new
MESSAGE_NOT_FOUND.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import trio

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.facade.api import PullRequest
from mqproxy.grpc_service.call import MAX_BATCH, Call, Send, ok, poll_budget, status
from mqproxy.grpc_service.convert import to_rmq_message
from mqproxy.grpc_service.errors import ApiError
from mqproxy.grpc_service.resources import Resources
from mqproxy.model.types import PullResult, PullStatus

__all__ = ["PullRpcs"]


class PullRpcs:
    def __init__(self, resources: Resources) -> None:
        self._resources = resources

    async def pull_message(self, call: Call, request: Any, send: Send) -> None:
        resources = self._resources
        group = resources.group_name(call, request.group)
        topic, queue_id = await resources.queue(call, request.message_queue)
        pull = PullRequest(
            group,
            topic,
            queue_id,
            request.offset,
            min(max(request.batch_size, 1), MAX_BATCH),
            message_filter=resources.message_filter(request.filter_expression),
        )
        wait_s = poll_budget(
            call, request.long_polling_timeout if request.HasField("long_polling_timeout") else None
        )
        result = await self._pull(call, pull, trio.current_time() + wait_s)
        if result.status is PullStatus.FOUND:
            await send(pb.PullMessageResponse(status=ok()))
            max_body = resources.server_settings.max_body_bytes
            for stored in result.messages:
                await send(pb.PullMessageResponse(message=to_rmq_message(stored, max_body_bytes=max_body)))
        elif result.status is PullStatus.OFFSET_ILLEGAL:
            call.code = pb.Code.ILLEGAL_OFFSET
            message = f"offset {request.offset} is out of range"
            await send(pb.PullMessageResponse(status=status(pb.Code.ILLEGAL_OFFSET, message)))
        else:
            call.code = pb.Code.MESSAGE_NOT_FOUND
            await send(pb.PullMessageResponse(status=status(pb.Code.MESSAGE_NOT_FOUND, "no new message")))
        await send(pb.PullMessageResponse(next_offset=result.next_offset))

    async def _pull(self, call: Call, pull: PullRequest, deadline: float) -> PullResult:
        """Pull until something is found, the offset is illegal, ``deadline`` passes or the server drains."""
        broker = self._resources.broker
        offset = pull.offset
        while True:
            result = await broker.pull(dataclasses.replace(pull, offset=offset))
            if result.status in (PullStatus.FOUND, PullStatus.OFFSET_ILLEGAL):
                return result
            offset = result.next_offset
            remaining = deadline - trio.current_time()
            if remaining <= 0 or call.drained:
                return result
            with call.until_drain():
                await broker.wait_for_message(pull.topic, pull.queue_id, offset, remaining)

    async def update_offset(self, call: Call, request: Any) -> Any:
        group = self._resources.group_name(call, request.group)
        topic, queue_id = await self._resources.queue(call, request.message_queue)
        if request.offset < 0:
            raise ApiError(pb.Code.ILLEGAL_OFFSET, f"offset {request.offset} is negative")
        await self._resources.broker.commit_consumer_offset(group, topic, queue_id, request.offset)
        return pb.UpdateOffsetResponse(status=ok())

    async def get_offset(self, call: Call, request: Any) -> Any:
        group = self._resources.group_name(call, request.group)
        topic, queue_id = await self._resources.queue(call, request.message_queue)
        offset = await self._resources.broker.query_consumer_offset(group, topic, queue_id)
        if offset is None:
            raise ApiError(pb.Code.OFFSET_NOT_FOUND, f"{group} has no offset on {topic}:{queue_id}")
        return pb.GetOffsetResponse(status=ok(), offset=offset)

    async def query_offset(self, call: Call, request: Any) -> Any:
        topic, queue_id = await self._resources.queue(call, request.message_queue)
        broker = self._resources.broker
        policy = request.query_offset_policy
        if policy == pb.QueryOffsetPolicy.BEGINNING:
            offset = await broker.min_offset(topic, queue_id)
        elif policy == pb.QueryOffsetPolicy.END:
            offset = await broker.max_offset(topic, queue_id)
        else:
            if not request.HasField("timestamp"):
                raise ApiError(pb.Code.BAD_REQUEST, "TIMESTAMP policy needs a timestamp")
            offset = await broker.search_offset(topic, queue_id, request.timestamp.ToMilliseconds())
        return pb.QueryOffsetResponse(status=ok(), offset=offset)
