"""
mqproxy.grpc_service.receive
~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Pop consumption: ``ReceiveMessage``, ``AckMessage``, ``ChangeInvisibleDuration`` and
``ForwardMessageToDeadLetterQueue``, with receipt handles the facade issues.

ReceiveMessage pops from every queue of the topic (the request's queue id is ignored: the Node client only
ever names queue 0), in order for a FIFO group (its config decides; a group without one follows the
client's settings saying ``fifo``). It sends ``status`` first, then the messages, then the
``delivery_timestamp``; its long poll ends before the call's deadline and when the server drains. The
invisible duration defaults to 30 s and must lie in 1 s .. 12 h (ILLEGAL_INVISIBLE_TIME otherwise).
"""

from __future__ import annotations

from typing import Any

from mqproxy.codecs import rocketmq_v2 as pb
from mqproxy.facade.api import PopRequest
from mqproxy.grpc_service.call import (
    MAX_BATCH,
    Call,
    Send,
    error_status,
    ok,
    overall_status,
    poll_budget,
    status,
    wall_ms,
)
from mqproxy.grpc_service.convert import to_rmq_message
from mqproxy.grpc_service.errors import ApiError
from mqproxy.grpc_service.resources import Resources
from mqproxy.model.errors import BackendError

__all__ = ["ReceiveRpcs"]

#: Invisible duration when a ReceiveMessage carries none, and the accepted range (ms).
DEFAULT_INVISIBLE_MS = 30_000
MIN_INVISIBLE_MS = 1_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000


class ReceiveRpcs:
    def __init__(self, resources: Resources) -> None:
        self._resources = resources

    def _is_fifo(self, call: Call, group: str) -> bool:
        """Pop in order: the group's config decides; a group without one follows the client's settings."""
        config = self._resources.broker.group_config(group)
        if config is not None:
            return config.consume_orderly
        record = self._resources.clients.get(call.client_id) if call.client_id else None
        settings = record.settings if record is not None else None
        if settings is None or settings.WhichOneof("pub_sub") != "subscription":  # type: ignore[attr-defined]
            return False
        sub = settings.subscription  # type: ignore[attr-defined]
        return bool(sub.fifo) and sub.group.name == group

    async def receive_message(self, call: Call, request: Any, send: Send) -> None:
        resources = self._resources
        group = resources.group_name(call, request.group)
        topic = resources.topic_name(call, request.message_queue.topic)
        message_filter = resources.message_filter(request.filter_expression)
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
        poll_s = poll_budget(
            call, request.long_polling_timeout if request.HasField("long_polling_timeout") else None
        )
        await resources.topic(topic, create=False)
        result = None
        with call.until_drain():
            result = await resources.broker.pop(
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
        if result is None or not result.messages:
            call.code = pb.Code.MESSAGE_NOT_FOUND
            await send(pb.ReceiveMessageResponse(status=status(pb.Code.MESSAGE_NOT_FOUND, "no new message")))
        else:
            await send(pb.ReceiveMessageResponse(status=ok()))
            for popped in result.messages:
                message = to_rmq_message(
                    popped.message,
                    max_body_bytes=resources.server_settings.max_body_bytes,
                    receipt_handle=popped.receipt.encode(),
                    invisible_duration_ms=invisible_ms,
                    delivery_attempt=popped.delivery_attempt,
                    topic=popped.topic,
                )
                await send(pb.ReceiveMessageResponse(message=message))
        now = wall_ms()
        await send(
            pb.ReceiveMessageResponse(
                delivery_timestamp=pb.Timestamp(seconds=now // 1000, nanos=(now % 1000) * 1_000_000)
            )
        )

    async def ack_message(self, call: Call, request: Any) -> Any:
        group = self._resources.group_name(call, request.group)
        topic = self._resources.topic_name(call, request.topic)
        if not request.entries:
            raise ApiError(pb.Code.BAD_REQUEST, "no entry to ack")
        entries = []
        for entry in request.entries:
            try:
                await self._resources.broker.ack(group, topic, entry.receipt_handle)
                entry_status = ok()
            except BackendError as exc:
                entry_status = error_status(exc)
            entries.append(
                pb.AckMessageResultEntry(
                    message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=entry_status
                )
            )
        return pb.AckMessageResponse(status=overall_status(entries), entries=entries)

    async def change_invisible_duration(self, call: Call, request: Any) -> Any:
        group = self._resources.group_name(call, request.group)
        topic = self._resources.topic_name(call, request.topic)
        invisible_ms = request.invisible_duration.ToMilliseconds()
        if not 0 <= invisible_ms <= MAX_INVISIBLE_MS:
            raise ApiError(
                pb.Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible_ms} ms out of range"
            )
        receipt = await self._resources.broker.change_invisible(
            group, topic, request.receipt_handle, invisible_ms
        )
        return pb.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=receipt)

    async def forward_to_dlq(self, call: Call, request: Any) -> Any:
        group = self._resources.group_name(call, request.group)
        topic = self._resources.topic_name(call, request.topic)
        await self._resources.broker.forward_to_dlq(group, topic, request.receipt_handle)
        return pb.ForwardMessageToDeadLetterQueueResponse(status=ok())
