"""
mqproxy.trace
~~~~~~~~~~~~~

Message trace (``[trace] enabled``): the records the protocols emit (:mod:`mqproxy.codecs.rocketmq_trace`) are
written to the trace topic through the broker facade, batched and asynchronously.

* Emitters hand records to a :class:`~mqproxy.codecs.rocketmq_trace.TraceSink` (``emit`` never blocks,
  never raises); :data:`~mqproxy.codecs.rocketmq_trace.NULL_SINK` when tracing is off.
* :class:`TraceBuffer` (sans-IO) holds emitted records up to a bound; a record that does not fit is
  dropped and counted, so a slow or failing trace topic never slows the message path.
* :class:`TraceDispatcher` is the sink of a server with tracing on and its trio task: it flushes the
  buffer every :data:`FLUSH_INTERVAL_S` or as soon as :data:`FLUSH_RECORDS` are waiting, packing records
  into trace messages of at most :data:`MAX_BODY_BYTES` (as the Java client does).

Counted in ``mqproxy_trace_records_total{result}`` (``written``, ``dropped``, ``failed``); events
``trace.dropping`` (the buffer is full: records are being dropped; once per episode) and
``trace.write_failed`` (a trace message could not be stored; at most one per :data:`FAIL_LOG_EVERY_S`).

Every emitted record is also logged as a ``trace.record`` event (:func:`record_fields`; of a
``log_sample_rate`` share of messages, chosen by a hash of the message id so that every record of a chosen
message is logged, on any node), whatever becomes of it in the trace topic, so the Spark job can join
records to connections: the event carries the
``conn_id`` and ``protocol`` context variables of the connection task that emitted it (an emitter running
outside that task binds them around its call, as the MQTT push hub's deliveries do).
"""

from __future__ import annotations

import time
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import structlog
import trio

from mqproxy.codecs.rocketmq_trace import (
    NULL_SINK,
    EndTransactionRecord,
    PubRecord,
    SubAfterRecord,
    SubBeforeRecord,
    TraceRecord,
    TraceSink,
    pack,
)
from mqproxy.facade.api import BrokerFacade, SendRequest
from mqproxy.log import log_info
from mqproxy.model.errors import BackendError
from mqproxy.model.types import PROPERTY_KEYS, Message

__all__ = ["NULL_SINK", "TraceBuffer", "TraceDispatcher", "TraceSink", "record_fields"]

_log = structlog.get_logger("mqproxy.trace")

FLUSH_INTERVAL_S: Final = 0.1
#: Records waiting that trigger a flush before the interval ends.
FLUSH_RECORDS: Final = 256
#: Largest trace message body (the Java client's ``maxMsgSize`` default is 128000).
MAX_BODY_BYTES: Final = 128_000
#: Most records one trace message holds (bounds its ``KEYS`` property).
MAX_RECORDS_PER_MESSAGE: Final = 64
FAIL_LOG_EVERY_S: Final = 10.0


def record_fields(record: TraceRecord) -> dict[str, Any]:
    """The fields of the ``trace.record`` event of ``record`` (``conn_id`` and ``protocol`` come from
    context variables): ``trace_type`` (``Pub``, ``SubBefore``, ``SubAfter``, ``EndTransaction``),
    ``msg_id``, ``group``, ``timestamp_ms`` always; ``topic`` (Pub, EndTransaction), ``cost_ms`` and
    ``success`` (Pub, SubAfter), ``request_id`` (SubBefore, SubAfter: one per delivered batch),
    ``retry_times`` (SubBefore), ``transaction_state`` (EndTransaction) and ``keys`` (when the message
    has keys) where the record has them."""
    fields: dict[str, Any]
    match record:
        case PubRecord():
            fields = {
                "trace_type": "Pub", "msg_id": record.msg_id, "group": record.group,
                "timestamp_ms": record.timestamp_ms, "topic": record.topic, "cost_ms": record.cost_ms,
                "success": record.success,
            }  # fmt: skip
        case SubBeforeRecord():
            fields = {
                "trace_type": "SubBefore", "msg_id": record.msg_id, "group": record.group,
                "timestamp_ms": record.timestamp_ms, "request_id": record.request_id,
                "retry_times": record.retry_times,
            }  # fmt: skip
        case SubAfterRecord():
            fields = {
                "trace_type": "SubAfter", "msg_id": record.msg_id, "group": record.group,
                "timestamp_ms": record.timestamp_ms, "request_id": record.request_id,
                "cost_ms": record.cost_ms, "success": record.success,
            }  # fmt: skip
        case EndTransactionRecord():
            fields = {
                "trace_type": "EndTransaction", "msg_id": record.msg_id, "group": record.group,
                "timestamp_ms": record.timestamp_ms, "topic": record.topic,
                "transaction_state": record.state,
            }  # fmt: skip
    if record.keys:
        fields["keys"] = record.keys
    return fields


class TraceBuffer:
    """A bounded FIFO of records. :meth:`add` drops a record when ``capacity`` are held; ``dropping``
    is True from the first drop until the buffer has been emptied by :meth:`take` again."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._records: deque[TraceRecord] = deque()
        self.dropped = 0
        self.dropping = False

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: TraceRecord) -> bool:
        """Hold ``record``; False (and counted) if the buffer is full."""
        if len(self._records) >= self.capacity:
            self.dropped += 1
            self.dropping = True
            return False
        self._records.append(record)
        return True

    def take(self, max_count: int) -> list[TraceRecord]:
        """Remove and return up to ``max_count`` of the oldest records; emptying the buffer ends a
        dropping episode."""
        count = min(max_count, len(self._records))
        out = [self._records.popleft() for _ in range(count)]
        if not self._records:
            self.dropping = False
        return out


class TraceDispatcher:
    """The trace sink of a server with ``[trace] enabled`` and the task writing it (:meth:`run`).

    ``count(result, n)`` is told of every record's fate (the metric). Trace messages go to ``topic``
    through ``broker`` directly, so they are not traced themselves."""

    enabled = True

    def __init__(
        self,
        broker: BrokerFacade,
        topic: str,
        capacity: int,
        count: Callable[[str, int], None] = lambda result, n: None,
        *,
        create_topic: bool = True,
        born_host: tuple[str, int] = ("127.0.0.1", 0),
        log_sample_rate: float = 1.0,
    ) -> None:
        self.broker = broker
        self._log_all = log_sample_rate >= 1.0
        self._log_below = int(log_sample_rate * 2**32)  # of a msgId's CRC-32
        self.topic = topic
        self.buffer = TraceBuffer(capacity)
        self._count = count
        self._create_topic = create_topic
        self._born_host = born_host
        self._wake = trio.Event()
        self._last_fail_log = -FAIL_LOG_EVERY_S
        self._episode_logged = False

    def emit(self, record: TraceRecord) -> None:
        if self._log_all or (self._log_below and zlib.crc32(record.msg_id.encode()) < self._log_below):
            log_info(_log, "trace.record", record_fields(record))
        if not self.buffer.add(record):
            self._count("dropped", 1)
            if not self._episode_logged:
                self._episode_logged = True
                _log.warning(
                    "trace.dropping",
                    topic=self.topic,
                    capacity=self.buffer.capacity,
                    dropped_total=self.buffer.dropped,
                )
            return
        if len(self.buffer) >= FLUSH_RECORDS:
            self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Create the trace topic if asked and missing, then flush until cancelled (a last flush on the
        way out is attempted within a short shielded window)."""
        if self._create_topic:
            try:
                if await self.broker.get_topic(self.topic) is None:
                    await self.broker.create_topic(self.topic, 1)
            except BackendError as exc:
                self._log_failure(exc)
        task_status.started()
        try:
            while True:
                with trio.move_on_after(FLUSH_INTERVAL_S):
                    await self._wake.wait()
                self._wake = trio.Event()
                await self.flush()
        finally:
            with trio.move_on_after(1.0) as scope:
                scope.shield = True
                await self.flush()

    async def flush(self) -> int:
        """Write every record held now; returns how many were written."""
        written = 0
        while len(self.buffer):
            records = self.buffer.take(FLUSH_RECORDS)
            if not self.buffer.dropping:
                self._episode_logged = False
            for start in range(0, len(records), MAX_RECORDS_PER_MESSAGE):
                chunk = records[start : start + MAX_RECORDS_PER_MESSAGE]
                for body, keys in pack(chunk, MAX_BODY_BYTES):
                    n = body.count(b"\x02")
                    message = Message(
                        topic=self.topic,
                        body=body,
                        properties={PROPERTY_KEYS: keys, "WAIT": "false"},
                        born_timestamp_ms=time.time_ns() // 1_000_000,
                        born_host=self._born_host,
                    )
                    try:
                        await self.broker.send(SendRequest(message))
                    except BackendError as exc:
                        self._count("failed", n)
                        self._log_failure(exc)
                    else:
                        written += n
                        self._count("written", n)
        return written

    def _log_failure(self, exc: BackendError) -> None:
        now = time.monotonic()
        if now - self._last_fail_log >= FAIL_LOG_EVERY_S:
            self._last_fail_log = now
            _log.warning("trace.write_failed", topic=self.topic, error=type(exc).__name__, detail=str(exc))
