"""Pop consumption: pop, ack, change-invisible, peek and revive (spec §3.16-3.20, §6).

Normal pop (RocketMQ 5 semantics): popping commits the group's consume offset past the popped
messages at once and writes a checkpoint (CK) naming them; an ack writes an ack record. A CK whose
invisible time passed with offsets un-acked is *revived*: those messages are re-written to the pop retry
topic ``%RETRY%<group>_<topic>`` (queue 0, ``reconsume_times + 1``, ``1ST_POP_TIME`` kept) — or to
``%DLQ%<group>`` after ``max_reconsume_times`` — and later pops deliver them again. Change-invisible
writes a one-message CK starting at the message's offset (pop time now) and acks the old handle.

Durability: CK, ack and revive-done records live in :data:`REVIVE_TOPIC` (``revive_queues`` queues,
JSON bodies, tags ``ck`` / ``ack`` / ``done``; a CK and everything about it share one revive queue).
Per revive queue the consumer offset of :data:`REVIVE_GROUP` marks the oldest record of a still-open
CK; :meth:`PopService.start` replays from there, so un-acked messages revive after a restart and acked
ones do not.

Order pop (``order=True``, revive queue 999): a queue is blocked for the group while it has in-flight
un-acked messages; acks commit the consume offset in order; when the invisible time passes the same
messages are delivered again (attempt count + 1). Order in-flight state is in memory: after a restart
the un-acked messages are simply delivered again from the committed offset.

The service is one class in layers, a module each: checkpoint state and records
(:mod:`.pop_checkpoints`), revive (:mod:`.pop_revive`), order pop (:mod:`.pop_order`), ack and
change-invisible (:mod:`.pop_acks`), peek and notification (:mod:`.pop_peek`), and pop itself (here).

Receipt handles are the remoting ``extraInfo`` string (spec §6.2): :mod:`mqproxy.model.receipts`.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from mqproxy.backends.embedded.pop_checkpoints import DEFAULT_REVIVE_QUEUES, MAX_POP_BATCH
from mqproxy.backends.embedded.pop_peek import SOURCE_RECHECK_S, PopPeek
from mqproxy.facade.types import InitMode
from mqproxy.model.errors import InvalidArgument, QueueNotFound, TopicNotFound
from mqproxy.model.receipts import (
    POP_ORDER_REVIVE_QID,
    RETRY_NORMAL,
    RETRY_V1,
    PoppedMessage,
    PopResult,
    Receipt,
    pop_retry_topic,
)
from mqproxy.model.types import StoredMessage, TagFilter

__all__ = [
    "DEFAULT_REVIVE_QUEUES",
    "MAX_POP_BATCH",
    "RETRY_FIRST_PROBABILITY",
    "SOURCE_RECHECK_S",
    "PopService",
    "Receipt",
]

#: Probability that a pop reads the retry topic before the normal queues (``popFromRetryProbability``).
RETRY_FIRST_PROBABILITY = 0.2


class PopService(PopPeek):
    """Pop, ack, change-invisible, peek and revive over one :class:`MessageStore` (see the module
    docstring); run :meth:`run` as a background task to revive."""

    async def pop(
        self,
        group: str,
        topic: str,
        queue_id: int | None,
        max_count: int,
        invisible_ms: int,
        *,
        tag_filter: TagFilter | None = None,
        order: bool = False,
        init_mode: InitMode = InitMode.MIN,
        poll_s: float = 0.0,
        broker_name: str = "",
    ) -> PopResult:
        """Pop up to ``max_count`` (1..32) messages of ``topic`` for ``group`` from ``queue_id`` (None:
        all queues, random start, plus the pop retry topic unless ``order``), invisible for
        ``invisible_ms``. Waits up to ``poll_s`` for messages when none are ready (long polling).

        Raises TopicNotFound, QueueNotFound, InvalidArgument.
        """
        if not group:
            raise InvalidArgument("consumer group is empty")
        if not 1 <= max_count <= MAX_POP_BATCH:
            raise InvalidArgument(f"max message count {max_count} outside 1..{MAX_POP_BATCH}")
        if not 0 < invisible_ms < 2**40:
            raise InvalidArgument(f"invisible time {invisible_ms} ms must be positive")
        if " " in broker_name:
            raise InvalidArgument("broker name must not contain spaces")
        await self.start()
        config = await self._backend.get_topic(topic)
        if config is None:
            raise TopicNotFound(topic)
        queues = max(config.read_queues, config.write_queues)
        if queue_id is None or queue_id < 0:
            first = self._rng.randrange(queues)
            qids = [(first + i) % queues for i in range(queues)]
        else:
            if queue_id >= queues:
                raise QueueNotFound(f"{topic} has no queue {queue_id}")
            qids = [queue_id]
        deadline = trio.current_time() + max(poll_s, 0.0)
        while True:
            # Sources are recomputed each round: the group's pop retry topic may be created while a
            # long poll waits (the first revive of the group's first un-acked message creates it).
            sources = [(topic, qid, RETRY_NORMAL) for qid in qids]
            retry_exists = False
            if not order:
                retry = pop_retry_topic(group, topic)
                retry_exists = await self._backend.get_topic(retry) is not None
                if retry_exists:
                    if self._rng.random() < RETRY_FIRST_PROBABILITY:
                        sources.insert(0, (retry, 0, RETRY_V1))
                    else:
                        sources.append((retry, 0, RETRY_V1))
            result = await self._pop_sources(
                group, topic, sources, max_count, invisible_ms, tag_filter, order, init_mode, broker_name
            )
            if result.messages or trio.current_time() >= deadline:
                return result
            await self._wait_any(
                group, sources, deadline, order, init_mode, recheck=not order and not retry_exists
            )

    async def _pop_sources(
        self,
        group: str,
        topic: str,
        sources: Sequence[tuple[str, int, int]],
        max_count: int,
        invisible_ms: int,
        tag_filter: TagFilter | None,
        order: bool,
        init_mode: InitMode,
        broker_name: str,
    ) -> PopResult:
        now = self._now_ms()
        rq = POP_ORDER_REVIVE_QID if order else self._next_rq()
        out: list[PoppedMessage] = []
        starts: dict[tuple[int, int], int] = {}
        offsets: dict[tuple[int, int], list[int]] = {}
        counts: dict[tuple[int, int], list[int]] = {}
        rest = 0
        for stored_topic, qid, flag in sources:
            want = max_count - len(out)
            if want <= 0:
                break  # restNum counts the queues read, as the Java broker's does
            async with self._lock(group, stored_topic, qid):
                pop_time = now
                if order:
                    got, start, attempt_counts, left = await self._pop_order(
                        group, stored_topic, qid, want, invisible_ms, tag_filter, init_mode, now
                    )
                else:
                    got, start, left, pop_time = await self._pop_queue(
                        group, stored_topic, qid, flag, want, invisible_ms, tag_filter, init_mode, now, rq
                    )
                    attempt_counts = []
            rest += left
            if not got:
                continue
            starts[(flag, qid)] = start
            offsets[(flag, qid)] = [m.queue_offset for m in got]
            if order:
                counts[(flag, qid)] = attempt_counts
            for m in got:
                receipt = Receipt(start, pop_time, invisible_ms, rq, flag, broker_name, qid, m.queue_offset)
                out.append(PoppedMessage(m, receipt, topic))
        return PopResult(tuple(out), now, invisible_ms, rq, rest, starts, offsets, counts)

    def _lock(self, group: str, topic: str, qid: int) -> trio.Lock:
        key = (group, topic, qid)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = trio.Lock()
        return lock

    async def _pop_queue(
        self,
        group: str,
        topic: str,
        qid: int,
        flag: int,
        count: int,
        invisible_ms: int,
        tag_filter: TagFilter | None,
        init_mode: InitMode,
        now: int,
        rq: int,
    ) -> tuple[list[StoredMessage], int, int, int]:
        """Pop from one queue: write the CK, then commit the offset.

        Returns (messages, start offset, rest, pop time): the pop time is ``now`` unless a checkpoint
        with the same start and time exists (then the next free millisecond, keeping CK keys unique).
        """
        offset = await self._offset(group, topic, qid, init_mode)
        messages, next_offset, max_offset = await self._read(group, topic, qid, offset, count, tag_filter)
        pop_time = now
        if messages:
            start = messages[0].queue_offset
            while self._key_used((group, topic, qid, start, pop_time)):
                pop_time += 1
            await self._write_ck(group, topic, qid, start, pop_time, invisible_ms, rq, flag, messages)
        else:
            start = offset
        if next_offset != offset:
            await self._backend.commit_consumer_offset(group, topic, qid, next_offset)
        return messages, start, max(0, max_offset - next_offset), pop_time
