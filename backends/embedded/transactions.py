"""Transactional messages: half messages, END_TRANSACTION, check-back and discard (spec §7.1).

* :meth:`TransactionService.prepare` stores the message in :data:`HALF_TOPIC` queue 0 (invisible to
  consumers) with ``REAL_TOPIC``, ``REAL_QID``, ``__transactionId__`` (= ``UNIQ_KEY``) and its prepare
  time, transaction sysFlag bits cleared.
* :meth:`TransactionService.end` with COMMIT re-sends it to its real topic/queue (``REAL_*`` removed,
  ``TRAN_MSG=true`` kept as the Java broker keeps it, sysFlag COMMIT, delay rules apply) and writes an
  op record; ROLLBACK writes only
  the op record; UNKNOWN does nothing.
* Unresolved half messages are checked ``timeout_s`` after prepare (or, when the message sets
  ``CHECK_IMMUNITY_TIME_IN_SECONDS``, that long after it, shorter or longer than the timeout, as
  in the Java broker), then every ``check_interval_s``, through the ``check_back``
  callback the protocol layer provides; after ``check_max`` checks the message is copied to
  :data:`CHECK_MAX_TOPIC`, resolved, and ``txn.discarded`` is logged.

Durability: op records in :data:`OP_HALF_TOPIC` queue 0 (tag ``d`` = resolved, body the half queue
offset; tag ``c`` = checked, body ``"<offset> <check time ms>"``). Progress is the consumer offset of
:data:`TRANSACTION_GROUP` on both topics (the lowest unresolved half offset; the first op record that
still matters); a restart replays both topics from there, so check counts and resolutions survive.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass

import structlog
import trio

from mqproxy.backends.embedded import internal_topics
from mqproxy.backends.embedded.schedule import Scheduler
from mqproxy.backends.embedded.store import MessageStore
from mqproxy.facade.types import CheckBack, Resolution, TransactionCheck
from mqproxy.model.errors import (
    BackendError,
    InvalidArgument,
    TransactionAlreadyResolved,
    TransactionCheckWindowClosed,
    TransactionGroupMismatch,
    TransactionNotFound,
)
from mqproxy.model.properties import (
    CHECK_MAX_TOPIC,
    HALF_TOPIC,
    OP_HALF_TOPIC,
    PROPERTY_CHECK_IMMUNITY_TIME,
    PROPERTY_HALF_TIME_MS,
    PROPERTY_PREPARED_QUEUE_OFFSET,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
    TRANSACTION_GROUP,
)
from mqproxy.model.topics import validate_send_topic
from mqproxy.model.types import (
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    Message,
    SendResult,
    StoredMessage,
)

#: Op-record tags.
OP_DONE = "d"
OP_CHECKED = "c"
DEFAULT_TIMEOUT_S = 6.0
DEFAULT_CHECK_INTERVAL_S = 30.0
DEFAULT_CHECK_MAX = 15
_PULL_BATCH = 256

_log = structlog.get_logger("mqproxy.transactions")


@dataclass(slots=True)
class _Half:
    commitlog_offset: int
    producer_group: str
    transaction_id: str
    prepared_ms: int
    first_check_ms: int
    checks: int = 0
    next_check_ms: int = 0
    #: An END_TRANSACTION is storing its outcome: a concurrent one (a check-back's answer racing the
    #: producer's own) is refused instead of committing the message twice.
    ending: bool = False


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


class TransactionService:
    def __init__(
        self,
        backend: MessageStore,
        scheduler: Scheduler,
        *,
        check_back: CheckBack | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
        check_max: int = DEFAULT_CHECK_MAX,
        now_ms: internal_topics.Clock = internal_topics.wall_clock_ms,
    ) -> None:
        if check_max < 0 or not timeout_s >= 0 or not check_interval_s > 0:
            raise ValueError("check_max >= 0, timeout_s >= 0 and check_interval_s > 0 are required")
        self._backend = backend
        self._scheduler = scheduler
        self.check_back = check_back
        self._timeout_ms = int(timeout_s * 1000)
        self._interval_ms = int(check_interval_s * 1000)
        self.check_max = check_max
        self._now_ms = now_ms
        self._pending: dict[int, _Half] = {}  # half queue offset -> state
        self._by_id: dict[str, int] = {}  # transaction id / UNIQ_KEY -> half queue offset
        self._op_first: dict[int, int] = {}  # half queue offset -> first op record offset about it
        self._half_end = 0  # next half queue offset to replay
        self._op_end = 0
        self._heap: list[tuple[int, int]] = []  # (next check ms, half offset), lazily invalidated
        self._wake = trio.Event()
        self._started = False
        self._committed_marks: tuple[int, int] | None = None

    # --- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Create the topics and replay unresolved half messages and op records (idempotent)."""
        if self._started:
            return
        await internal_topics.ensure_topic(self._backend, HALF_TOPIC, 1)
        await internal_topics.ensure_topic(self._backend, OP_HALF_TOPIC, 1)
        self._half_end = await self._committed(HALF_TOPIC)
        self._op_end = await self._committed(OP_HALF_TOPIC)
        await self._replay_halves()
        await self._replay_ops()
        for offset, half in self._pending.items():
            heapq.heappush(self._heap, (half.next_check_ms, offset))
        self._started = True

    async def _committed(self, topic: str) -> int:
        offset = await self._backend.query_consumer_offset(TRANSACTION_GROUP, topic, 0)
        return await self._backend.min_offset(topic, 0) if offset is None else offset

    async def _replay(self, topic: str, start: int) -> list[StoredMessage]:
        out: list[StoredMessage] = []
        await internal_topics.read_to_end(
            self._backend, topic, 0, start, _PULL_BATCH, lambda batch, _: out.extend(batch)
        )
        return out

    async def _replay_halves(self) -> None:
        for half in await self._replay(HALF_TOPIC, self._half_end):
            self._track(half)
            self._half_end = half.queue_offset + 1

    async def _replay_ops(self) -> None:
        for op in await self._replay(OP_HALF_TOPIC, self._op_end):
            self._op_end = op.queue_offset + 1
            fields = op.body.decode(errors="replace").split()
            if not fields or not fields[0].isdigit():
                continue
            target = int(fields[0])
            self._op_first.setdefault(target, op.queue_offset)
            half = self._pending.get(target)
            if half is None:
                continue
            if op.tags == OP_DONE:
                self._forget(target)
            elif op.tags == OP_CHECKED:
                half.checks += 1
                last = _int(fields[1] if len(fields) > 1 else None, self._now_ms())
                half.next_check_ms = last + self._interval_ms

    def _track(self, half: StoredMessage) -> _Half:
        props = half.properties
        prepared = _int(props.get(PROPERTY_HALF_TIME_MS), half.store_timestamp_ms)
        # CHECK_IMMUNITY_TIME_IN_SECONDS replaces the transaction timeout, shorter or longer (as in the
        # Java broker's check loop); absent or not a number: the timeout
        immunity_s = _int(props.get(PROPERTY_CHECK_IMMUNITY_TIME), -1)
        first = prepared + (immunity_s * 1000 if immunity_s >= 0 else self._timeout_ms)
        state = _Half(
            commitlog_offset=half.commitlog_offset,
            producer_group=props.get(PROPERTY_PRODUCER_GROUP, ""),
            transaction_id=props.get(PROPERTY_TRANSACTION_ID) or props.get(PROPERTY_UNIQ_KEY, ""),
            prepared_ms=prepared,
            first_check_ms=first,
            next_check_ms=first,
        )
        self._pending[half.queue_offset] = state
        if state.transaction_id:
            self._by_id[state.transaction_id] = half.queue_offset
        return state

    def _forget(self, half_offset: int) -> None:
        state = self._pending.pop(half_offset, None)
        if state is not None and self._by_id.get(state.transaction_id) == half_offset:
            del self._by_id[state.transaction_id]

    @property
    def unresolved(self) -> int:
        return len(self._pending)

    # --- produce -------------------------------------------------------------------------------
    async def prepare(self, message: Message) -> SendResult:
        """Store ``message`` as a half message; the result's offsets address it in END_TRANSACTION."""
        await self.start()
        props = dict(message.properties)
        if not props.get(PROPERTY_PRODUCER_GROUP):
            raise InvalidArgument("a transactional message needs the PGROUP property")
        validate_send_topic(message.topic)
        props[PROPERTY_REAL_TOPIC] = message.topic
        props[PROPERTY_REAL_QID] = str(message.queue_id)
        props[PROPERTY_TRANSACTION_PREPARED] = "true"  # also when only the sysFlag said PREPARED
        uniq = props.get(PROPERTY_UNIQ_KEY)
        if uniq:
            props.setdefault(PROPERTY_TRANSACTION_ID, uniq)
        props[PROPERTY_HALF_TIME_MS] = str(self._now_ms())
        half = dataclasses.replace(
            message,
            topic=HALF_TOPIC,
            queue_id=0,
            properties=props,
            sys_flag=message.sys_flag & ~SYSFLAG_TRANSACTION_MASK,
            dispatch=(),
        )
        result = await self._backend.send(half)
        stored = await self._backend.get_message(result.commitlog_offset)
        if stored is not None:
            state = self._track(stored)
            self._half_end = max(self._half_end, result.queue_offset + 1)
            self._schedule(result.queue_offset, state.next_check_ms)
        return result

    async def end(
        self,
        *,
        resolution: Resolution,
        producer_group: str | None,
        commitlog_offset: int | None = None,
        transaction_id: str | None = None,
        from_check: bool = False,
    ) -> SendResult | None:
        """Resolve a half message found by ``commitlog_offset`` (remoting) or ``transaction_id`` (gRPC).

        Returns the committed message's send result (None for ROLLBACK/UNKNOWN). ``producer_group``
        None skips the PGROUP check (gRPC EndTransaction carries no group).
        """
        if resolution is Resolution.UNKNOWN:
            return None
        await self.start()
        half = await self._find(commitlog_offset, transaction_id)
        state = self._pending.get(half.queue_offset)
        if state is not None and state.commitlog_offset != half.commitlog_offset:
            # retention may have moved the half record since either offset was taken: same record?
            known = await self._backend.get_message(state.commitlog_offset)
            if known is not None and known.commitlog_offset == half.commitlog_offset:
                state.commitlog_offset = half.commitlog_offset
        if state is None or state.commitlog_offset != half.commitlog_offset or state.ending:
            raise TransactionAlreadyResolved(f"half message {half.queue_offset} is already resolved")
        if producer_group is not None and half.properties.get(PROPERTY_PRODUCER_GROUP) != producer_group:
            raise TransactionGroupMismatch("the producer group wrong")
        immunity_s = _int(half.properties.get(PROPERTY_CHECK_IMMUNITY_TIME), 0)
        if not from_check and immunity_s > 0 and self._now_ms() - state.prepared_ms > immunity_s * 1000:
            raise TransactionCheckWindowClosed("the transaction check immunity window has passed")
        state.ending = True
        try:
            result = None
            if resolution is Resolution.COMMIT:
                result = await self._scheduler.send(self._committed_message(half))
            await self._op(half.queue_offset, OP_DONE, str(half.queue_offset))
        except BaseException:
            state.ending = False  # nothing was resolved (or the op record is missing): check it again
            raise
        self._forget(half.queue_offset)
        self._wake.set()  # lets the checker commit the new replay start
        return result

    async def _find(self, commitlog_offset: int | None, transaction_id: str | None) -> StoredMessage:
        if commitlog_offset is None:
            found = self._by_id.get(transaction_id or "")
            if found is None:
                raise TransactionNotFound(f"no unresolved transaction {transaction_id!r}")
            commitlog_offset = self._pending[found].commitlog_offset
        if commitlog_offset < 0:
            raise TransactionNotFound(f"bad commit-log offset {commitlog_offset}")
        try:
            half = await self._backend.get_message(commitlog_offset)
        except BackendError:
            half = None
        if half is None or half.topic != HALF_TOPIC:
            raise TransactionNotFound(f"no half message at commit-log offset {commitlog_offset}")
        return half

    def _committed_message(self, half: StoredMessage) -> Message:
        props = dict(half.properties)
        topic = props.pop(PROPERTY_REAL_TOPIC, "")
        queue_id = _int(props.pop(PROPERTY_REAL_QID, None), -1)
        # TRAN_MSG stays, as the Java broker keeps it: consumers read it to take the transaction id from
        # UNIQ_KEY, and gRPC delivers the message as TRANSACTION
        for key in (PROPERTY_HALF_TIME_MS, PROPERTY_TRANSACTION_CHECK_TIMES):
            props.pop(key, None)
        props[PROPERTY_PREPARED_QUEUE_OFFSET] = str(half.queue_offset)
        sys_flag = (half.sys_flag & ~SYSFLAG_TRANSACTION_MASK) | SYSFLAG_TRANSACTION_COMMIT
        return internal_topics.copy_message(
            half, topic=topic, queue_id=queue_id, properties=props, sys_flag=sys_flag
        )

    async def _op(self, half_offset: int, tag: str, body: str) -> None:
        result = await self._backend.send(
            Message(topic=OP_HALF_TOPIC, body=body.encode(), queue_id=0, properties={PROPERTY_TAGS: tag})
        )
        self._op_first.setdefault(half_offset, result.queue_offset)
        self._op_end = max(self._op_end, result.queue_offset + 1)

    # --- check-back ----------------------------------------------------------------------------
    def _schedule(self, half_offset: int, at_ms: int) -> None:
        heapq.heappush(self._heap, (at_ms, half_offset))
        if self._heap[0] == (at_ms, half_offset):
            self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Check and discard unresolved half messages until cancelled."""
        await self.start()
        task_status.started()
        while True:
            await self._check_due()
            await self._commit_progress()
            next_at = self._heap[0][0] if self._heap else None
            self._wake = trio.Event()
            delay = math.inf if next_at is None else max(0, next_at - self._now_ms()) / 1000
            delay = min(delay, internal_topics.MAX_TIMER_SLEEP_S)
            with trio.move_on_after(delay):
                await self._wake.wait()

    async def _check_due(self) -> None:
        now = self._now_ms()
        while self._heap and self._heap[0][0] <= now:
            at, offset = heapq.heappop(self._heap)
            state = self._pending.get(offset)
            if state is None or state.next_check_ms != at:
                continue  # resolved or re-scheduled
            if state.ending:  # being resolved right now: look again later
                state.next_check_ms = now + self._interval_ms
                heapq.heappush(self._heap, (state.next_check_ms, offset))
                continue
            half = await self._backend.get_message(state.commitlog_offset)
            if half is None:
                self._forget(offset)
                continue
            if state.checks >= self.check_max:
                await self._discard(half, state)
                continue
            state.checks += 1
            state.next_check_ms = now + self._interval_ms
            await self._op(offset, OP_CHECKED, f"{offset} {now}")
            heapq.heappush(self._heap, (state.next_check_ms, offset))
            await self._send_check(half, state)

    async def _send_check(self, half: StoredMessage, state: _Half) -> None:
        if self.check_back is None:
            return
        props = dict(half.properties)
        props.pop(PROPERTY_HALF_TIME_MS, None)  # the service's own bookkeeping: not the producer's business
        props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(state.checks)
        view = dataclasses.replace(
            half,
            topic=props.get(PROPERTY_REAL_TOPIC, half.topic),
            queue_id=_int(props.get(PROPERTY_REAL_QID), 0),
            properties=props,
        )
        check = TransactionCheck(state.producer_group, state.transaction_id, state.checks, half, view)
        try:
            await self.check_back(check)
        except Exception as exc:  # a broken callback must not stop the checker
            _log.error("internal.error", exception=f"transaction check-back failed: {exc!r}")

    async def _discard(self, half: StoredMessage, state: _Half) -> None:
        await internal_topics.ensure_topic(self._backend, CHECK_MAX_TOPIC, 1)
        await self._backend.send(internal_topics.copy_message(half, topic=CHECK_MAX_TOPIC, queue_id=0))
        await self._op(half.queue_offset, OP_DONE, str(half.queue_offset))
        self._forget(half.queue_offset)
        _log.warning(
            "txn.discarded",
            group=state.producer_group,
            topic=half.properties.get(PROPERTY_REAL_TOPIC),
            reason="check_max_exceeded",
            detail=f"transaction {state.transaction_id} unresolved after {state.checks} checks",
        )

    async def _commit_progress(self) -> None:
        """Commit the replay start points: lowest unresolved half, first op record still needed."""
        half_mark = min(self._pending, default=self._half_end)
        for offset in [o for o in self._op_first if o < half_mark]:
            del self._op_first[offset]
        op_mark = min(self._op_first.values(), default=self._op_end)
        if (half_mark, op_mark) == self._committed_marks:
            return
        await self._backend.commit_consumer_offset(TRANSACTION_GROUP, HALF_TOPIC, 0, half_mark)
        await self._backend.commit_consumer_offset(TRANSACTION_GROUP, OP_HALF_TOPIC, 0, op_mark)
        self._committed_marks = (half_mark, op_mark)
