"""
mqproxy.backends.rocketmq.consume
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

The :class:`~mqproxy.facade.api.Consuming` and :class:`~mqproxy.facade.api.Offsets` roles against a
RocketMQ cluster: every call names a virtual queue, which :meth:`ConsumingRole._real` turns into the
real broker and queue; offsets are the real queue's (no translation), committed offsets live on the
broker that owns the queue, so any node reads what another committed.

Contracts:

* A pull always carries its subscription (``FLAG_SUBSCRIPTION``): the broker filters by it without the
  group having registered that subscription on this connection. Long polls are the broker's
  (``FLAG_SUSPEND``); the request timeout covers the hold.
* A queue whose broker is gone answers as an unreachable cluster (:class:`ClusterUnavailable`).
"""

from __future__ import annotations

import time
from typing import Final

import trio

from mqproxy.backends.rocketmq import wire
from mqproxy.backends.rocketmq.cluster import Cluster, TopicView
from mqproxy.backends.rocketmq.messages import to_client
from mqproxy.backends.rocketmq.topology import loads_java_json
from mqproxy.backends.rocketmq.vqueues import RealQueue, unpack_offset
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.facade.api import MessageQuery, PullRequest, QueueSpan
from mqproxy.facade.types import GroupConfig, SendBackResult
from mqproxy.model.errors import ClusterUnavailable, QueueNotFound, TopicNotFound
from mqproxy.model.topics import DLQ_PREFIX, RETRY_PREFIX
from mqproxy.model.types import ConsumerOffset, PullResult, PullStatus, SendResult, StoredMessage

__all__ = ["ConsumingRole"]

_PULL_STATUS: Final = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}
_FLAG_COMMIT: Final = 0x1
_FLAG_SUSPEND: Final = 0x2
_FLAG_SUBSCRIPTION: Final = 0x4
#: Longest wait between two max-offset looks of :meth:`ConsumingRole.wait_for_message`.
_WAIT_POLL_S: Final = 0.2


class ConsumingRole:
    """Mixed into :class:`~.broker.RocketMQBroker`."""

    cluster: Cluster
    advertised: tuple[str, int]

    async def _real(self, topic: str, queue_id: int) -> tuple[TopicView, RealQueue]:
        view = await self.cluster.view(topic)
        if view is None:
            raise TopicNotFound(f"topic {topic} has no route in the cluster")
        entry = view.real(queue_id)
        if entry is None:
            view = await self.cluster.view(topic, fresh=True)
            entry = view.real(queue_id) if view is not None else None
        if view is None or entry is None:
            raise QueueNotFound(f"queue {queue_id} of {topic} does not exist")
        return view, entry

    async def _client(self, message: StoredMessage, broker: str) -> StoredMessage:
        view = self.cluster.cached(message.topic)
        return to_client(message, broker, await self.cluster.broker_index(broker), view, self.advertised)

    # --- pull -----------------------------------------------------------------------------------

    async def pull(self, request: PullRequest) -> PullResult:
        view, entry = await self._real(request.topic, request.queue_id)
        expression, kind = wire.filter_fields(request.message_filter)
        flags = _FLAG_SUBSCRIPTION
        if request.hold_s > 0:
            flags |= _FLAG_SUSPEND
        if request.commit_offset >= 0:
            flags |= _FLAG_COMMIT
        hold_ms = int(request.hold_s * 1000)
        command = wire.command(
            RequestCode.PULL_MESSAGE,
            {
                "consumerGroup": request.group,
                "topic": request.topic,
                "queueId": entry.queue_id,
                "queueOffset": request.offset,
                "maxMsgNums": request.max_count,
                "sysFlag": flags,
                "commitOffset": max(request.commit_offset, 0),
                "suspendTimeoutMillis": hold_ms,
                "subscription": expression,
                "subVersion": int(time.time() * 1000),
                "expressionType": kind,
                "maxMsgBytes": request.max_bytes,
                "bname": entry.broker,
            },
        )
        timeout = self.cluster.config.request_timeout_s + request.hold_s
        response = await self.cluster.broker_call(entry.broker, command, timeout_s=timeout)
        status = _PULL_STATUS.get(response.code)  # type: ignore[call-overload]
        if status is None:
            wire.check(response)
            status = PullStatus.NO_NEW_MSG
        ext = response.ext_fields
        messages = ()
        if status is PullStatus.FOUND:
            index = await self.cluster.broker_index(entry.broker)
            messages = tuple(
                to_client(m, entry.broker, index, view, self.advertised) for m in wire.records(response.body)
            )
        return PullResult(
            status,
            messages,
            int(ext.get("nextBeginOffset", request.offset)),
            int(ext.get("minOffset", 0)),
            int(ext.get("maxOffset", 0)),
        )

    async def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        with trio.move_on_after(timeout_s):
            while True:
                if await self.max_offset(topic, queue_id) > offset:
                    return True
                await trio.sleep(_WAIT_POLL_S)
        return False

    # --- lookups --------------------------------------------------------------------------------

    async def get_message(self, commitlog_offset: int) -> StoredMessage | None:
        index, real = unpack_offset(commitlog_offset)
        name = self.cluster.index.name(index)
        if name is None:
            return None
        request = wire.command(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": real})
        response = await self.cluster.broker_call(name, request)
        if response.code != ResponseCode.SUCCESS:
            return None
        found = wire.records(response.body)
        return await self._client(found[0], name) if found else None

    async def query_messages(self, query: MessageQuery) -> list[StoredMessage]:
        found: list[StoredMessage] = []
        for broker in self.cluster.masters():
            ext: dict[str, object] = {
                "topic": query.topic,
                "key": query.key,
                "maxNum": query.max_count,
                "beginTimestamp": query.begin_ms,
                "endTimestamp": query.end_ms,
            }
            if query.unique_id:
                ext["_UNIQUE_KEY_QUERY"] = True
            response = await self.cluster.broker_call(broker, wire.command(RequestCode.QUERY_MESSAGE, ext))
            if response.code == ResponseCode.SUCCESS:
                for message in wire.records(response.body):
                    found.append(await self._client(message, broker))
        found.sort(key=lambda m: m.store_timestamp_ms, reverse=True)
        return found[: query.max_count]

    async def send_back(
        self,
        group: str,
        message: StoredMessage,
        *,
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        origin_msg_id: str = "",
    ) -> SendBackResult:
        index, real = unpack_offset(message.commitlog_offset)
        broker = self.cluster.broker_named_by(index)
        limit = self.max_reconsume_times if max_reconsume_times is None else max_reconsume_times  # type: ignore[attr-defined]
        request = wire.command(
            RequestCode.CONSUMER_SEND_MSG_BACK,
            {
                "offset": real,
                "group": group,
                "delayLevel": delay_level,
                "originMsgId": origin_msg_id or None,
                "originTopic": message.topic,
                "maxReconsumeTimes": max_reconsume_times,
                "bname": broker,
            },
        )
        wire.check(await self.cluster.broker_call(broker, request))
        dead = delay_level < 0 or message.reconsume_times >= limit
        level = 0 if dead else (delay_level if delay_level > 0 else 3 + message.reconsume_times)
        topic = (DLQ_PREFIX if dead else RETRY_PREFIX) + group
        return SendBackResult(dead, level, SendResult(topic, 0, -1, -1, int(time.time() * 1000)))

    # --- offsets --------------------------------------------------------------------------------

    async def _queue_number(self, code: int, topic: str, queue_id: int, key: str, **extra: object) -> int:
        _, entry = await self._real(topic, queue_id)
        request = wire.command(
            code, {"topic": topic, "queueId": entry.queue_id, "bname": entry.broker, **extra}
        )
        response = wire.check(await self.cluster.broker_call(entry.broker, request))
        return int(response.ext_fields.get(key, "0") or 0)

    async def span(self, topic: str, queue_id: int) -> QueueSpan:
        return QueueSpan(await self.min_offset(topic, queue_id), await self.max_offset(topic, queue_id))

    async def min_offset(self, topic: str, queue_id: int) -> int:
        return await self._queue_number(RequestCode.GET_MIN_OFFSET, topic, queue_id, "offset")

    async def max_offset(self, topic: str, queue_id: int) -> int:
        return await self._queue_number(RequestCode.GET_MAX_OFFSET, topic, queue_id, "offset")

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return await self._queue_number(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic, queue_id, "offset", timestamp=timestamp_ms
        )

    async def earliest_store_time(self, topic: str, queue_id: int) -> int:
        try:
            return await self._queue_number(
                RequestCode.GET_EARLIEST_MSG_STORETIME, topic, queue_id, "timestamp"
            )
        except ClusterUnavailable:
            raise
        except Exception:
            return -1

    async def query_consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        _, entry = await self._real(topic, queue_id)
        request = wire.command(
            RequestCode.QUERY_CONSUMER_OFFSET,
            {
                "consumerGroup": group,
                "topic": topic,
                "queueId": entry.queue_id,
                "setZeroIfNotFound": False,
                "bname": entry.broker,
            },
        )
        response = await self.cluster.broker_call(entry.broker, request)
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        wire.check(response)
        return int(response.ext_fields.get("offset", "0") or 0)

    async def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        _, entry = await self._real(topic, queue_id)
        request = wire.command(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {
                "consumerGroup": group,
                "topic": topic,
                "queueId": entry.queue_id,
                "commitOffset": offset,
                "bname": entry.broker,
            },
        )
        response = await self.cluster.broker_call(entry.broker, request)
        if (
            response.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
            and self.cluster.config.auto_create_topics
        ):
            # a group that has not heartbeated yet: create it as the broker's auto-creation would
            await self.put_group_config(self.group_config(group) or GroupConfig(group))  # type: ignore[attr-defined]
            response = await self.cluster.broker_call(entry.broker, request)
        wire.check(response)

    async def consumer_offsets(self) -> list[ConsumerOffset]:
        """Committed offsets of every group on every reachable broker, by virtual queue."""
        found: list[ConsumerOffset] = []
        for broker in self.cluster.masters():
            try:
                response = await self.cluster.broker_call(
                    broker, wire.command(RequestCode.GET_ALL_CONSUMER_OFFSET)
                )
            except ClusterUnavailable:
                continue
            if response.code != ResponseCode.SUCCESS or not response.body:
                continue
            table = loads_java_json(response.body).get("offsetTable") or {}
            for key, queues in table.items():
                topic, _, group = str(key).partition("@")
                if topic.startswith(("rmq_sys_", "RMQ_SYS_", "SCHEDULE_TOPIC", "TRANS_CHECK")) or not group:
                    continue
                view = await self.cluster.view(topic)
                for qid, offset in (queues or {}).items():
                    virtual = view.queues.virtual(broker, int(qid)) if view is not None else None
                    if virtual is not None:
                        found.append(ConsumerOffset(group, topic, virtual, int(offset)))
        return found
