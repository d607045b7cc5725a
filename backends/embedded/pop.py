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

Receipt handles are the remoting ``extraInfo`` string (spec §6.2): :mod:`mqproxy.model.receipts`.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson
import structlog
import trio

from mqproxy.backends.embedded.internal_topics import (
    MAX_TIMER_SLEEP_S,
    Clock,
    copy_message,
    ensure_topic,
    wall_clock_ms,
)
from mqproxy.backends.embedded.retry import DEFAULT_MAX_RECONSUME_TIMES, RetryService
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.facade.types import AckOutcome, InitMode
from mqproxy.model.errors import (
    BackendError,
    InvalidArgument,
    MalformedReceipt,
    MessageAlreadyAcked,
    OffsetOutOfRange,
    QueueNotFound,
    ReceiptExpired,
    StoreUnavailable,
    TopicNotFound,
)
from mqproxy.model.properties import PROPERTY_FIRST_POP_TIME, REVIVE_GROUP, REVIVE_TOPIC
from mqproxy.model.receipts import (
    POP_ORDER_REVIVE_QID,
    RETRY_NORMAL,
    RETRY_V1,
    PoppedMessage,
    PopResult,
    Receipt,
    pop_retry_topic,
)
from mqproxy.model.topics import RETRY_PREFIX
from mqproxy.model.types import PROPERTY_TAGS, Message, PullStatus, SendResult, StoredMessage, TagFilter

MAX_POP_BATCH = 32
DEFAULT_REVIVE_QUEUES = 8
#: Probability that a pop reads the retry topic before the normal queues (``popFromRetryProbability``).
RETRY_FIRST_PROBABILITY = 0.2
#: Closed checkpoints remembered to tell "already acked" from "expired" (bounded memory).
_CLOSED_MEMORY = 65536
_REPLAY_BATCH = 256
_COMMIT_EVERY_MS = 1000
_RETRY_PAUSE_S = 1.0
_TAG_CK, _TAG_ACK, _TAG_DONE = "ck", "ack", "done"

_log = structlog.get_logger("mqproxy.pop")

#: Longest a long poll sleeps before looking again for a source queue created meanwhile.
SOURCE_RECHECK_S = 1.0


CkKey = tuple[str, str, int, int, int]  # group, stored topic, queue id, start offset, pop time


@dataclass(slots=True)
class _Checkpoint:
    key: CkKey
    deadline_ms: int
    invisible_ms: int
    revive_qid: int
    retry_flag: int
    record_offset: int
    offsets: set[int]
    acked: set[int] = field(default_factory=set)
    changed: set[int] = field(default_factory=set)  # acked by change-invisible: the handle is superseded


@dataclass(slots=True)
class _OrderFlight:
    pop_time_ms: int
    deadline_ms: int
    offsets: list[int]
    acked: set[int] = field(default_factory=set)
    attempts: dict[int, int] = field(default_factory=dict)


class PopService:
    def __init__(
        self,
        backend: MessageStore,
        retry: RetryService,
        *,
        revive_queues: int = DEFAULT_REVIVE_QUEUES,
        max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
        now_ms: Clock = wall_clock_ms,
        rng: random.Random | None = None,
    ) -> None:
        if not 1 <= revive_queues <= 64:
            raise ValueError("revive_queues must be in 1..64")
        self._backend = backend
        self._retry = retry
        self.revive_queues = revive_queues
        self.max_reconsume_times = max_reconsume_times
        self._now_ms = now_ms
        self._rng = rng or random.Random()
        self._cks: dict[CkKey, _Checkpoint] = {}
        # Recently closed checkpoints: key -> ("acked" | "revived", offsets superseded by change-invisible).
        self._closed: OrderedDict[CkKey, tuple[str, frozenset[int]]] = OrderedDict()
        self._open_by_rq: list[dict[CkKey, int]] = [{} for _ in range(revive_queues)]
        self._revive_end = [0] * revive_queues  # one past the last revive record seen per queue
        self._committed_marks: list[int | None] = [None] * revive_queues
        self._heap: list[tuple[int, CkKey]] = []
        self._orders: dict[tuple[str, str, int], _OrderFlight] = {}
        self._attempts: dict[tuple[str, str, int, int], int] = {}  # order attempts survive re-pops
        self._locks: dict[tuple[str, str, int], trio.Lock] = {}
        self._wake = trio.Event()
        self._counter = 0
        self._started = False
        self._last_commit_ms = 0
        self.revived = 0  # messages revived since start (for metrics/tests)

    # --- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Create the revive topic and replay open checkpoints (idempotent)."""
        if self._started:
            return
        await ensure_topic(self._backend, REVIVE_TOPIC, self.revive_queues)
        for rq in range(self.revive_queues):
            await self._replay(rq)
        self._started = True

    async def _replay(self, rq: int) -> None:
        committed = await self._backend.query_consumer_offset(REVIVE_GROUP, REVIVE_TOPIC, rq)
        offset = await self._backend.min_offset(REVIVE_TOPIC, rq) if committed is None else committed
        self._revive_end[rq] = max(self._revive_end[rq], offset)
        while True:
            result = await self._backend.pull(REVIVE_TOPIC, rq, offset, _REPLAY_BATCH)
            if result.status is PullStatus.OFFSET_ILLEGAL and result.next_offset > offset:
                offset = result.next_offset
                continue
            if not result.messages:
                return
            for record in result.messages:
                self._apply(record)
            offset = result.next_offset
            self._revive_end[rq] = max(self._revive_end[rq], offset)

    def _apply(self, record: StoredMessage) -> None:
        """Replay one revive record (records that do not parse are skipped: they were never ours)."""
        try:
            data = orjson.loads(record.body)
            key: CkKey = (data["g"], data["t"], int(data["q"]), int(data["so"]), int(data["pt"]))
            if record.tags == _TAG_CK:
                invisible = int(data["it"])
                self._open(
                    _Checkpoint(
                        key=key,
                        deadline_ms=key[4] + invisible,
                        invisible_ms=invisible,
                        revive_qid=record.queue_id,
                        retry_flag=int(data.get("rf", 0)),
                        record_offset=record.queue_offset,
                        offsets=set(map(int, data["o"])),
                    )
                )
                return
            ck = self._cks.get(key)
            if ck is None:
                return
            if record.tags == _TAG_ACK:
                raw = data["o"]
                offsets = {int(raw)} if isinstance(raw, int) else set(map(int, raw))
                ck.acked |= offsets
                if data.get("x"):
                    ck.changed |= offsets
                if ck.acked >= ck.offsets:
                    self._close(ck, "acked")
            elif record.tags == _TAG_DONE:
                self._close(ck, "revived")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError):
            return

    def _open(self, ck: _Checkpoint) -> None:
        self._cks[ck.key] = ck
        self._open_by_rq[ck.revive_qid][ck.key] = ck.record_offset
        heapq.heappush(self._heap, (ck.deadline_ms, ck.key))
        if self._heap[0][1] == ck.key:
            self._wake.set()

    def _key_used(self, key: CkKey) -> bool:
        """True if a checkpoint with ``key`` is open or recently closed (keys name one CK for good)."""
        return key in self._cks or key in self._closed

    def _close(self, ck: _Checkpoint, why: str) -> None:
        self._cks.pop(ck.key, None)
        self._open_by_rq[ck.revive_qid].pop(ck.key, None)
        self._closed[ck.key] = (why, frozenset(ck.changed))
        if len(self._closed) > _CLOSED_MEMORY:
            self._closed.popitem(last=False)

    @property
    def in_flight(self) -> int:
        """Un-acked popped messages (normal pop) plus order in-flight ones."""
        normal = sum(len(ck.offsets - ck.acked) for ck in self._cks.values())
        return normal + sum(len(set(f.offsets) - f.acked) for f in self._orders.values())

    # --- pop -----------------------------------------------------------------------------------
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

    def _next_rq(self) -> int:
        self._counter += 1
        return self._counter % self.revive_queues

    def _lock(self, group: str, topic: str, qid: int) -> trio.Lock:
        key = (group, topic, qid)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = trio.Lock()
        return lock

    async def _offset(self, group: str, topic: str, qid: int, init_mode: InitMode) -> int:
        """The group's consume offset on the queue, initialised (and committed) per ``init_mode``."""
        committed = await self._backend.query_consumer_offset(group, topic, qid)
        if committed is not None:
            return committed
        low = await self._backend.min_offset(topic, qid)
        if init_mode is InitMode.MAX and not topic.startswith(RETRY_PREFIX):
            start = max(low, await self._backend.max_offset(topic, qid) - 1)
        else:
            start = low
        await self._backend.commit_consumer_offset(group, topic, qid, start)
        return start

    async def _read(
        self, group: str, topic: str, qid: int, offset: int, count: int, tag_filter: TagFilter | None
    ) -> tuple[list[StoredMessage], int, int]:
        """(messages, next offset, max offset) from ``offset``, jumping over an illegal offset."""
        result = await self._backend.pull(topic, qid, offset, count, tag_filter=tag_filter)
        if result.status is PullStatus.OFFSET_ILLEGAL:
            offset = result.next_offset
            result = await self._backend.pull(topic, qid, offset, count, tag_filter=tag_filter)
        next_offset = max(offset, result.next_offset)
        return list(result.messages), next_offset, result.max_offset

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

    async def _write_ck(
        self,
        group: str,
        topic: str,
        qid: int,
        start: int,
        pop_time: int,
        invisible_ms: int,
        rq: int,
        flag: int,
        messages: Sequence[StoredMessage],
    ) -> _Checkpoint:
        offsets = [m.queue_offset for m in messages]
        body = {"g": group, "t": topic, "q": qid, "so": start, "pt": pop_time, "it": invisible_ms}
        body |= {"rf": flag, "o": offsets}
        sent = await self._record(rq, _TAG_CK, body)
        ck = _Checkpoint(
            key=(group, topic, qid, start, pop_time),
            deadline_ms=pop_time + invisible_ms,
            invisible_ms=invisible_ms,
            revive_qid=rq,
            retry_flag=flag,
            record_offset=sent,
            offsets=set(offsets),
        )
        self._open(ck)
        return ck

    async def _record(self, rq: int, tag: str, body: dict[str, object]) -> int:
        result = await self._backend.send(
            Message(topic=REVIVE_TOPIC, body=orjson.dumps(body), queue_id=rq, properties={PROPERTY_TAGS: tag})
        )
        self._revive_end[rq] = max(self._revive_end[rq], result.queue_offset + 1)
        return result.queue_offset

    async def _rest(self, group: str, topic: str, qid: int) -> int:
        committed = await self._backend.query_consumer_offset(group, topic, qid)
        high = await self._backend.max_offset(topic, qid)
        if committed is None:
            committed = await self._backend.min_offset(topic, qid)
        return max(0, high - committed)

    # --- order pop -----------------------------------------------------------------------------
    async def _pop_order(
        self,
        group: str,
        topic: str,
        qid: int,
        count: int,
        invisible_ms: int,
        tag_filter: TagFilter | None,
        init_mode: InitMode,
        now: int,
    ) -> tuple[list[StoredMessage], int, list[int], int]:
        key = (group, topic, qid)
        flight = self._orders.get(key)
        if flight is not None:
            if set(flight.offsets) - flight.acked and now < flight.deadline_ms:
                return [], 0, [], 0  # blocked: in-flight messages not acked yet
            del self._orders[key]
        offset = await self._offset(group, topic, qid, init_mode)
        messages, next_offset, max_offset = await self._read(group, topic, qid, offset, count, tag_filter)
        if not messages:
            if next_offset != offset:
                await self._backend.commit_consumer_offset(group, topic, qid, next_offset)
            return [], offset, [], 0
        flight = _OrderFlight(now, now + invisible_ms, [m.queue_offset for m in messages])
        attempts = []
        for m in messages:
            n = self._attempts.get((group, topic, qid, m.queue_offset), -1) + 1
            self._attempts[(group, topic, qid, m.queue_offset)] = n
            flight.attempts[m.queue_offset] = n
            attempts.append(n)
        self._orders[key] = flight
        return messages, messages[0].queue_offset, attempts, max(0, max_offset - next_offset)

    async def _ack_order(self, group: str, topic: str, receipt: Receipt) -> AckOutcome:
        key = (group, topic, receipt.queue_id)
        flight = self._orders.get(key)
        if (
            flight is None
            or flight.pop_time_ms != receipt.pop_time_ms
            or receipt.offset not in flight.offsets
        ):
            raise ReceiptExpired("order receipt does not match the queue's in-flight messages")
        if receipt.offset in flight.acked:
            return AckOutcome.ALREADY_ACKED
        flight.acked.add(receipt.offset)
        # Commit in order: up to the first un-acked in-flight offset.
        commit = None
        for offset in flight.offsets:
            if offset not in flight.acked:
                break
            commit = offset + 1
            self._attempts.pop((group, topic, receipt.queue_id, offset), None)
        if commit is not None:
            current = await self._backend.query_consumer_offset(group, topic, receipt.queue_id) or 0
            if commit > current:
                await self._backend.commit_consumer_offset(group, topic, receipt.queue_id, commit)
        if flight.acked >= set(flight.offsets):
            del self._orders[key]
        return AckOutcome.ACKED

    # --- ack / change invisible ----------------------------------------------------------------
    async def _check_range(self, topic: str, queue_id: int, offset: int) -> None:
        low = await self._backend.min_offset(topic, queue_id)  # raises TopicNotFound / QueueNotFound
        high = await self._backend.max_offset(topic, queue_id)
        if not low <= offset < high:
            raise OffsetOutOfRange(f"offset {offset} outside [{low}, {high}) of {topic}:{queue_id}")

    def _find(self, group: str, topic: str, receipt: Receipt) -> _Checkpoint | None:
        """The open checkpoint of ``receipt``; None if it was fully acked; raises if it is stale."""
        key = (group, topic, receipt.queue_id, receipt.ck_offset, receipt.pop_time_ms)
        ck = self._cks.get(key)
        if ck is not None:
            if receipt.offset not in ck.offsets:
                raise MalformedReceipt(f"offset {receipt.offset} is not in the receipt's checkpoint")
            if receipt.offset in ck.changed:
                raise ReceiptExpired("the receipt was replaced by change-invisible")
            return ck
        why, changed = self._closed.get(key, ("unknown", frozenset()))
        if why != "acked" or receipt.offset in changed:
            raise ReceiptExpired("the receipt's checkpoint was revived or replaced")
        return None

    async def ack(self, group: str, topic: str, receipt: Receipt | str) -> AckOutcome:
        """Ack one popped message. ``topic`` is the consumer's topic (the retry flag picks the real one).

        Raises MalformedReceipt, ReceiptExpired (revived or superseded), OffsetOutOfRange,
        TopicNotFound / QueueNotFound; a repeated ack is a no-op (:attr:`AckOutcome.ALREADY_ACKED`).
        """
        await self.start()
        if isinstance(receipt, str):
            receipt = Receipt.decode(receipt)
        real = receipt.real_topic(group, topic)
        await self._check_range(real, receipt.queue_id, receipt.offset)
        if receipt.is_order:
            return await self._ack_order(group, real, receipt)
        ck = self._find(group, real, receipt)
        if ck is None or receipt.offset in ck.acked:
            return AckOutcome.ALREADY_ACKED
        await self._ack_record(ck, receipt.offset, changed=False)
        return AckOutcome.ACKED

    async def ack_many(
        self, group: str, topic: str, receipts: Sequence[Receipt | str]
    ) -> list[AckOutcome | BackendError]:
        """Ack several messages with one revive-topic write per revive queue (gRPC AckMessage entries,
        BATCH_ACK_MESSAGE). Per entry: its outcome, or the error :meth:`ack` would have raised for it.
        Store failures (StoreUnavailable) still raise for the whole call."""
        await self.start()
        outcomes: list[AckOutcome | BackendError] = [AckOutcome.ALREADY_ACKED] * len(receipts)
        planned: dict[CkKey, tuple[_Checkpoint, dict[int, int]]] = {}  # offset -> entry index
        ranges: dict[tuple[str, int], tuple[int, int]] = {}
        for index, item in enumerate(receipts):
            try:
                receipt = Receipt.decode(item) if isinstance(item, str) else item
                real = receipt.real_topic(group, topic)
                bounds = ranges.get((real, receipt.queue_id))
                if bounds is None:
                    low = await self._backend.min_offset(real, receipt.queue_id)
                    bounds = ranges[(real, receipt.queue_id)] = (
                        low,
                        await self._backend.max_offset(real, receipt.queue_id),
                    )
                if not bounds[0] <= receipt.offset < bounds[1]:
                    raise OffsetOutOfRange(f"offset {receipt.offset} outside [{bounds[0]}, {bounds[1]})")
                if receipt.is_order:
                    outcomes[index] = await self._ack_order(group, real, receipt)
                    continue
                ck = self._find(group, real, receipt)
            except StoreUnavailable:
                raise
            except BackendError as exc:
                outcomes[index] = exc
                continue
            if ck is None or receipt.offset in ck.acked:
                continue
            planned.setdefault(ck.key, (ck, {}))[1].setdefault(receipt.offset, index)
        by_rq: dict[int, list[tuple[_Checkpoint, dict[int, int]]]] = {}
        for ck, offsets in planned.values():
            by_rq.setdefault(ck.revive_qid, []).append((ck, offsets))
        for rq, items in by_rq.items():
            records = []
            for ck, offsets in items:  # one ack record per checkpoint, listing its offsets
                group_, topic_, qid, start, pop_time = ck.key
                body = {"g": group_, "t": topic_, "q": qid, "so": start, "pt": pop_time, "o": sorted(offsets)}
                tags = {PROPERTY_TAGS: _TAG_ACK}
                records.append(Message(REVIVE_TOPIC, orjson.dumps(body), queue_id=rq, properties=tags))
            results = await self._backend.send_batch(records)
            self._revive_end[rq] = max(self._revive_end[rq], results[-1].queue_offset + 1)
            for ck, offsets in items:
                ck.acked |= offsets.keys()
                if ck.acked >= ck.offsets and ck.key in self._cks:
                    self._close(ck, "acked")
                for index in offsets.values():
                    outcomes[index] = AckOutcome.ACKED
        return outcomes

    async def _ack_record(self, ck: _Checkpoint, offset: int, *, changed: bool) -> None:
        group, topic, qid, start, pop_time = ck.key
        body: dict[str, object] = {"g": group, "t": topic, "q": qid, "so": start, "pt": pop_time, "o": offset}
        if changed:
            body["x"] = 1
            ck.changed.add(offset)
        await self._record(ck.revive_qid, _TAG_ACK, body)
        ck.acked.add(offset)
        if ck.acked >= ck.offsets:
            self._close(ck, "acked")

    async def change_invisible(
        self, group: str, topic: str, receipt: Receipt | str, invisible_ms: int
    ) -> Receipt:
        """Make the message invisible for ``invisible_ms`` from now; returns its new receipt.

        Raises MessageAlreadyAcked, ReceiptExpired, MalformedReceipt, OffsetOutOfRange, InvalidArgument.
        """
        if not 0 <= invisible_ms < 2**40:
            raise InvalidArgument(f"invisible time {invisible_ms} ms out of range")
        await self.start()
        if isinstance(receipt, str):
            receipt = Receipt.decode(receipt)
        real = receipt.real_topic(group, topic)
        await self._check_range(real, receipt.queue_id, receipt.offset)
        now = self._now_ms()
        if receipt.is_order:
            flight = self._orders.get((group, real, receipt.queue_id))
            if (
                flight is None
                or flight.pop_time_ms != receipt.pop_time_ms
                or receipt.offset not in flight.offsets
            ):
                raise ReceiptExpired("order receipt does not match the queue's in-flight messages")
            if receipt.offset in flight.acked:
                raise MessageAlreadyAcked(f"offset {receipt.offset} was already acked")
            flight.deadline_ms = now + invisible_ms
            return Receipt(
                receipt.ck_offset,
                flight.pop_time_ms,
                flight.deadline_ms - flight.pop_time_ms,
                receipt.revive_qid,
                receipt.retry_flag,
                receipt.broker_name,
                receipt.queue_id,
                receipt.offset,
            )
        ck = self._find(group, real, receipt)
        if ck is None or receipt.offset in ck.acked:
            raise MessageAlreadyAcked(f"offset {receipt.offset} was already acked")
        stored = await self._backend.pull(real, receipt.queue_id, receipt.offset, 1)
        if not stored.messages or stored.messages[0].queue_offset != receipt.offset:
            raise OffsetOutOfRange(f"no message at offset {receipt.offset}")
        pop_time = now
        while self._key_used((group, real, receipt.queue_id, receipt.offset, pop_time)):
            pop_time += 1
        rq = self._next_rq()
        await self._write_ck(
            group,
            real,
            receipt.queue_id,
            receipt.offset,
            pop_time,
            invisible_ms,
            rq,
            ck.retry_flag,
            stored.messages,
        )
        await self._ack_record(ck, receipt.offset, changed=True)
        return Receipt(
            receipt.offset,
            pop_time,
            invisible_ms,
            rq,
            receipt.retry_flag,
            receipt.broker_name,
            receipt.queue_id,
            receipt.offset,
        )

    async def forward_to_dlq(self, group: str, topic: str, receipt: Receipt | str) -> SendResult:
        """Move a popped, un-acked message to ``%DLQ%<group>`` and ack it (gRPC
        ForwardMessageToDeadLetterQueue). Raises like :meth:`ack`; MessageAlreadyAcked if acked."""
        await self.start()
        if isinstance(receipt, str):
            receipt = Receipt.decode(receipt)
        real = receipt.real_topic(group, topic)
        await self._check_range(real, receipt.queue_id, receipt.offset)
        if not receipt.is_order:
            ck = self._find(group, real, receipt)
            if ck is None or receipt.offset in ck.acked:
                raise MessageAlreadyAcked(f"offset {receipt.offset} was already acked")
        stored = await self._backend.pull(real, receipt.queue_id, receipt.offset, 1)
        if not stored.messages or stored.messages[0].queue_offset != receipt.offset:
            raise OffsetOutOfRange(f"no message at offset {receipt.offset}")
        result = await self._retry.dead_letter(group, stored.messages[0])
        await self.ack(group, topic, receipt)
        return result

    # --- peek / notification -------------------------------------------------------------------
    async def peek(
        self,
        group: str,
        topic: str,
        queue_id: int | None,
        max_count: int,
        *,
        tag_filter: TagFilter | None = None,
    ) -> list[StoredMessage]:
        """Messages from the group's consume offset(s), without popping them (PEEK_MESSAGE)."""
        if not 1 <= max_count <= MAX_POP_BATCH:
            raise InvalidArgument(f"max message count {max_count} outside 1..{MAX_POP_BATCH}")
        config = await self._backend.get_topic(topic)
        if config is None:
            raise TopicNotFound(topic)
        qids = range(max(config.read_queues, config.write_queues)) if queue_id is None else [queue_id]
        out: list[StoredMessage] = []
        for qid in qids:
            if len(out) >= max_count:
                break
            committed = await self._backend.query_consumer_offset(group, topic, qid)
            offset = await self._backend.min_offset(topic, qid) if committed is None else committed
            messages, _, _ = await self._read(group, topic, qid, offset, max_count - len(out), tag_filter)
            out.extend(messages)
        return out

    async def has_message(self, group: str, topic: str, queue_id: int | None) -> bool:
        """True if a queue (or the pop retry topic) has messages past the group's offset (NOTIFICATION)."""
        config = await self._backend.get_topic(topic)
        if config is None:
            raise TopicNotFound(topic)
        qids = range(max(config.read_queues, config.write_queues)) if queue_id is None else [queue_id]
        targets = [(topic, qid) for qid in qids]
        retry = pop_retry_topic(group, topic)
        if await self._backend.get_topic(retry) is not None:
            targets.append((retry, 0))
        for name, qid in targets:
            if await self._rest(group, name, qid) > 0:
                return True
        return False

    async def _wait_any(
        self,
        group: str,
        sources: Sequence[tuple[str, int, int]],
        deadline: float,
        order: bool,
        init_mode: InitMode,
        *,
        recheck: bool = False,
    ) -> None:
        """Sleep until one source queue grows past the group's offset, or ``deadline``.

        ``recheck`` caps the sleep at :data:`SOURCE_RECHECK_S` so the caller can look again for a
        source that does not exist yet (the pop retry topic)."""
        targets = []
        for topic, qid, _ in sources:
            committed = await self._backend.query_consumer_offset(group, topic, qid)
            offset = committed if committed is not None else await self._backend.max_offset(topic, qid)
            targets.append((topic, qid, offset))
        timeout = deadline - trio.current_time()
        if order:  # an order queue also unblocks when its in-flight messages expire
            timeout = min(timeout, 1.0)
        if recheck:
            timeout = min(timeout, SOURCE_RECHECK_S)
        if timeout <= 0:
            return
        async with trio.open_nursery() as nursery:

            async def watch(topic: str, qid: int, offset: int) -> None:
                if await self._backend.wait_for_message(topic, qid, offset, timeout):
                    nursery.cancel_scope.cancel()

            for target in targets:
                nursery.start_soon(watch, *target)

    # --- revive --------------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Revive expired checkpoints until cancelled."""
        await self.start()
        task_status.started()
        while True:
            await self.revive_due()
            await self._commit_progress(force=False)
            self._wake = trio.Event()
            delay = (self._heap[0][0] - self._now_ms()) / 1000 if self._heap else math.inf
            with trio.move_on_after(min(max(delay, 0), MAX_TIMER_SLEEP_S)):
                await self._wake.wait()

    async def revive_due(self) -> int:
        """Revive every open checkpoint whose invisible time has passed; returns messages revived."""
        count = 0
        while self._heap and self._heap[0][0] <= self._now_ms():
            _, key = heapq.heappop(self._heap)
            ck = self._cks.get(key)
            if ck is None or ck.deadline_ms > self._now_ms():
                continue
            try:
                count += await self._revive(ck)
            except StoreUnavailable as exc:
                _log.warning("internal.error", exception=f"pop revive: {exc}")
                heapq.heappush(self._heap, (self._now_ms() + int(_RETRY_PAUSE_S * 1000), key))
                await trio.sleep(_RETRY_PAUSE_S)
        return count

    async def _revive(self, ck: _Checkpoint) -> int:
        group, topic, qid, start, pop_time = ck.key
        original = topic
        if ck.retry_flag != RETRY_NORMAL:
            # The stored topic is already the pop retry topic: revive back into it.
            retry = topic
        else:
            retry = pop_retry_topic(group, original)
        revived = 0
        for offset in sorted(ck.offsets - ck.acked):
            try:
                result = await self._backend.pull(topic, qid, offset, 1)
            except StoreUnavailable:
                raise
            except BackendError:
                continue
            if not result.messages or result.messages[0].queue_offset != offset:
                continue
            message = result.messages[0]
            if message.reconsume_times >= self.max_reconsume_times:
                await self._retry.dead_letter(group, message)
            else:
                props = dict(message.properties)
                props.setdefault(PROPERTY_FIRST_POP_TIME, str(pop_time))
                await ensure_topic(self._backend, retry, 1)
                await self._backend.send(
                    copy_message(
                        message,
                        topic=retry,
                        queue_id=0,
                        properties=props,
                        reconsume_times=message.reconsume_times + 1,
                    )
                )
            revived += 1
        await self._record(
            ck.revive_qid, _TAG_DONE, {"g": group, "t": topic, "q": qid, "so": start, "pt": pop_time}
        )
        if ck.key in self._cks:
            self._close(ck, "revived")
        self.revived += revived
        return revived

    async def _commit_progress(self, *, force: bool) -> None:
        """Commit each revive queue's replay start: its oldest open checkpoint record."""
        now = self._now_ms()
        if not force and now - self._last_commit_ms < _COMMIT_EVERY_MS:
            return
        self._last_commit_ms = now
        # Computed before any await: a checkpoint written meanwhile is after every mark.
        marks = [
            min(open_cks.values(), default=end)
            for open_cks, end in zip(self._open_by_rq, self._revive_end, strict=False)
        ]
        for rq, mark in enumerate(marks):
            if self._committed_marks[rq] != mark:
                await self._backend.commit_consumer_offset(REVIVE_GROUP, REVIVE_TOPIC, rq, mark)
                self._committed_marks[rq] = mark
