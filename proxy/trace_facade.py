"""
mqproxy.trace_facade
~~~~~~~~~~~~~~~~~~~~

:class:`TracingBroker`: a :class:`~mqproxy.facade.api.BrokerFacade` around another that emits message-trace
records (:mod:`mqproxy.codecs.rocketmq_trace`) for what passes through it, for every protocol at once:

* ``Pub`` for each stored message (``send``, ``send_batch``: remoting, gRPC and MQTT publishes). The group
  is the producer group, or the MQTT client id for an MQTT publish; the msgId is the message's
  ``UNIQ_KEY``. A message sent without one (an MQTT publish) is given one first, in the Java client's
  layout, so its id is the same wherever it is stored (embedded or a cluster broker) and consumers see it.
* ``SubBefore`` for each message a consumer group is handed (``pull``, ``pop``; one request id per batch).
* ``SubAfter`` when a consumer acknowledges: ``ack`` / ``ack_many`` of a popped message (success; a
  ``change_invisible`` keeps it pending under its new handle), and for pulls the group's committed
  offset passing the message (success; cost = time since delivery). A pending delivery is remembered
  in bounded tables (:data:`MAX_PENDING_RECEIPTS`, :data:`MAX_PENDING_PER_QUEUE` x
  :data:`MAX_PENDING_QUEUES`); what falls out of them simply gets no ``SubAfter``.

* ``EndTransaction`` when a producer (or its check-back answer) commits or rolls back a half message this
  process stored (remembered at its ``send``, up to :data:`MAX_PENDING_HALVES`; a half message stored
  elsewhere gets none): the message's id, topic, tags and keys, with the transaction id the client gave.

Nothing is traced for the trace topic itself, retry and dead-letter topics, or pulls without a group (the
MQTT gateway's own reads: MQTT deliveries are traced by the gateway with the client id as the group).
Tracing never changes an answer or raises: emitting only queues a record
(:class:`~mqproxy.codecs.rocketmq_trace.TraceSink`).
"""

from __future__ import annotations

import os
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final

from mqproxy.codecs.rocketmq_trace import (
    CONTEXT_FAILED,
    CONTEXT_SUCCESS,
    EndTransactionRecord,
    MessageType,
    PubRecord,
    SubAfterRecord,
    SubBeforeRecord,
    TraceSink,
    message_id,
)
from mqproxy.facade.api import (
    BrokerFacade,
    EndTransaction,
    PopRequest,
    PullRequest,
    SendOutcome,
    SendRequest,
)
from mqproxy.facade.types import AckOutcome, Resolution
from mqproxy.model.errors import BackendError
from mqproxy.model.ids import new_uniq_key
from mqproxy.model.receipts import PopResult
from mqproxy.model.types import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    Message,
    PullResult,
    PullStatus,
    SendResult,
    StoredMessage,
)

__all__ = ["TracingBroker", "traced_topic"]

MAX_PENDING_RECEIPTS: Final = 65_536
MAX_PENDING_HALVES: Final = 65_536
MAX_PENDING_QUEUES: Final = 4096
MAX_PENDING_PER_QUEUE: Final = 1024
#: Properties that make a message a transactional half message or a timed one.
_TRANSACTION = "TRAN_MSG"
_TRANSACTION_ID = "__transactionId__"
_STATES = {Resolution.COMMIT: "COMMIT_MESSAGE", Resolution.ROLLBACK: "ROLLBACK_MESSAGE"}
_TIMER_PROPERTIES = ("TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")
#: The MQTT gateway's own bookkeeping topics (session snapshots, cluster retained refresh).
_INTERNAL_TOPICS = frozenset({"MQTT_SESSION_STATE", "MQTT_RETAINED_REFRESH"})
_INTERNAL_PREFIXES = ("%RETRY%", "%DLQ%", "rmq_sys_", "RMQ_SYS_")
#: The MQTT client id property (:data:`mqproxy.mqtt.mapping.PROPERTY_MQTT_CLIENT`).
_MQTT_CLIENT = "MQTT_CLIENT_ID"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def traced_topic(topic: str, trace_topic: str) -> bool:
    """Whether messages of ``topic`` are traced: not the trace topic, retry or dead-letter topics."""
    return topic != trace_topic and topic not in _INTERNAL_TOPICS and not topic.startswith(_INTERNAL_PREFIXES)


def _msg_type(message: Message) -> MessageType:
    props = message.properties
    if props.get(_TRANSACTION) == "true":
        return MessageType.TRANS_HALF
    if props.get(PROPERTY_DELAY_LEVEL, "0") not in ("", "0") or any(p in props for p in _TIMER_PROPERTIES):
        return MessageType.DELAY
    return MessageType.NORMAL


_HalfKey = tuple[str, int | str]


class _Pending:
    __slots__ = ("delivered_ms", "keys", "msg_id", "offset", "request_id")

    def __init__(self, msg_id: str, keys: str, request_id: str, delivered_ms: int, offset: int) -> None:
        self.msg_id, self.keys, self.request_id = msg_id, keys, request_id
        self.delivered_ms, self.offset = delivered_ms, offset


def _receipt_key(group: str, receipt: str) -> tuple[str, str]:
    return group, " ".join(receipt.split(" ")[:8])


class TracingBroker:
    """``inner`` with trace records emitted to ``sink`` (see the module docstring); every other attribute
    is ``inner``'s. ``store_host`` names this proxy's store in offset message ids (embedded backend)."""

    def __init__(
        self, inner: BrokerFacade, sink: TraceSink, trace_topic: str, store_host: tuple[str, int]
    ) -> None:
        self._inner = inner
        self._sink = sink
        self._trace_topic = trace_topic
        self._store_host = store_host
        self._store_host_text = f"{store_host[0]}:{store_host[1]}"
        self._counter = 0
        self._receipts: OrderedDict[tuple[str, str], _Pending] = OrderedDict()
        self._pulled: OrderedDict[tuple[str, str, int], deque[_Pending]] = OrderedDict()
        #: Half messages by commit-log offset and by transaction ref / msgId: the record to end them with.
        self._halves: OrderedDict[_HalfKey, tuple[EndTransactionRecord, tuple[_HalfKey, ...]]] = OrderedDict()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if callable(value):
            setattr(self, name, value)  # a bound method: found in the instance dict from now on
        return value

    # --- producing ---------------------------------------------------------------------------------
    def _pub(self, message: Message, group: str, result: SendResult | None, cost_ms: int) -> None:
        if not traced_topic(message.topic, self._trace_topic):
            return
        props = message.properties
        offset = result.commitlog_offset if result is not None else -1
        msg_id = message_id(props, self._store_host, offset)
        self._sink.emit(
            PubRecord(
                timestamp_ms=now_ms(),
                group=group or props.get(_MQTT_CLIENT, ""),
                topic=message.topic,
                msg_id=msg_id,
                tags=props.get(PROPERTY_TAGS, ""),
                keys=props.get(PROPERTY_KEYS, ""),
                store_host=self._store_host_text,
                body_length=len(message.body),
                cost_ms=cost_ms,
                msg_type=_msg_type(message),
                offset_msg_id=message_id({}, self._store_host, offset),
                success=result is not None,
            )
        )

    def _identify(self, message: Message) -> None:
        if PROPERTY_UNIQ_KEY not in message.properties:
            self._counter += 1
            message.properties[PROPERTY_UNIQ_KEY] = new_uniq_key(
                self._store_host[0], os.getpid(), self._counter, now_ms()
            )

    async def send(self, request: SendRequest) -> SendOutcome:
        if traced_topic(request.message.topic, self._trace_topic):
            self._identify(request.message)
        start = time.monotonic()
        try:
            outcome = await self._inner.send(request)
        except BackendError:
            self._pub(request.message, request.producer_group, None, _elapsed_ms(start))
            raise
        self._pub(request.message, request.producer_group, outcome.result, _elapsed_ms(start))
        if outcome.parked == "half" and traced_topic(request.message.topic, self._trace_topic):
            self._remember_half(request, outcome)
        return outcome

    def _remember_half(self, request: SendRequest, outcome: SendOutcome) -> None:
        message, result = request.message, outcome.result
        props = message.properties
        msg_id = message_id(props, self._store_host, result.commitlog_offset)
        half = EndTransactionRecord(
            timestamp_ms=0,
            group=request.producer_group,
            topic=message.topic,
            msg_id=msg_id,
            transaction_id=props.get(_TRANSACTION_ID) or msg_id,
            state="UNKNOW",
            tags=props.get(PROPERTY_TAGS, ""),
            keys=props.get(PROPERTY_KEYS, ""),
            store_host=self._store_host_text,
        )
        keys: tuple[_HalfKey, ...] = (
            ("offset", result.commitlog_offset),
            ("tx", outcome.transaction_ref or msg_id),
        )
        for key in keys:
            self._halves[key] = (half, keys)
        while len(self._halves) > 2 * MAX_PENDING_HALVES:
            self._halves.popitem(last=False)

    async def end_transaction(self, end: EndTransaction) -> SendResult | None:
        result = await self._inner.end_transaction(end)
        state = _STATES.get(end.resolution)
        key = (
            ("offset", end.commitlog_offset)
            if end.commitlog_offset is not None
            else ("tx", end.transaction_id)
        )
        found = self._halves.get(key)
        if state is not None and found is not None:
            half, keys = found
            for known in keys:
                self._halves.pop(known, None)
            self._sink.emit(replace(half, timestamp_ms=now_ms(), state=state, from_check=end.from_check))
        return result

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        for message in messages:
            if traced_topic(message.topic, self._trace_topic):
                self._identify(message)
        start = time.monotonic()
        results = await self._inner.send_batch(messages)
        cost = _elapsed_ms(start)
        for message, result in zip(messages, results, strict=False):
            self._pub(message, "", result, cost)
        return results

    # --- consuming ---------------------------------------------------------------------------------
    def _sub_before(self, group: str, messages: Sequence[StoredMessage]) -> list[_Pending]:
        request_id, ts = uuid.uuid4().hex.upper(), now_ms()
        out = []
        for message in messages:
            record = SubBeforeRecord.of(message, group, request_id, ts)
            self._sink.emit(record)
            out.append(_Pending(record.msg_id, record.keys, request_id, ts, message.queue_offset))
        return out

    def _sub_after(self, group: str, pending: _Pending, success: bool) -> None:
        ts = now_ms()
        self._sink.emit(
            SubAfterRecord(
                request_id=pending.request_id,
                msg_id=pending.msg_id,
                cost_ms=max(0, ts - pending.delivered_ms),
                success=success,
                keys=pending.keys,
                context_code=CONTEXT_SUCCESS if success else CONTEXT_FAILED,
                timestamp_ms=ts,
                group=group,
            )
        )

    def _settle_pulled(self, group: str, topic: str, queue_id: int, committed: int) -> None:
        waiting = self._pulled.get((group, topic, queue_id))
        while waiting and waiting[0].offset < committed:
            self._sub_after(group, waiting.popleft(), True)

    async def pull(self, request: PullRequest) -> PullResult:
        result = await self._inner.pull(request)
        if request.group and traced_topic(request.topic, self._trace_topic):
            if request.commit_offset >= 0:
                self._settle_pulled(request.group, request.topic, request.queue_id, request.commit_offset)
            if result.status is PullStatus.FOUND:
                key = (request.group, request.topic, request.queue_id)
                waiting = self._pulled.get(key)
                if waiting is None:
                    waiting = self._pulled[key] = deque(maxlen=MAX_PENDING_PER_QUEUE)
                    if len(self._pulled) > MAX_PENDING_QUEUES:
                        self._pulled.popitem(last=False)
                known = waiting[-1].offset if waiting else -1
                fresh = [m for m in result.messages if m.queue_offset > known]  # a re-pull is not new
                waiting.extend(self._sub_before(request.group, fresh))
        return result

    async def commit_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        await self._inner.commit_consumer_offset(group, topic, queue_id, offset)
        self._settle_pulled(group, topic, queue_id, offset)

    async def pop(self, request: PopRequest) -> PopResult:
        result = await self._inner.pop(request)
        if result.messages and traced_topic(request.topic, self._trace_topic):
            popped = [p.message for p in result.messages]
            for item, pending in zip(result.messages, self._sub_before(request.group, popped), strict=True):
                self._receipts[_receipt_key(request.group, item.receipt.encode())] = pending
            while len(self._receipts) > MAX_PENDING_RECEIPTS:
                self._receipts.popitem(last=False)
        return result

    def _acked(self, group: str, receipt: str, success: bool) -> None:
        pending = self._receipts.pop(_receipt_key(group, receipt), None)
        if pending is not None:
            self._sub_after(group, pending, success)

    async def ack(self, group: str, topic: str, receipt: str) -> AckOutcome:
        outcome = await self._inner.ack(group, topic, receipt)
        if outcome is AckOutcome.ACKED:
            self._acked(group, receipt, True)
        return outcome

    async def ack_many(
        self, group: str, topic: str, receipts: Sequence[str]
    ) -> list[AckOutcome | BackendError]:
        outcomes = await self._inner.ack_many(group, topic, receipts)
        for receipt, outcome in zip(receipts, outcomes, strict=False):
            if outcome is AckOutcome.ACKED:
                self._acked(group, receipt, True)
        return outcomes

    async def change_invisible(self, group: str, topic: str, receipt: str, invisible_ms: int) -> str:
        """A new invisibility (a nack, or more time to process): the delivery stays pending under the new
        handle."""
        handle = await self._inner.change_invisible(group, topic, receipt, invisible_ms)
        pending = self._receipts.pop(_receipt_key(group, receipt), None)
        if pending is not None:
            self._receipts[_receipt_key(group, handle)] = pending
        return handle


def _elapsed_ms(start: float) -> int:
    return max(0, round((time.monotonic() - start) * 1000))
