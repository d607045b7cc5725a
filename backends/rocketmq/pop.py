"""
mqproxy.backends.rocketmq.pop
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

The :class:`~mqproxy.facade.api.Popping` role against a RocketMQ cluster: pop checkpoints, invisibility
and revival are the brokers' (RIP-19), so a message popped through one node is acked through any other.

Contracts:

* A receipt is RocketMQ's ``extraInfo`` with this node's virtual queue id and the real broker's name
  (what the Java client builds from a POP_MESSAGE answer); ack and change-invisible turn it back into the
  broker's form before forwarding.
* A pop of "any queue" asks each master broker in turn (round-robin start) without waiting, and then,
  if ``hold_s`` > 0, long-polls them in slices of at most :data:`POLL_SLICE_S` until the hold ends, so a
  message on any broker is found within one slice.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence
from typing import Final

import trio

from mqproxy.backends.rocketmq import wire
from mqproxy.backends.rocketmq.cluster import Cluster, TopicView
from mqproxy.backends.rocketmq.messages import to_client
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.facade.api import PopRequest
from mqproxy.facade.types import AckOutcome
from mqproxy.model.errors import (
    BackendError,
    BrokerRefused,
    ClusterUnavailable,
    MessageNotFound,
    QueueNotFound,
    ReceiptExpired,
    TopicNotFound,
)
from mqproxy.model.receipts import RETRY_NORMAL, RETRY_V1, RETRY_V2, PoppedMessage, PopResult, Receipt
from mqproxy.model.topics import RETRY_PREFIX
from mqproxy.model.types import FilterExpression, StoredMessage, TagFilter

__all__ = ["POLL_SLICE_S", "PoppingRole"]

#: Longest single broker long-poll of a pop over every broker.
POLL_SLICE_S: Final = 1.0


def _retry_flag(topic: str) -> int:
    if not topic.startswith(RETRY_PREFIX):
        return RETRY_NORMAL
    return RETRY_V2 if "+" in topic else RETRY_V1


def _offset_table(text: str) -> dict[tuple[int, int], list[int]]:
    """``flag qid a,b;flag qid c`` → {(flag, qid): [a, b], ...} (startOffsetInfo / msgOffsetInfo)."""
    table: dict[tuple[int, int], list[int]] = {}
    for part in filter(None, text.split(";")):
        fields = part.split(" ")
        if len(fields) == 3 and fields[1].lstrip("-").isdigit():
            try:
                table[(int(fields[0]), int(fields[1]))] = [int(n) for n in fields[2].split(",") if n]
            except ValueError:
                continue
    return table


class PoppingRole:
    """Mixed into :class:`~.broker.RocketMQBroker`."""

    def _targets(self, view: TopicView, queue_id: int | None) -> list[tuple[str, int]]:
        """(broker, real queue id) pairs a request for ``queue_id`` (None: any queue) goes to; -1 is "every
        queue of that broker"."""
        if queue_id is not None:
            entry = view.real(queue_id)
            return [(entry.broker, entry.queue_id)] if entry else []
        return [(b, -1) for b in sorted(view.route.brokers) if self.cluster.master(b)]

    cluster: Cluster
    advertised: tuple[str, int]
    _round_robin: itertools.count[int]

    async def _pop_once(
        self, request: PopRequest, broker: str, real_qid: int, poll_s: float
    ) -> PopResult | None:
        expression, kind = wire.filter_fields(request.message_filter)
        command = wire.command(
            RequestCode.POP_MESSAGE,
            {
                "consumerGroup": request.group,
                "topic": request.topic,
                "queueId": real_qid,
                "maxMsgNums": request.max_count,
                "invisibleTime": request.invisible_ms,
                "pollTime": int(poll_s * 1000),
                "bornTime": int(time.time() * 1000),
                "initMode": int(request.init_mode),
                "expType": kind,
                "exp": expression,
                "order": request.order,
                "bname": broker,
            },
        )
        response = await self.cluster.broker_call(
            broker, command, timeout_s=self.cluster.config.request_timeout_s + poll_s
        )
        if response.code in (
            ResponseCode.POLLING_TIMEOUT,
            ResponseCode.NO_MESSAGE,
            ResponseCode.POLLING_FULL,
        ):
            return None
        wire.check(response)
        return await self._popped(request, broker, response)

    async def _popped(self, request: PopRequest, broker: str, response: RemotingCommand) -> PopResult | None:
        ext = response.ext_fields
        pop_time, invisible = int(ext.get("popTime", 0)), int(ext.get("invisibleTime", request.invisible_ms))
        revive_qid = int(ext.get("reviveQid", 0))
        starts = _offset_table(ext.get("startOffsetInfo", ""))
        index = await self.cluster.broker_index(broker)
        popped: list[PoppedMessage] = []
        start_offsets: dict[tuple[int, int], int] = {}
        msg_offsets: dict[tuple[int, int], list[int]] = {}
        for message in wire.records(response.body):
            flag = _retry_flag(message.topic)
            view = await self.cluster.view(message.topic)
            client = to_client(message, broker, index, view, self.advertised)
            start = (starts.get((flag, message.queue_id)) or [message.queue_offset])[0]
            receipt = Receipt(
                start, pop_time, invisible, revive_qid, flag, broker, client.queue_id, message.queue_offset
            )
            popped.append(PoppedMessage(client, receipt, request.topic))
            start_offsets.setdefault((flag, client.queue_id), start)
            msg_offsets.setdefault((flag, client.queue_id), []).append(message.queue_offset)
        if not popped:
            return None
        return PopResult(
            tuple(popped),
            pop_time,
            invisible,
            revive_qid,
            int(ext.get("restNum", 0) or 0),
            start_offsets,
            msg_offsets,
        )

    async def pop(self, request: PopRequest) -> PopResult:
        view = await self.cluster.view(request.topic)
        if view is None:
            raise TopicNotFound(f"topic {request.topic} has no route in the cluster")
        targets = self._targets(view, request.queue_id)
        if not targets and request.queue_id is not None:
            raise QueueNotFound(f"queue {request.queue_id} of {request.topic} does not exist")
        if not targets:
            raise ClusterUnavailable(f"no broker of {request.topic} is reachable")
        start = next(self._round_robin) % len(targets)
        targets = targets[start:] + targets[:start]
        deadline = trio.current_time() + request.hold_s
        first = True
        while True:
            for broker, qid in targets:
                remaining = deadline - trio.current_time()
                poll = 0.0 if first else max(0.0, min(POLL_SLICE_S, remaining))
                if len(targets) == 1 and not first:
                    poll = max(0.0, remaining)
                found = await self._pop_once(request, broker, qid, poll)
                if found is not None:
                    return found
            first = False
            if trio.current_time() >= deadline:
                return PopResult((), int(time.time() * 1000), request.invisible_ms, 0, 0)

    async def _broker_receipt(self, group: str, topic: str, receipt: str) -> tuple[Receipt, str, int, str]:
        """The receipt, the topic its message is in, the real queue id and the broker's extraInfo."""
        parsed = Receipt.decode(receipt)
        real_topic = parsed.real_topic(group, topic)
        view = await self.cluster.view(real_topic)
        entry = view.real(parsed.queue_id) if view is not None else None
        if entry is None or entry.broker != parsed.broker_name:
            raise ReceiptExpired(f"receipt names queue {parsed.queue_id} of {real_topic}, unknown here")
        broker_form = dataclasses.replace(parsed, queue_id=entry.queue_id).encode()
        return parsed, real_topic, entry.queue_id, broker_form

    async def _on_receipt(
        self, code: int, group: str, topic: str, receipt: str, **extra: object
    ) -> tuple[Receipt, dict[str, str]]:
        """``code`` (ACK or CHANGE_INVISIBLE) for the message ``receipt`` names, at its broker; returns the
        parsed receipt and the answer's header. A receipt the broker no longer holds is ReceiptExpired."""
        parsed, real_topic, real_qid, extra_info = await self._broker_receipt(group, topic, receipt)
        command = wire.command(
            code,
            {
                "consumerGroup": group,
                "topic": real_topic,
                "queueId": real_qid,
                "extraInfo": extra_info,
                "offset": parsed.offset,
                "bname": parsed.broker_name,
                **extra,
            },
        )
        response = await self.cluster.broker_call(parsed.broker_name, command)
        if response.code == ResponseCode.NO_MESSAGE:
            raise ReceiptExpired(response.remark or "the broker no longer holds this receipt")
        return parsed, wire.check(response).ext_fields

    async def ack(self, group: str, topic: str, receipt: str) -> AckOutcome:
        await self._on_receipt(RequestCode.ACK_MESSAGE, group, topic, receipt)
        return AckOutcome.ACKED

    async def ack_many(
        self, group: str, topic: str, receipts: Sequence[str]
    ) -> list[AckOutcome | BackendError]:
        outcomes: list[AckOutcome | BackendError] = []
        for receipt in receipts:
            try:
                outcomes.append(await self.ack(group, topic, receipt))
            except BackendError as exc:
                outcomes.append(exc)
        return outcomes

    async def change_invisible(self, group: str, topic: str, receipt: str, invisible_ms: int) -> str:
        parsed, ext = await self._on_receipt(
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME, group, topic, receipt, invisibleTime=invisible_ms
        )
        return Receipt(
            parsed.offset,
            int(ext.get("popTime", 0)),
            int(ext.get("invisibleTime", invisible_ms)),
            int(ext.get("reviveQid", parsed.revive_qid)),
            parsed.retry_flag,
            parsed.broker_name,
            parsed.queue_id,
            parsed.offset,
        ).encode()

    async def forward_to_dlq(self, group: str, topic: str, receipt: str):  # type: ignore[no-untyped-def]
        parsed, real_topic, real_qid, _ = await self._broker_receipt(group, topic, receipt)
        pull = wire.command(
            RequestCode.PULL_MESSAGE,
            {
                "consumerGroup": group,
                "topic": real_topic,
                "queueId": real_qid,
                "queueOffset": parsed.offset,
                "maxMsgNums": 1,
                "sysFlag": 4,
                "commitOffset": 0,
                "suspendTimeoutMillis": 0,
                "subscription": "*",
                "subVersion": 0,
                "expressionType": "TAG",
                "bname": parsed.broker_name,
            },
        )
        response = await self.cluster.broker_call(parsed.broker_name, pull)
        found = wire.records(response.body) if response.code == ResponseCode.SUCCESS else []
        if not found or found[0].queue_offset != parsed.offset:
            raise MessageNotFound(f"message {parsed.offset} of {real_topic} is gone")
        message = await self._client(found[0], parsed.broker_name)  # type: ignore[attr-defined]
        outcome = await self.send_back(group, message, delay_level=-1)  # type: ignore[attr-defined]
        await self.ack(group, topic, receipt)
        return outcome.result

    async def peek(
        self,
        group: str,
        topic: str,
        queue_id: int | None,
        max_count: int,
        *,
        message_filter: FilterExpression | None = None,
    ) -> list[StoredMessage]:
        view = await self.cluster.view(topic)
        if view is None:
            raise TopicNotFound(f"topic {topic} has no route in the cluster")
        targets = self._targets(view, queue_id)
        tags = (
            TagFilter.parse(message_filter.expression)
            if message_filter and message_filter.kind == "TAG"
            else None
        )
        found: list[StoredMessage] = []
        for broker, qid in targets:
            command = wire.command(
                RequestCode.PEEK_MESSAGE,
                {
                    "consumerGroup": group,
                    "topic": topic,
                    "queueId": qid,
                    "maxMsgNums": max_count - len(found),
                    "bname": broker,
                },
            )
            try:
                response = await self.cluster.broker_call(broker, command)
            except ClusterUnavailable:
                continue
            if response.code != ResponseCode.SUCCESS:
                continue
            index = await self.cluster.broker_index(broker)
            for message in wire.records(response.body):
                if tags is None or tags.matches(message.tags):
                    found.append(to_client(message, broker, index, view, self.advertised))
            if len(found) >= max_count:
                break
        return found[:max_count]

    async def has_message(self, group: str, topic: str, queue_id: int | None) -> bool:
        view = await self.cluster.view(topic)
        if view is None:
            return False
        targets = self._targets(view, queue_id)
        for broker, qid in targets:
            command = wire.command(
                RequestCode.NOTIFICATION,
                {
                    "consumerGroup": group,
                    "topic": topic,
                    "queueId": qid,
                    "pollTime": 0,
                    "bornTime": int(time.time() * 1000),
                    "order": False,
                    "bname": broker,
                },
            )
            try:
                response = await self.cluster.broker_call(broker, command)
            except (ClusterUnavailable, BrokerRefused):
                continue
            if (
                response.code == ResponseCode.SUCCESS
                and response.ext_fields.get("hasMsg", "").lower() == "true"
            ):
                return True
        return False
