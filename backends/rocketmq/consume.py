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
* An LMQ name (``%LMQ%``) has one queue id per indexed broker (:mod:`.lmq`): queue ``q`` is the real
  queue 0 of the broker at index ``q + 1``, for pulls, offsets, consumer offsets and waits alike; a queue
  id past the index does not exist. A pulled message keeps its own topic's coordinates. A consumer group
  a broker lacks when an LMQ offset is committed there (the MQTT gateway's ``%MQTT%<client id>``) is
  created on that broker only.
* A pull without a consumer group (the MQTT gateway's reads) goes under :data:`.lmq.READER_GROUP`.
* :meth:`ConsumingRole.wait_for_message` is the broker's long poll (PULL_MESSAGE with ``FLAG_SUSPEND``, one
  message, no commit, :data:`.lmq.READER_GROUP`), held up to the timeout: the broker answers as soon as the
  queue holds a message at or after the offset, including one its multi-dispatch put in an LMQ.
"""

from __future__ import annotations

import time
from typing import Final

from mqproxy.backends.rocketmq import wire
from mqproxy.backends.rocketmq.cluster import Cluster, TopicView
from mqproxy.backends.rocketmq.lmq import READER_GROUP, wait_answer
from mqproxy.backends.rocketmq.messages import to_client
from mqproxy.backends.rocketmq.topology import loads_java_json
from mqproxy.backends.rocketmq.vqueues import RealQueue, pack_offset, unpack_offset
from mqproxy.codecs.record_patch import RecordBody, relocate_records
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.facade.api import MessageQuery, PullRequest, QueueSpan
from mqproxy.facade.types import GroupConfig, SendBackResult
from mqproxy.model.errors import BrokerRefused, ClusterUnavailable, QueueNotFound, TopicNotFound
from mqproxy.model.topics import DLQ_PREFIX, LMQ_QUEUE_ID, RETRY_PREFIX, is_lmq
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

    async def _target(self, topic: str, queue_id: int) -> tuple[str, int]:
        """The broker and real queue id behind ``queue_id`` of ``topic`` (an LMQ: the indexed broker's 0)."""
        if is_lmq(topic):
            broker = await self.cluster.lmq_queue_broker(queue_id)
            if broker is None:
                raise QueueNotFound(f"light message queue {topic} has no queue {queue_id} (no such broker)")
            return broker, LMQ_QUEUE_ID
        _, entry = await self._real(topic, queue_id)
        return entry.broker, entry.queue_id

    async def _client(self, message: StoredMessage, broker: str) -> StoredMessage:
        view = self.cluster.cached(message.topic)
        return to_client(message, broker, await self.cluster.broker_index(broker), view, self.advertised)

    async def _own_view(self, topic: str) -> TopicView | None:
        """The view of a pulled message's topic (an LMQ holds other topics' messages)."""
        found = self.cluster.cached(topic)
        if found is None and not is_lmq(topic):
            try:
                found = await self.cluster.view(topic)
            except BrokerRefused:
                found = None
        return found

    # --- pull -----------------------------------------------------------------------------------

    def _pull_command(
        self, group: str, topic: str, broker: str, queue_id: int, offset: int, max_count: int, **more: object
    ) -> RemotingCommand:
        return wire.command(
            RequestCode.PULL_MESSAGE,
            {
                "consumerGroup": group or READER_GROUP,
                "topic": topic,
                "queueId": queue_id,
                "queueOffset": offset,
                "maxMsgNums": max_count,
                "subVersion": int(time.time() * 1000),
                "bname": broker,
                **more,
            },
        )

    async def pull(self, request: PullRequest) -> PullResult:
        broker, queue_id = await self._target(request.topic, request.queue_id)
        expression, kind = wire.filter_fields(request.message_filter)
        flags = _FLAG_SUBSCRIPTION
        if request.hold_s > 0:
            flags |= _FLAG_SUSPEND
        if request.commit_offset >= 0:
            flags |= _FLAG_COMMIT
        command = self._pull_command(
            request.group,
            request.topic,
            broker,
            queue_id,
            request.offset,
            request.max_count,
            sysFlag=flags,
            commitOffset=max(request.commit_offset, 0),
            suspendTimeoutMillis=int(request.hold_s * 1000),
            subscription=expression,
            expressionType=kind,
            maxMsgBytes=request.max_bytes,
        )
        timeout = self.cluster.config.request_timeout_s + request.hold_s
        response = await self.cluster.broker_call(broker, command, timeout_s=timeout)
        status = _PULL_STATUS.get(response.code)  # type: ignore[call-overload]
        if status is None:
            wire.check(response)
            status = PullStatus.NO_NEW_MSG
        ext = response.ext_fields
        next_offset = int(ext.get("nextBeginOffset", request.offset))
        min_offset, max_offset = int(ext.get("minOffset", 0)), int(ext.get("maxOffset", 0))
        messages: tuple[StoredMessage, ...] = ()
        if status is PullStatus.FOUND:
            index = await self.cluster.broker_index(broker)
            if not is_lmq(request.topic):
                view = await self._own_view(request.topic)
                passed = self._relocated(response.body, request.topic, broker, index, view)
                if passed is not None:
                    return PullResult.of_records(status, passed, next_offset, min_offset, max_offset)
            found = wire.records(response.body)
            views = {t: await self._own_view(t) for t in {m.topic for m in found}}
            messages = tuple(to_client(m, broker, index, views[m.topic], self.advertised) for m in found)
        return PullResult(status, messages, next_offset, min_offset, max_offset)

    def _relocated(
        self, body: bytes, topic: str, broker: str, index: int, view: TopicView | None
    ) -> RecordBody | None:
        """The records pulled from ``topic`` (whose view is ``view``) as :func:`to_client` presents
        them, rewritten in place (:mod:`mqproxy.codecs.record_patch`); None if a record needs the
        decoding path (another topic's record, or a form a re-encoding changes)."""

        seen: dict[int, int] = {}  # a pull's records are all of one queue

        def virtual(record_topic: str, real: int) -> int | None:
            if record_topic != topic:
                return None
            known = seen.get(real)
            if known is None:
                found = view.queues.virtual(broker, real) if view is not None else None
                known = seen[real] = real if found is None else found
            return known

        data = relocate_records(
            body,
            queue_id=virtual,
            commitlog_offset=lambda real: pack_offset(index, real),
            store_host=self.advertised,
        )
        return None if data is None else RecordBody(data)

    async def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        broker, real_queue = await self._target(topic, queue_id)
        if timeout_s <= 0:
            return await self.max_offset(topic, queue_id) > offset
        command = self._pull_command(
            READER_GROUP,
            topic,
            broker,
            real_queue,
            offset,
            1,
            sysFlag=_FLAG_SUBSCRIPTION | _FLAG_SUSPEND,
            commitOffset=0,
            suspendTimeoutMillis=int(timeout_s * 1000),
            subscription="*",
            expressionType="TAG",
        )
        for _ in range(2):
            response = await self.cluster.broker_hold(broker, command, timeout_s)
            if response is None:
                return False  # the hold passed (the broker checks held pulls' deadlines every 5 s)
            if response.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST:
                await self._create_group(broker, READER_GROUP)
                continue
            answer = wait_answer(response.code)
            if answer is None:
                wire.check(response)
            return bool(answer)
        return False

    async def _create_group(self, broker: str, group: str) -> None:
        """Create ``group`` on ``broker`` only (internal and LMQ-session groups)."""
        request = wire.command(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=wire.group_body(group))
        wire.check(await self.cluster.broker_call(broker, request))

    # --- lookups --------------------------------------------------------------------------------

    async def get_message(self, commitlog_offset: int, *, topic: str = "") -> StoredMessage | None:
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
        broker, real_queue = await self._target(topic, queue_id)
        request = wire.command(code, {"topic": topic, "queueId": real_queue, "bname": broker, **extra})
        response = wire.check(await self.cluster.broker_call(broker, request))
        return int(response.ext_fields.get(key, "0") or 0)

    async def span(self, topic: str, queue_id: int) -> QueueSpan:
        return QueueSpan(await self.min_offset(topic, queue_id), await self.max_offset(topic, queue_id))

    async def min_offset(self, topic: str, queue_id: int) -> int:
        return await self._queue_number(RequestCode.GET_MIN_OFFSET, topic, queue_id, "offset")

    async def max_offset(self, topic: str, queue_id: int) -> int:
        return await self._queue_number(RequestCode.GET_MAX_OFFSET, topic, queue_id, "offset")

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The broker's answer with the lower boundary: the first offset stored at or after the time, the
        max offset when none was (clamped to the queue's min and max; 0 for an empty queue)."""
        return await self._queue_number(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            topic,
            queue_id,
            "offset",
            timestamp=timestamp_ms,
            boundaryType="lower",
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
        broker, real_queue = await self._target(topic, queue_id)
        request = wire.command(
            RequestCode.QUERY_CONSUMER_OFFSET,
            {
                "consumerGroup": group,
                "topic": topic,
                "queueId": real_queue,
                "setZeroIfNotFound": False,
                "bname": broker,
            },
        )
        response = await self.cluster.broker_call(broker, request)
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        wire.check(response)
        return int(response.ext_fields.get("offset", "0") or 0)

    async def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        broker, real_queue = await self._target(topic, queue_id)
        request = wire.command(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {
                "consumerGroup": group,
                "topic": topic,
                "queueId": real_queue,
                "commitOffset": offset,
                "bname": broker,
            },
        )
        response = await self.cluster.broker_call(broker, request)
        if response.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST:
            if is_lmq(topic):  # the MQTT gateway's session groups: on the LMQ broker only
                await self._create_group(broker, group)
                response = await self.cluster.broker_call(broker, request)
            elif self.cluster.config.auto_create_topics:
                # a group that has not heartbeated yet: create it as the broker's auto-creation would
                await self.put_group_config(self.group_config(group) or GroupConfig(group))  # type: ignore[attr-defined]
                response = await self.cluster.broker_call(broker, request)
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
                if is_lmq(topic):  # the broker's own queue id of the LMQ (no route, no numbering)
                    lmq_queue = self.cluster.lmq_queue_of(broker)
                    if lmq_queue is not None:
                        found.extend(
                            ConsumerOffset(group, topic, lmq_queue, int(o)) for o in (queues or {}).values()
                        )
                    continue
                view = await self.cluster.view(topic)
                for qid, offset in (queues or {}).items():
                    virtual = view.queues.virtual(broker, int(qid)) if view is not None else None
                    if virtual is not None:
                        found.append(ConsumerOffset(group, topic, virtual, int(offset)))
        return found
