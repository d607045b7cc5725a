"""
mqproxy.backends.rocketmq.produce
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

The :class:`~mqproxy.facade.api.Producing` role against a RocketMQ cluster.

Contracts:

* A send goes to the real queue its virtual queue names; a message without a queue (``queue_id`` -1) goes
  round-robin over the writable queues. When that broker cannot be reached or answers SYSTEM_BUSY /
  SERVICE_NOT_AVAILABLE / NO_PERMISSION, the send is retried once on a writable queue of another broker
  (availability over strict queue order, as the Java client's retry does); other refusals are passed
  through (:class:`~mqproxy.model.errors.BrokerRefused`).
* A message with LMQs to fill (``Message.dispatch``, or named by the installed
  :data:`~mqproxy.facade.api.LmqDispatch`) goes to the preferred LMQ broker, retried once on another live
  master as above (it then fills that broker's copies of its LMQs), and a batch holding one is sent
  message by message (:mod:`.lmq`).
* Delays, timers, transactions and retry/DLQ are the broker's: the message goes with its properties and
  ``sysFlag`` unchanged. A transactional half message registers its producer group with the brokers from
  this node (see :mod:`.members`) so the brokers' check-backs come to a node that has such a producer.
* End transaction, recall and check-backs find their broker through the packed commit-log offset, the
  recall handle (which names the broker) and the node's broker connection respectively.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import structlog

from mqproxy.backends.rocketmq import wire
from mqproxy.backends.rocketmq.cluster import Cluster, TopicView
from mqproxy.backends.rocketmq.lmq import with_dispatch
from mqproxy.backends.rocketmq.messages import to_client
from mqproxy.backends.rocketmq.vqueues import pack_offset, unpack_offset
from mqproxy.codecs.message_record import BatchEntry, decode_records, encode_batch_body
from mqproxy.codecs.remoting import RemotingCommand
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.facade.api import EndTransaction, LmqDispatch, SendOutcome, SendRequest
from mqproxy.facade.types import CheckBack, Resolution, TransactionCheck
from mqproxy.model.errors import (
    BrokerRefused,
    ClusterUnavailable,
    MessageNotFound,
    TopicNotFound,
    TransactionGroupMismatch,
    TransactionNotFound,
)
from mqproxy.model.ids import MessageIdError, parse_offset_msg_id
from mqproxy.model.properties import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED,
)
from mqproxy.model.types import PROPERTY_DELAY_LEVEL, PROPERTY_UNIQ_KEY, Message, SendResult, StoredMessage

if TYPE_CHECKING:
    from mqproxy.backends.rocketmq.members import Members

__all__ = ["ProducingRole"]

_log = structlog.get_logger("mqproxy.backends.rocketmq")
#: Broker answers after which a send is tried on another broker.
_RETRY_ELSEWHERE: Final = frozenset(
    {ResponseCode.SYSTEM_BUSY, ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.NO_PERMISSION}
)
#: Broker answers that mean "stored" (the flush or replica status is the broker's concern).
_STORED: Final = frozenset(
    {ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE}
)
_TIMER_PROPERTIES: Final = (PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS)


def _parked(message: Message) -> tuple[str, int]:
    props = message.properties
    if props.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true":
        return "half", 0
    level = props.get(PROPERTY_DELAY_LEVEL, "").strip()
    if level.isdigit() and int(level) > 0:
        return "delay", int(level)
    if any(props.get(p) for p in _TIMER_PROPERTIES):
        return "delay", 0
    return "", 0


def transaction_ref(packed_offset: int, table_offset: int, uniq: str) -> str:
    """What names a half message to any node: its packed commit-log offset, its half-queue offset
    (``tranStateTableOffset``) and its message id."""
    return f"{packed_offset}:{table_offset}:{uniq}"


def parse_transaction_ref(text: str) -> tuple[int, int] | None:
    """``(packed offset, half-queue offset)`` of a :func:`transaction_ref`, or None."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1])


class ProducingRole:
    """Mixed into :class:`~.broker.RocketMQBroker`."""

    cluster: Cluster
    members: Members
    advertised: tuple[str, int]
    delay_level_count: int
    _check_backs: list[CheckBack]
    _round_robin: itertools.count[int]

    # --- topics -------------------------------------------------------------------------------

    async def _send_view(self, topic: str, create_queues: int | None) -> TopicView:
        view = await self.cluster.view(topic)
        if view is None and create_queues is not None and self.cluster.config.auto_create_topics:
            await self.create_topic(topic, create_queues)  # type: ignore[attr-defined]
            view = await self.cluster.view(topic)
        if view is None:
            raise TopicNotFound(f"topic {topic} has no route in the cluster")
        return view

    def _queue_order(self, view: TopicView, wanted: int) -> list[int]:
        """Virtual queues to try: the wanted one (or the next round-robin one) and then one writable queue
        of each other broker."""
        writable = view.writable_queues()
        if not writable:
            return []
        first = wanted if wanted >= 0 else writable[next(self._round_robin) % len(writable)]
        order = [first]
        tried = {view.real(first).broker} if view.real(first) else set()  # type: ignore[union-attr]
        start = next(self._round_robin)
        for k in range(len(writable)):
            v = writable[(start + k) % len(writable)]
            entry = view.real(v)
            if entry is not None and entry.broker not in tried:
                tried.add(entry.broker)
                order.append(v)
        return order

    # --- sends -------------------------------------------------------------------------------

    async def send(self, request: SendRequest) -> SendOutcome:
        message = request.message
        targets = self._name_lmqs(message)  # type: ignore[attr-defined]
        if targets:  # the preferred LMQ broker, then another live one (see :mod:`.lmq`)
            view, order = await self._lmq_route(message, request.create_queues)  # type: ignore[attr-defined]
            message = with_dispatch(message, targets)
        else:
            view = await self._send_view(message.topic, request.create_queues)
            order = []
        parked, level = _parked(message)
        if parked == "half":
            if request.producer_group:
                message.properties.setdefault(PROPERTY_PRODUCER_GROUP, request.producer_group)
            group = message.properties.get(PROPERTY_PRODUCER_GROUP, "")
            if group:
                await self.members.add_producer_group(group)
        if 0 <= message.queue_id and view.real(message.queue_id) is None:
            raise BrokerRefused(
                ResponseCode.SYSTEM_ERROR, f"queue {message.queue_id} of {message.topic} does not exist"
            )
        order = order or self._queue_order(view, message.queue_id)
        if not order:
            raise ClusterUnavailable(f"no broker accepts writes to {message.topic} now")
        last: Exception | None = None
        for attempt, virtual in enumerate(order[:2]):
            entry = view.real(virtual)
            assert entry is not None
            command = wire.send_request(
                message,
                entry.broker,
                entry.queue_id,
                request.producer_group,
                request.max_reconsume_times,
                self.cluster.config.default_queue_count,
            )
            try:
                response = await self.cluster.broker_call(entry.broker, command)
            except ClusterUnavailable as exc:
                last = exc
                _log.warning("cluster.send_failed", topic=message.topic, broker=entry.broker, reason=str(exc))
                continue
            if response.code in _RETRY_ELSEWHERE:
                last = BrokerRefused(response.code, response.remark or "")
                _log.warning(
                    "cluster.send_refused",
                    topic=message.topic,
                    broker=entry.broker,
                    code=response.code,
                    reason=response.remark or "",
                )
                continue
            if response.code not in _STORED:
                wire.check(response)
            if attempt:
                _log.info(
                    "cluster.send_redirected", topic=message.topic, wanted_queue=order[0], queue_id=virtual
                )
            result = await self._sent(message, view, virtual, entry.broker, response)
            ref = ""
            if parked == "half":
                uniq = message.properties.get(PROPERTY_UNIQ_KEY, "")
                ref = transaction_ref(result.commitlog_offset, result.queue_offset, uniq)
            return SendOutcome(
                result,
                message.topic,
                virtual,
                parked=parked,
                delay_level=min(level, self.delay_level_count),
                recall_handle=response.ext_fields.get("recallHandle", "") if parked == "delay" else "",
                transaction_ref=ref,
            )
        assert last is not None
        raise last

    async def _sent(
        self, message: Message, view: TopicView, virtual: int, broker: str, response: RemotingCommand
    ) -> SendResult:
        ext = response.ext_fields
        try:
            _, real_offset = parse_offset_msg_id(ext.get("msgId", ""))
        except MessageIdError:
            raise BrokerRefused(
                ResponseCode.SYSTEM_ERROR, f"broker {broker} sent no offset message id"
            ) from None
        index = await self.cluster.broker_index(broker)
        return SendResult(
            topic=message.topic,
            queue_id=virtual,
            queue_offset=int(ext.get("queueOffset", "0") or 0),
            commitlog_offset=pack_offset(index, real_offset),
            store_timestamp_ms=int(time.time() * 1000),
        )

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        if not messages:
            return []
        if any([self._name_lmqs(m) for m in messages]):  # type: ignore[attr-defined]
            return await self._send_batch_dispatched(messages)  # type: ignore[attr-defined]
        first = messages[0]
        view = await self._send_view(first.topic, None)
        order = self._queue_order(view, first.queue_id)
        if not order:
            raise ClusterUnavailable(f"no broker accepts writes to {first.topic} now")
        entry = view.real(order[0])
        assert entry is not None
        body = encode_batch_body(BatchEntry(m.body, m.flag, dict(m.properties)) for m in messages)
        batch = Message(
            first.topic, body, entry.queue_id, properties={}, born_timestamp_ms=first.born_timestamp_ms
        )
        command = wire.send_request(
            batch, entry.broker, entry.queue_id, "", None, self.cluster.config.default_queue_count
        )
        command.code = RequestCode.SEND_BATCH_MESSAGE
        command.ext_fields["m"] = "true"
        response = wire.check(await self.cluster.broker_call(entry.broker, command), *_STORED)
        index = await self.cluster.broker_index(entry.broker)
        ids = response.ext_fields.get("msgId", "").split(",")
        base = int(response.ext_fields.get("queueOffset", "0") or 0)
        results = []
        for n, _ in enumerate(messages):
            try:
                _, real = parse_offset_msg_id(ids[n]) if n < len(ids) else (None, -1)
            except MessageIdError:
                real = -1
            packed = pack_offset(index, real) if real >= 0 else -1
            results.append(SendResult(first.topic, order[0], base + n, packed, int(time.time() * 1000)))
        return results

    # --- transactions ---------------------------------------------------------------------------

    async def _half(self, broker: str, real_offset: int) -> StoredMessage:
        request = wire.command(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": real_offset})
        response = await self.cluster.broker_call(broker, request)
        if response.code != ResponseCode.SUCCESS:
            raise MessageNotFound(f"no half message at {real_offset} on {broker}: {response.remark or ''}")
        found = wire.records(response.body)
        if not found:
            raise MessageNotFound(f"no half message at {real_offset} on {broker}")
        return found[0]

    async def end_transaction(self, end: EndTransaction) -> SendResult | None:
        if end.resolution is Resolution.UNKNOWN:
            return None  # the broker checks back later
        packed, table_offset = end.commitlog_offset, end.tran_state_table_offset
        if packed is None:
            parsed = parse_transaction_ref(end.transaction_id)
            if parsed is None:
                raise TransactionNotFound(
                    f"transaction id {end.transaction_id[:64]!r} was not issued by a cluster node"
                )
            packed, table_offset = parsed
        index, real = unpack_offset(packed)
        broker = self.cluster.broker_named_by(index)
        group = end.producer_group
        if group is None or table_offset < 0:
            half = await self._half(broker, real)
            table_offset = half.queue_offset if table_offset < 0 else table_offset
            group = half.properties.get(PROPERTY_PRODUCER_GROUP, "") if group is None else group
        request = wire.command(
            RequestCode.END_TRANSACTION,
            {
                "producerGroup": group,
                "tranStateTableOffset": table_offset,
                "commitLogOffset": real,
                "commitOrRollback": end.resolution.value,
                "fromTransactionCheck": end.from_check,
                "msgId": end.offset_msg_id or end.transaction_id,
                "transactionId": end.transaction_id or None,
                "bname": broker,
            },
        )
        response = await self.cluster.broker_call(broker, request)
        if (
            response.code != ResponseCode.SUCCESS
            and "producer group wrong" in (response.remark or "").lower()
        ):
            raise TransactionGroupMismatch(response.remark or "")
        wire.check(response)
        return None

    async def recall(self, topic: str, handle: str) -> str:
        view = await self._send_view(topic, None)
        brokers = sorted({e.broker for e in view.queues.entries})
        last: Exception = MessageNotFound(f"no broker of {topic} knows recall handle")
        for broker in brokers:  # the handle names its broker, but only the broker can read it
            request = wire.command(
                RequestCode.RECALL_MESSAGE, {"topic": topic, "recallHandle": handle, "bname": broker}
            )
            response = await self.cluster.broker_call(broker, request)
            if response.code == ResponseCode.SUCCESS:
                return response.ext_fields.get("msgId", "")
            last = BrokerRefused(response.code, response.remark or "")
        raise last

    def add_check_back(self, sender: CheckBack) -> None:
        self._check_backs.append(sender)

    def set_lmq_dispatch(self, dispatch: LmqDispatch) -> None:
        self._lmq_dispatch = dispatch

    def clamp_delay_level(self, level: int) -> int:
        return min(level, self.delay_level_count) if level > 0 else 0

    async def on_check_transaction(self, request: RemotingCommand) -> None:
        """A broker's CHECK_TRANSACTION_STATE: hand it to a live producer of the group on this node."""
        found = decode_records(request.body) if request.body else []
        if not found:
            _log.warning("cluster.check_unroutable", reason="check-back without a message")
            return
        message = found[0].to_stored_message()
        ext = request.ext_fields
        host, port = message.store_host
        broker = ext.get("bname") or next(
            (n for n, a in self.cluster.masters().items() if a == f"{host}:{port}"), ""
        )
        if not broker:
            _log.warning("cluster.check_unroutable", reason=f"no broker at {host}:{port}")
            return
        index = await self.cluster.broker_index(broker)
        view = self.cluster.cached(message.topic) or await self.cluster.view(message.topic)
        client_message = to_client(message, broker, index, view, self.advertised)
        half = dataclasses.replace(
            client_message,
            commitlog_offset=pack_offset(index, int(ext.get("commitLogOffset", message.commitlog_offset))),
            queue_offset=int(ext.get("tranStateTableOffset", message.queue_offset)),
        )
        props = message.properties
        check = TransactionCheck(
            producer_group=props.get(PROPERTY_PRODUCER_GROUP, ""),
            transaction_id=transaction_ref(
                half.commitlog_offset, half.queue_offset, props.get(PROPERTY_UNIQ_KEY, "")
            ),
            check_times=int(props.get(PROPERTY_TRANSACTION_CHECK_TIMES, "0") or 0),
            half=half,
            message=client_message,
        )
        for sender in self._check_backs:
            if await sender(check):
                _log.info("cluster.check_forwarded", group=check.producer_group, broker=broker)
                return
        _log.info(
            "cluster.check_unanswered",
            group=check.producer_group,
            broker=broker,
            reason="no live producer here",
        )
