"""
mqproxy.mqtt.tracing
~~~~~~~~~~~~~~~~~~~~

Message trace of MQTT deliveries (:mod:`mqproxy.codecs.rocketmq_trace`): the MQTT client id stands where
RocketMQ names a consumer group. A delivery gets ``SubBefore`` when its PUBLISH is written (or put in
flight); ``SubAfter`` follows at once for QoS 0 and on PUBACK / PUBCOMP for QoS 1 / 2 (cost: from delivery
to that ack). In-flight deliveries awaiting their ack are remembered up to :data:`MAX_PENDING` (oldest
forgotten first).
Publishes are traced by the facade (``mqproxy.trace_facade``), as for every protocol.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from typing import Final

from mqproxy.codecs.rocketmq_trace import NULL_SINK, SubAfterRecord, SubBeforeRecord, TraceSink
from mqproxy.model.types import StoredMessage

__all__ = ["MqttTracer"]

MAX_PENDING: Final = 65_536


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class MqttTracer:
    """Emits the trace records of a gateway's deliveries to ``sink`` (a no-op while it is not enabled)."""

    def __init__(self, sink: TraceSink = NULL_SINK) -> None:
        self.sink = sink
        self._pending: OrderedDict[tuple[str, int], tuple[str, str, str, int]] = OrderedDict()

    def delivered(self, client_id: str, message: StoredMessage, packet_id: int | None) -> None:
        """``message`` was handed to ``client_id``: QoS 0 (``packet_id`` None, done) or in flight."""
        if not self.sink.enabled:
            return
        ts, request_id = now_ms(), uuid.uuid4().hex.upper()
        record = SubBeforeRecord.of(message, client_id, request_id, ts)
        self.sink.emit(record)
        msg_id, keys = record.msg_id, record.keys
        if packet_id is None:
            self._after(client_id, msg_id, keys, request_id, ts)
            return
        self._pending[(client_id, packet_id)] = (msg_id, keys, request_id, ts)
        while len(self._pending) > MAX_PENDING:
            self._pending.popitem(last=False)

    def acked(self, client_id: str, packet_id: int) -> None:
        """The client acknowledged (PUBACK / PUBCOMP) the delivery in flight under ``packet_id``."""
        pending = self._pending.pop((client_id, packet_id), None)
        if pending is not None:
            self._after(client_id, *pending)

    def _after(self, client_id: str, msg_id: str, keys: str, request_id: str, delivered_ms: int) -> None:
        ts = now_ms()
        self.sink.emit(
            SubAfterRecord(
                request_id=request_id,
                msg_id=msg_id,
                cost_ms=max(0, ts - delivered_ms),
                success=True,
                keys=keys,
                timestamp_ms=ts,
                group=client_id,
            )
        )
