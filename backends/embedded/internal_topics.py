"""Helpers shared by the broker services: clocks, message copies, topic creation.

The services keep all their durable state as messages in internal topics (named in
:mod:`mqproxy.model.properties`) and as consumer offsets of internal groups on them, so any store gives
them durability and a restart recovers by replaying the topics — the way Apache RocketMQ does it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import trio

from mqproxy.backends.embedded.store import MessageStore
from mqproxy.model.types import Message, PullStatus, StoredMessage

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


async def ensure_topic(backend: MessageStore, topic: str, queue_count: int) -> None:
    """Create ``topic`` with ``queue_count`` queues unless it exists (idempotent)."""
    if await backend.get_topic(topic) is None:
        await backend.create_topic(topic, queue_count)


async def read_to_end(
    backend: MessageStore,
    topic: str,
    queue_id: int,
    offset: int,
    batch: int,
    on_batch: Callable[[Sequence[StoredMessage], int], None],
) -> None:
    """Pull the queue from ``offset`` to its end, ``batch`` messages at a time, handing each batch and the
    offset after it to ``on_batch``. An offset below the queue's min offset jumps to the min."""
    while True:
        result = await backend.pull(topic, queue_id, offset, batch)
        if result.status is PullStatus.OFFSET_ILLEGAL and result.next_offset > offset:
            offset = result.next_offset
            continue
        if not result.messages:
            return
        offset = result.next_offset
        on_batch(result.messages, offset)
