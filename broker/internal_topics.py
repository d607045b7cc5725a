"""Internal topics, property keys and helpers shared by the broker services.

The services keep all their durable state as messages in these topics (and as consumer offsets of
internal groups on them), so any :class:`~mqproxy.broker.backend.Backend` gives them durability and a
restart recovers by replaying the topics — the way Apache RocketMQ does it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Final

import trio

from mqproxy.broker.backend import Backend
from mqproxy.broker.types import Message, StoredMessage

#: Delayed messages, one queue per delay level (queue ``level - 1``), plus the timer queue.
SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
#: Pop checkpoints, acks and revive marks (RocketMQ ``rmq_sys_REVIVE_LOG_<cluster>``).
REVIVE_TOPIC: Final = "rmq_sys_REVIVE_LOG"
HALF_TOPIC: Final = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_HALF_TOPIC: Final = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
#: Where half messages go after ``check_max`` unanswered checks.
CHECK_MAX_TOPIC: Final = "TRANS_CHECK_MAX_TIME_TOPIC"

#: Internal consumer groups whose committed offsets record the services' progress.
SCHEDULE_GROUP: Final = "rmq_sys_SCHEDULE_GROUP"
REVIVE_GROUP: Final = "CID_RMQ_SYS_REVIVE_GROUP"
TRANSACTION_GROUP: Final = "CID_RMQ_SYS_TRANS"

# Property keys (spec §4.4).
PROPERTY_REAL_TOPIC: Final = "REAL_TOPIC"
PROPERTY_REAL_QID: Final = "REAL_QID"
PROPERTY_RETRY_TOPIC: Final = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME: Final = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
PROPERTY_DLQ_ORIGIN_TOPIC: Final = "DLQ_ORIGIN_TOPIC"
PROPERTY_DLQ_ORIGIN_MESSAGE_ID: Final = "DLQ_ORIGIN_MESSAGE_ID"
PROPERTY_TRANSACTION_PREPARED: Final = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP: Final = "PGROUP"
PROPERTY_TRANSACTION_ID: Final = "__transactionId__"
PROPERTY_TRANSACTION_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC: Final = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS: Final = "TIMER_DELAY_MS"
PROPERTY_FIRST_POP_TIME: Final = "1ST_POP_TIME"
PROPERTY_POP_CK: Final = "POP_CK"
#: When a parked message's current hop is due (ms); stripped on delivery. Internal to the scheduler.
PROPERTY_SCHEDULE_DUE_MS: Final = "SCHEDULE_DUE_MS"

#: sysFlag transaction bits (spec §4.2).
SYSFLAG_TRANSACTION_MASK: Final = 0xC
SYSFLAG_TRANSACTION_PREPARED: Final = 0x4
SYSFLAG_TRANSACTION_COMMIT: Final = 0x8

#: Longest single sleep of a timer loop: the service clock is wall time and may step, so timers
#: re-read it at least this often instead of trusting one long sleep.
MAX_TIMER_SLEEP_S: Final = 1.0

#: A wall clock in milliseconds. Services never read ``time`` directly; tests inject a trio-clock one.
Clock = Callable[[], int]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def trio_clock_ms(origin_ms: int = 1_700_000_000_000) -> Clock:
    """A clock that follows ``trio.current_time()`` (so ``MockClock`` drives the services in tests)."""

    def now() -> int:
        return origin_ms + int(trio.current_time() * 1000)

    return now


def copy_message(
    stored: StoredMessage,
    *,
    topic: str,
    queue_id: int,
    properties: Mapping[str, str] | None = None,
    sys_flag: int | None = None,
    reconsume_times: int | None = None,
) -> Message:
    """A new :class:`Message` with ``stored``'s body and born fields, re-addressed."""
    return Message(
        topic=topic,
        body=stored.body,
        queue_id=queue_id,
        flag=stored.flag,
        properties=dict(stored.properties if properties is None else properties),
        sys_flag=stored.sys_flag if sys_flag is None else sys_flag,
        born_timestamp_ms=stored.born_timestamp_ms,
        born_host=stored.born_host,
        reconsume_times=stored.reconsume_times if reconsume_times is None else reconsume_times,
    )


async def ensure_topic(backend: Backend, topic: str, queue_count: int) -> None:
    """Create ``topic`` with ``queue_count`` queues unless it exists (idempotent)."""
    if await backend.get_topic(topic) is None:
        await backend.create_topic(topic, queue_count)
