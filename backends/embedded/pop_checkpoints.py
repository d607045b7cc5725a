"""Pop checkpoints (CK): the durable records behind receipt handles and invisibility.

Popping writes a CK record naming the popped offsets to :data:`REVIVE_TOPIC`; acks write ack records;
a revived CK gets a done record (tags ``ck`` / ``ack`` / ``done``; a CK and everything about it share
one revive queue). A CK is keyed by (group, stored topic, queue id, start offset, pop time), the fields a
receipt carries, so :meth:`PopCheckpoints._find` maps a receipt back to its CK. Per revive queue the
consumer offset of :data:`REVIVE_GROUP` marks the oldest record of a still-open CK;
:meth:`PopCheckpoints.start` replays from there after a restart.

The pop service is one class in layers, a module each: this base (all state), revive
(:mod:`.pop_revive`), order pop (:mod:`.pop_order`), ack and change-invisible (:mod:`.pop_acks`), peek
and notification (:mod:`.pop_peek`), and pop itself (:mod:`.pop`).
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson
import trio

from mqproxy.backends.embedded.internal_topics import Clock, ensure_topic, read_to_end, wall_clock_ms
from mqproxy.backends.embedded.retry import DEFAULT_MAX_RECONSUME_TIMES, RetryService
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.facade.types import InitMode
from mqproxy.model.errors import MalformedReceipt, OffsetOutOfRange, ReceiptExpired
from mqproxy.model.properties import REVIVE_GROUP, REVIVE_TOPIC
from mqproxy.model.receipts import Receipt
from mqproxy.model.topics import RETRY_PREFIX
from mqproxy.model.types import PROPERTY_TAGS, Message, PullStatus, StoredMessage, TagFilter

MAX_POP_BATCH = 32
DEFAULT_REVIVE_QUEUES = 8
#: Closed checkpoints remembered to tell "already acked" from "expired" (bounded memory).
_CLOSED_MEMORY = 65536
_REPLAY_BATCH = 256
_COMMIT_EVERY_MS = 1000
#: Tags of the revive-topic records: a checkpoint, an ack, a revive-done.
TAG_CK, TAG_ACK, TAG_DONE = "ck", "ack", "done"

CkKey = tuple[str, str, int, int, int]  # group, stored topic, queue id, start offset, pop time


@dataclass(slots=True)
class Checkpoint:
    """One open CK: the popped ``offsets`` of one queue, invisible until ``deadline_ms``."""

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
class OrderFlight:
    """The in-flight batch of an order-popped queue and each offset's delivery attempt."""

    pop_time_ms: int
    deadline_ms: int
    offsets: list[int]
    acked: set[int] = field(default_factory=set)
    attempts: dict[int, int] = field(default_factory=dict)


class PopCheckpoints:
    """Open and recently closed checkpoints, their revive-topic records, and the source-queue reads
    every pop mode shares. Holds the state of every pop layer."""

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
        self._cks: dict[CkKey, Checkpoint] = {}
        # Recently closed checkpoints: key -> ("acked" | "revived", offsets superseded by change-invisible).
        self._closed: OrderedDict[CkKey, tuple[str, frozenset[int]]] = OrderedDict()
        self._open_by_rq: list[dict[CkKey, int]] = [{} for _ in range(revive_queues)]
        self._revive_end = [0] * revive_queues  # one past the last revive record seen per queue
        self._committed_marks: list[int | None] = [None] * revive_queues
        self._heap: list[tuple[int, CkKey]] = []
        self._orders: dict[tuple[str, str, int], OrderFlight] = {}
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

        def apply(records: Sequence[StoredMessage], end: int) -> None:
            for record in records:
                self._apply(record)
            self._revive_end[rq] = max(self._revive_end[rq], end)

        await read_to_end(self._backend, REVIVE_TOPIC, rq, offset, _REPLAY_BATCH, apply)

    def _apply(self, record: StoredMessage) -> None:
        """Replay one revive record (records that do not parse are skipped: they were never ours)."""
        try:
            data = orjson.loads(record.body)
            key: CkKey = (data["g"], data["t"], int(data["q"]), int(data["so"]), int(data["pt"]))
            if record.tags == TAG_CK:
                invisible = int(data["it"])
                self._open(
                    Checkpoint(
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
            if record.tags == TAG_ACK:
                raw = data["o"]
                offsets = {int(raw)} if isinstance(raw, int) else set(map(int, raw))
                ck.acked |= offsets
                if data.get("x"):
                    ck.changed |= offsets
                if ck.acked >= ck.offsets:
                    self._close(ck, "acked")
            elif record.tags == TAG_DONE:
                self._close(ck, "revived")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError):
            return

    def _open(self, ck: Checkpoint) -> None:
        self._cks[ck.key] = ck
        self._open_by_rq[ck.revive_qid][ck.key] = ck.record_offset
        heapq.heappush(self._heap, (ck.deadline_ms, ck.key))
        if self._heap[0][1] == ck.key:
            self._wake.set()

    def _key_used(self, key: CkKey) -> bool:
        """True if a checkpoint with ``key`` is open or recently closed (keys name one CK for good)."""
        return key in self._cks or key in self._closed

    def _close(self, ck: Checkpoint, why: str) -> None:
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

    # --- checkpoint records ----------------------------------------------------------------------
    def _next_rq(self) -> int:
        self._counter += 1
        return self._counter % self.revive_queues

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
    ) -> Checkpoint:
        offsets = [m.queue_offset for m in messages]
        body = {"g": group, "t": topic, "q": qid, "so": start, "pt": pop_time, "it": invisible_ms}
        body |= {"rf": flag, "o": offsets}
        sent = await self._record(rq, TAG_CK, body)
        ck = Checkpoint(
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

    def _find(self, group: str, topic: str, receipt: Receipt) -> Checkpoint | None:
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

    # --- source queues ---------------------------------------------------------------------------
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

    async def _rest(self, group: str, topic: str, qid: int) -> int:
        committed = await self._backend.query_consumer_offset(group, topic, qid)
        high = await self._backend.max_offset(topic, qid)
        if committed is None:
            committed = await self._backend.min_offset(topic, qid)
        return max(0, high - committed)

    async def _check_range(self, topic: str, queue_id: int, offset: int) -> None:
        low = await self._backend.min_offset(topic, queue_id)  # raises TopicNotFound / QueueNotFound
        high = await self._backend.max_offset(topic, queue_id)
        if not low <= offset < high:
            raise OffsetOutOfRange(f"offset {offset} outside [{low}, {high}) of {topic}:{queue_id}")
